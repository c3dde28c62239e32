"""MPI through mpi4py: the only module in lbtrain that imports mpi4py (lazily)."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from lbtrain.comm.base import Request
from lbtrain.comm.launchers import LoneRankError, announced_by, mpi_world_size

if TYPE_CHECKING:
    import torch

    from lbtrain.comm.base import Communicator

__all__ = ["MPICommunicator", "abort_started", "mpi_library_info", "mpi_world", "start_mpi"]


class MPICommunicator:
    """A Communicator over an mpi4py communicator that the caller passes in.

    Buffers travel through mpi4py's buffer interface (no pickling). CUDA tensors are staged
    through a pinned host buffer, so CPU and GPU ranks can share one job whatever the MPI
    library's CUDA support.

    Args:
        comm: an `mpi4py.MPI.Comm`, e.g. `MPI.COMM_WORLD` or a split of it.
    """

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self._staging: dict[tuple[torch.dtype, int], torch.Tensor] = {}

    @property
    def rank(self) -> int:
        """This process's rank in the communicator."""
        return self._comm.Get_rank()

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._comm.Get_size()

    def allreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> None:
        """Sum `buffer` over all ranks, in place."""
        from mpi4py import MPI

        if isinstance(buffer, np.ndarray):
            self._comm.Allreduce(MPI.IN_PLACE, _contiguous(buffer), op=MPI.SUM)
            return
        if not buffer.is_contiguous():
            raise ValueError("allreduce_sum_ needs a contiguous tensor; call .contiguous() first")
        if buffer.device.type == "cpu":
            self._comm.Allreduce(MPI.IN_PLACE, buffer.numpy(), op=MPI.SUM)
            return
        host = self._host_buffer(buffer)
        host.copy_(buffer.view(-1))
        self._comm.Allreduce(MPI.IN_PLACE, host.numpy(), op=MPI.SUM)
        buffer.view(-1).copy_(host, non_blocking=False)

    def iallreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> Request:
        """Start summing `buffer` over all ranks, in place (MPI_Iallreduce)."""
        from mpi4py import MPI

        if isinstance(buffer, np.ndarray):
            array: Any = _contiguous(buffer)
        elif not buffer.is_contiguous():
            raise ValueError("iallreduce_sum_ needs a contiguous tensor; call .contiguous() first")
        elif buffer.device.type == "cpu":
            array = buffer.numpy()
        elif self.cuda_aware:
            array = buffer  # mpi4py takes it through __cuda_array_interface__ / DLPack
        else:
            raise ValueError(
                f"iallreduce_sum_ got a {buffer.device} tensor but this MPI library is not "
                "CUDA-aware; stage it through a host buffer (GradientSync does)"
            )
        # The request keeps the buffer alive: MPI writes into it until the wait.
        return _MPIRequest(self._comm.Iallreduce(MPI.IN_PLACE, array, op=MPI.SUM), buffer)

    @cached_property
    def thread_safe(self) -> bool:
        """Whether MPI may be called from a thread other than the main one (SERIALIZED+).

        Gradient hooks of CUDA parameters run on autograd's device threads.
        """
        from mpi4py import MPI

        return MPI.Query_thread() >= MPI.THREAD_SERIALIZED

    @cached_property
    def cuda_aware(self) -> bool:
        """Whether the MPI library handles CUDA buffers (MPIX_Query_cuda_support).

        `LBTRAIN_CUDA_AWARE=0` or `1` overrides the library's answer, for a library that
        answers wrongly or lacks the query.
        """
        forced = os.environ.get("LBTRAIN_CUDA_AWARE")
        if forced in ("0", "1"):
            return forced == "1"
        return _query_cuda_support()

    def broadcast_(self, buffer: torch.Tensor | np.ndarray, root: int = 0) -> None:
        """Overwrite `buffer` with `root`'s, in place (CUDA tensors through pinned memory)."""
        self.bcast(None, root)  # checks root, and costs one tiny message at start-up only
        if isinstance(buffer, np.ndarray):
            self._comm.Bcast(_contiguous(buffer), root=root)
            return
        if not buffer.is_contiguous():
            raise ValueError("broadcast_ needs a contiguous tensor; call .contiguous() first")
        if buffer.device.type == "cpu":
            self._comm.Bcast(buffer.numpy(), root=root)
            return
        host = self._host_buffer(buffer)
        host.copy_(buffer.view(-1))
        self._comm.Bcast(host.numpy(), root=root)
        buffer.view(-1).copy_(host, non_blocking=False)

    def allgather(self, obj: Any) -> list[Any]:
        """Gather one small object per rank, in rank order."""
        return self._comm.allgather(obj)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Return `root`'s object on every rank."""
        if not 0 <= root < self.size:
            raise ValueError(
                f"Invalid root {root}, root should be in the interval [0, {self.size - 1}]"
            )
        return self._comm.bcast(obj, root=root)

    def barrier(self) -> None:
        """Wait for all ranks."""
        self._comm.Barrier()

    def close(self) -> None:
        """Nothing to release (torch.distributed's communicator destroys its groups here)."""

    def abort(self, code: int = 1) -> None:
        """Abort every rank of the job."""
        sys.stdout.flush()
        sys.stderr.flush()
        self._comm.Abort(code)
        # MPICH's MPI_Abort asks the launcher to end the job and returns at once: this rank
        # must not run on meanwhile (more output, exit handlers, MPI_Finalize).
        os._exit(code)

    def _host_buffer(self, buffer: torch.Tensor) -> torch.Tensor:
        key = (buffer.dtype, buffer.numel())
        host = self._staging.get(key)
        if host is None:
            import torch

            host = torch.empty(buffer.numel(), dtype=buffer.dtype, pin_memory=True)
            self._staging[key] = host
        return host


