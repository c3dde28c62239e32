"""Communicators: one module per engine, behind one `Communicator` protocol.

Library code receives a `Communicator` explicitly and never reaches for COMM_WORLD. World
size 1 uses `SingleProcessCommunicator`, so single-process runs and unit tests need no MPI;
`LocalWorld` runs N ranks as threads of one process, for tests of logic that only needs
"several ranks agree"; `MPICommunicator` (lbtrain/comm/mpi.py) is the only place that
imports mpi4py, `TorchDistCommunicator` (lbtrain/comm/torchdist.py) the only one that
communicates through torch.distributed. `world_communicator()` picks the engine from the
launcher (lbtrain/comm/launchers.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lbtrain.comm.launchers import (
    BACKENDS,
    MPI,
    TORCHRUN,
    LauncherError,
    check_backend,
    detect_launcher,
    launched_by_mpi,
    launched_by_torchrun,
)

if TYPE_CHECKING:
    from lbtrain.comm.base import Communicator

# Exports load lazily: the console script starts MPI (lbtrain.comm.mpi.start_mpi) before
# torch is imported, and the engines' modules import torch.
_EXPORTS = {
    "Communicator": "lbtrain.comm.base",
    "Completed": "lbtrain.comm.base",
    "Request": "lbtrain.comm.base",
    "LocalCommunicator": "lbtrain.comm.local",
    "LocalWorld": "lbtrain.comm.local",
    "RankAborted": "lbtrain.comm.local",
    "RankLost": "lbtrain.comm.base",
    "run_ranks": "lbtrain.comm.local",
    "MPICommunicator": "lbtrain.comm.mpi",
    "mpi_library_info": "lbtrain.comm.mpi",
    "SingleProcessCommunicator": "lbtrain.comm.single",
    "TorchDistCommunicator": "lbtrain.comm.torchdist",
    "torch_world": "lbtrain.comm.torchdist",
}

__all__ = [
    *_EXPORTS,
    "BACKENDS",
    "LauncherError",
    "detect_launcher",
    "launched_by_mpi",
    "launched_by_torchrun",
    "world_communicator",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lbtrain.comm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def world_communicator(backend: str = "auto") -> Communicator:
    """The communicator for the whole job, by its launcher: MPI under mpiexec (or srun),
    torch.distributed under torchrun, else single-process.

    A plain `python` or `lbtrain` start imports neither mpi4py nor torch.distributed's
    process groups, so single-process use works even where the MPI library is missing.

    Args:
        backend: torch.distributed's transport under torchrun: "auto" (NCCL where every rank
            is on a GPU, else gloo), "gloo" or "nccl". MPI jobs refuse anything but "auto";
            a one-process run ignores it.

    Raises:
        LauncherError: the environment names launchers that do not form one job, or
            torchrun's variables without the rendezvous ones.
        ValueError: an unknown backend, or one given to an MPI job.
        RuntimeError: the engine cannot start (mpi4py missing, no torch.distributed).
    """
    check_backend(backend)
    launcher = detect_launcher()
    world: Communicator | None = None
    if launcher == MPI:
        if backend != "auto":
            raise ValueError(
                f"backend={backend!r} picks torch.distributed's transport under torchrun, but "
                "an MPI launcher started this job, which communicates through MPI: use "
                "backend='auto', or launch with torchrun"
            )
        from lbtrain.comm.mpi import mpi_world

        world = mpi_world()
    elif launcher == TORCHRUN:
        from lbtrain.comm.torchdist import torch_world

        world = torch_world(backend)
    if world is not None:
        return world
    from lbtrain.comm.single import SingleProcessCommunicator

    return SingleProcessCommunicator()
