"""N ranks in one process, one thread each: a Communicator for tests of collective logic.

Logic that only needs "several ranks agree" (checks agreed by every rank, zero shares, the
per-step control allreduce, re-plan broadcasts, resume decisions, evaluation shares) runs
here in milliseconds, with no launcher and no second interpreter importing torch. What only
a real MPI job shows (process aborts, signals, Iallreduce progress) stays under mpiexec.

Every collective is a meeting of all ranks at a barrier: each rank leaves its contribution
in its slot, all meet, each reads what it needs, all meet again (so no rank overwrites its
slot for the next collective while another still reads it), and only then does each write
its result. Sums run in rank order, so results are deterministic.

Example:
    >>> def work(comm):
    ...     return comm.allgather(comm.rank)
    >>> [r.value for r in run_ranks(3, work)]
    [[0, 1, 2], [0, 1, 2], [0, 1, 2]]
"""

from __future__ import annotations

import pickle
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lbtrain.comm.base import Completed, Request

__all__ = [
    "LocalCommunicator",
    "LocalWorld",
    "RankAborted",
    "RankResult",
    "current_rank",
    "run_ranks",
]

# How long a rank waits in a collective for the others; past it the world is broken and
# every rank raises, so a test of a hang fails instead of freezing.
DEFAULT_TIMEOUT = 120.0


class RankAborted(BaseException):
    """Raised on every rank of a `LocalWorld` after one rank called `abort(code)`.

    A BaseException, like SystemExit: the job is over, and handlers written for a rank's own
    errors (``except Exception``) must not catch it and report it as theirs.
    """

    def __init__(self, code: int, rank: int) -> None:
        super().__init__(f"rank {rank} aborted the job with status {code}")
        self.code = code
        self.rank = rank


class LocalWorld:
    """The meeting place of `size` ranks that are threads of this process.

    Args:
        size: number of ranks (>= 1).
        timeout: seconds a rank waits in a collective before the world is declared broken.
    """

    def __init__(self, size: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"Invalid size {size!r}, size should be a whole number >= 1")
        self.size = size
        self.timeout = timeout
        self._barrier = threading.Barrier(size)
        self._slots: list[Any] = [None] * size
        self._lock = threading.Lock()
        self.aborted: RankAborted | None = None

    def communicators(self) -> list[LocalCommunicator]:
        """One communicator per rank, in rank order."""
        return [LocalCommunicator(self, rank) for rank in range(self.size)]

    def abort(self, code: int, rank: int) -> RankAborted:
        """Break every collective, now and later, with `RankAborted(code)`; the first wins."""
        with self._lock:
            if self.aborted is None:
                self.aborted = RankAborted(code, rank)
        self._barrier.abort()
        return self.aborted

    def meet(self) -> None:
        """Wait until every rank gets here; raise if the world was aborted or timed out."""
        if self.aborted is not None:
            raise RankAborted(self.aborted.code, self.aborted.rank)
        try:
            self._barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            if self.aborted is not None:
                raise RankAborted(self.aborted.code, self.aborted.rank) from None
            raise RuntimeError(
                f"a collective of the in-process world waited more than {self.timeout:g} s "
                "for the other ranks (a rank stopped calling collectives, or called others, or "
                "two ranks on one CUDA device met inside backward: autograd runs both on one "
                "thread)"
            ) from None

    def exchange(self, rank: int, value: Any, read: Callable[[list[Any]], Any]) -> Any:
        """Collective: leave `value`, meet, `read(all values)`, meet again; read's result."""
        self._slots[rank] = value
        self.meet()
        try:
            result = read(list(self._slots))
        finally:
            self.meet()
        return result


