"""Communicators: one module per engine, behind one `Communicator` protocol.

Library code receives a `Communicator` explicitly and never reaches for COMM_WORLD. World
size 1 uses `SingleProcessCommunicator`, so single-process runs and unit tests need no MPI;
`LocalWorld` runs N ranks as threads of one process, for tests of logic that only needs
"several ranks agree"; `MPICommunicator` (lbtrain/comm/mpi.py) is the only place that
imports mpi4py.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

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
    "run_ranks": "lbtrain.comm.local",
    "MPICommunicator": "lbtrain.comm.mpi",
    "mpi_library_info": "lbtrain.comm.mpi",
    "SingleProcessCommunicator": "lbtrain.comm.single",
}

__all__ = [*_EXPORTS, "launched_by_mpi", "world_communicator"]

# Variables that MPICH/Hydra, Open MPI, Intel MPI, Slurm's PMI and PMIx set in every rank.
_LAUNCHER_SIZE_VARIABLES = (
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_SIZE",
    "MPI_LOCALNRANKS",
    "HYDRA_CONTROL_FD",
)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lbtrain.comm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def launched_by_mpi() -> bool:
    """True when an MPI launcher (mpiexec, srun) started this process."""
    return any(name in os.environ for name in _LAUNCHER_SIZE_VARIABLES)


def world_communicator() -> Communicator:
    """The communicator for the whole job: MPI when launched by mpiexec, else single-process.

    A plain `python` or `lbtrain` start does not import mpi4py at all, so single-process use
    works even where the MPI library is missing.
    """
    if launched_by_mpi():
        from lbtrain.comm.mpi import mpi_world

        world = mpi_world()
        if world is not None:
            return world
    from lbtrain.comm.single import SingleProcessCommunicator

    return SingleProcessCommunicator()