class _MPIRequest:
    """An mpi4py request and the buffer it writes into."""

    __slots__ = ("_buffer", "_done", "_request")

    def __init__(self, request: Any, buffer: Any) -> None:
        self._request, self._buffer, self._done = request, buffer, False

    def test(self) -> bool:
        if not self._done:
            self._done = bool(self._request.Test())
        return self._done

    def wait(self) -> None:
        if not self._done:
            self._request.Wait()
            self._done = True


def _query_cuda_support() -> bool:
    """MPIX_Query_cuda_support() of the MPI library this process loaded, False without it.

    mpi4py does not wrap the extension (Open MPI and MPICH >= 4 both export it), so it is
    looked up in the loaded libmpi itself.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libmpi" in line})
    except OSError:
        return False
    for path in paths:
        try:
            query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
        except OSError:
            continue
        if query is not None:
            return bool(query())
    return False


def _contiguous(array: np.ndarray) -> np.ndarray:
    if not array.flags.c_contiguous:
        raise ValueError("collective buffers must be C-contiguous numpy arrays")
    return array


def mpi_library_info() -> dict[str, str]:
    """Versions of mpi4py and of the MPI library it runs on, for `lbtrain env` and bug reports.

    Importing mpi4py.MPI initialises MPI (as a singleton outside mpiexec), so this is only
    called on request. A missing or broken mpi4py is reported in the result, not raised.
    """
    try:
        import mpi4py
        from mpi4py import MPI
    except ImportError as exc:
        return {"mpi4py": f"not importable ({exc})"}
    major, minor = MPI.Get_version()
    library = MPI.Get_library_version().strip().splitlines()
    levels = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    forced = os.environ.get("LBTRAIN_CUDA_AWARE")
    return {
        "mpi4py": mpi4py.__version__,
        "MPI library": " ".join(library[0].split()) if library else "unknown",
        "MPI standard": f"{major}.{minor}",
        "MPI thread level": levels.get(MPI.Query_thread(), "unknown"),
        "CUDA-aware MPI": f"{forced == '1'} (LBTRAIN_CUDA_AWARE)"
        if forced in ("0", "1")
        else str(_query_cuda_support()),
    }


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError(
            f"launched by an MPI launcher but mpi4py cannot be imported ({exc}); install it "
            "with `pip install mpi4py mpich`, or build it against your site MPI as the README "
            "explains"
        ) from exc
    return MPI


def start_mpi() -> None:
    """Initialise MPI now (importing mpi4py.MPI does), before anything slow.

    Why the console script calls it first under a launcher: a rank that ends before MPI_Init
    (a Ctrl-C while torch loads) is not seen by MPICH's Hydra as a failed rank, and the
    ranks that were not interrupted then wait in MPI_Init for it forever. Once every rank is
    past MPI_Init, a rank that ends makes the launcher end the others.

    Raises:
        RuntimeError: mpi4py cannot be imported.
    """
    _import_mpi()


def mpi_world() -> Communicator | None:
    """MPI_COMM_WORLD as a communicator, None for a job of one rank.

    Raises:
        LoneRankError: the launcher announced more ranks than MPI sees, so that each process
            would train alone (mpi4py built against another MPI than the launcher's).
    """
    MPI = _import_mpi()
    if MPI.COMM_WORLD.Get_size() == 1:
        announced = mpi_world_size()
        if announced is not None and announced > 1:
            library = MPI.Get_library_version().strip().splitlines()[0]
            raise LoneRankError(
                f"{announced_by()}: the launcher started {announced} ranks, but MPI sees this "
                f"process alone: mpi4py runs on another MPI ({library}) than the launcher's, "
                "and each rank would train by itself; launch with the mpiexec of mpi4py's MPI "
                "(with the mpich wheel, the one in this environment's bin/), or rebuild mpi4py "
                "against the launcher's MPI; for a run of one process, unset that variable"
            )
        return None
    return MPICommunicator(MPI.COMM_WORLD)


def abort_started(code: int, grace: float = 0.0) -> None:
    """MPI_Abort the whole job if MPI is running with more than one rank; else return.

    `grace` seconds pass between flushing this rank's output and the abort: the launcher
    forwards a line the rank just wrote through its own pipes, and an abort that kills the
    job first loses it (on a busy machine, a Ctrl-C's one line was missing from the job's
    output about once in 25).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    if mpi.COMM_WORLD.Get_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        if grace > 0:
            time.sleep(grace)
        mpi.COMM_WORLD.Abort(code)
        os._exit(code)  # as `MPICommunicator.abort`: MPI_Abort may return