class LocalCommunicator:
    """One rank of a `LocalWorld`; implements `lbtrain.comm.Communicator`.

    Objects travel pickled, as under MPI, so no rank ever holds another rank's object.
    Tensors may live on any device; each rank's result lands on its own buffer's device.
    """

    cuda_aware = True  # nothing leaves the process: any memory will do
    # Collectives block until every rank arrives, so they must come from the rank's own
    # thread: autograd's device threads are shared by every rank of the process.
    thread_safe = False

    def __init__(self, world: LocalWorld, rank: int) -> None:
        if not 0 <= rank < world.size:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {world.size - 1}]"
            )
        self.world = world
        self._rank = rank

    @property
    def rank(self) -> int:
        """This rank's number."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self.world.size

    def allreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> None:
        """Sum `buffer` over all ranks, in place, adding in rank order."""
        _check_contiguous(buffer, "allreduce_sum_")

        def total(buffers: list[Any]) -> Any:
            if isinstance(buffer, np.ndarray):
                return np.sum(np.stack([np.asarray(b) for b in buffers]), axis=0)
            result = buffers[0].to(buffer.device, copy=True)
            for other in buffers[1:]:
                result += other.to(buffer.device)
            return result

        result = self.world.exchange(self.rank, buffer, total)
        _assign(buffer, result)

    def iallreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> Request:
        """The sum, complete when this returns: every rank starts collectives in one order."""
        self.allreduce_sum_(buffer)
        return Completed()

    def broadcast_(self, buffer: torch.Tensor | np.ndarray, root: int = 0) -> None:
        """Overwrite `buffer` with `root`'s, in place."""
        self._check_root(root)
        _check_contiguous(buffer, "broadcast_")

        def copy(buffers: list[Any]) -> Any:
            source = buffers[root]
            if isinstance(buffer, np.ndarray):
                return np.array(source, copy=True)
            return source.to(buffer.device, copy=True)

        _assign(buffer, self.world.exchange(self.rank, buffer, copy))

    def allgather(self, obj: Any) -> list[Any]:
        """One object per rank, in rank order, each a fresh copy."""
        return self.world.exchange(
            self.rank, pickle.dumps(obj), lambda blobs: [pickle.loads(b) for b in blobs]
        )

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """`root`'s object on every rank (a fresh copy)."""
        self._check_root(root)
        blob = pickle.dumps(obj) if self.rank == root else None
        return self.world.exchange(self.rank, blob, lambda blobs: pickle.loads(blobs[root]))

    def barrier(self) -> None:
        """Wait for all ranks."""
        self.world.exchange(self.rank, None, lambda _: None)

    def close(self) -> None:
        """Nothing to release (torch.distributed's communicator destroys its groups here)."""

    def abort(self, code: int = 1) -> None:
        """End every rank's collectives with `RankAborted(code)`; raises it here too."""
        sys.stdout.flush()
        sys.stderr.flush()
        raise self.world.abort(code, self.rank)

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.size:
            raise ValueError(
                f"Invalid root {root}, root should be in the interval [0, {self.size - 1}]"
            )


def _check_contiguous(buffer: torch.Tensor | np.ndarray, name: str) -> None:
    contiguous = (
        buffer.flags.c_contiguous if isinstance(buffer, np.ndarray) else buffer.is_contiguous()
    )
    if not contiguous:
        raise ValueError(f"{name} needs a contiguous buffer; call .contiguous() first")


def _assign(buffer: torch.Tensor | np.ndarray, value: Any) -> None:
    if isinstance(buffer, np.ndarray):
        buffer[...] = value
    else:
        buffer.copy_(value)


@dataclass
class RankResult:
    """How one rank of `run_ranks` ended: its return value, or what it raised."""

    rank: int
    value: Any = None
    error: BaseException | None = None

    @property
    def aborted(self) -> bool:
        """Whether the job was aborted (by this rank or another)."""
        return isinstance(self.error, RankAborted)


# Which rank of `run_ranks` the calling thread is, for code that would read a launcher's
# rank variable (PMI_RANK) in a real job; threads share one environment.
_THREAD = threading.local()


def current_rank() -> int | None:
    """The rank of the calling thread when `run_ranks` runs it, else None."""
    return getattr(_THREAD, "rank", None)


def run_ranks(
    size: int, work: Callable[[LocalCommunicator], Any], timeout: float = DEFAULT_TIMEOUT
) -> list[RankResult]:
    """Run `work(comm)` on `size` ranks, one thread each, and wait for all of them.

    Args:
        size: number of ranks.
        work: what every rank runs; it receives its rank's communicator.
        timeout: seconds a collective may wait, and (times two) the whole run may take.

    Returns:
        One `RankResult` per rank, in rank order. An exception on one rank aborts the
        world, as `python -m mpi4py` aborts a job: the others raise `RankAborted` in their
        next collective instead of waiting for a rank that is gone.

    Raises:
        TimeoutError: when a rank is still running after 2 * timeout seconds; the world is
            aborted first, so no thread keeps waiting in a collective.
    """
    world = LocalWorld(size, timeout)
    results = [RankResult(rank) for rank in range(size)]

    def body(comm: LocalCommunicator) -> None:
        _THREAD.rank = comm.rank
        try:
            results[comm.rank].value = work(comm)
        except BaseException as exc:  # noqa: BLE001 - every outcome is the caller's to judge
            results[comm.rank].error = exc
            if not isinstance(exc, RankAborted):
                # This rank is gone: the others learn it at once rather than at the timeout.
                world.abort(1, comm.rank)

    threads = [
        threading.Thread(target=body, args=(comm,), name=f"rank-{comm.rank}", daemon=True)
        for comm in world.communicators()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * timeout)
    late = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    if late:
        # Where each late rank is, read before the abort moves it.
        frames = sys._current_frames()
        where = "; ".join(f"rank {r} {_where(frames.get(threads[r].ident))}" for r in late)
        world.abort(1, late[0])
        raise TimeoutError(
            f"ranks {late} of the in-process world still ran after {2 * timeout} s ({where})"
        )
    return results


def _where(frame: Any, depth: int = 3) -> str:
    """'at FILE:LINE in FUNCTION, ...' for a thread's innermost `depth` frames (or 'ended')."""
    if frame is None:
        return "ended"
    places = reversed(traceback.extract_stack(frame, limit=depth))  # innermost first
    return "at " + ", ".join(f"{Path(p.filename).name}:{p.lineno} in {p.name}" for p in places)
