"""The `Communicator` protocol: what lbtrain needs from a process group, whatever the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["RESTART_EXIT", "Communicator", "Completed", "RankLost", "Request"]

# The exit status that says "restart me": a rank was lost, not a mistake made, so the same
# command (with resume=auto) continues from the run's newest checkpoint. EX_TEMPFAIL.
RESTART_EXIT = 75


class Request(Protocol):
    """A collective in flight: its buffer may be read only once it has completed."""

    def test(self) -> bool:
        """Drive progress; True once the collective has completed."""

    def wait(self) -> None:
        """Block until the collective has completed."""


class RankLost(Exception):
    """A collective failed because another rank of the job is gone without a word.

    Raised by engines that see a peer vanish (torch.distributed over TCP) rather than being
    ended with it (MPI_Abort). Not a RuntimeError: it is no user error and must not be
    caught as one; the command line prints it as one line and ends the job.
    """


class Completed:
    """The request of a collective that was complete when it started (one rank)."""

    def test(self) -> bool:
        return True

    def wait(self) -> None:
        return None


@runtime_checkable
class Communicator(Protocol):
    """What lbtrain needs from a process group.

    An engine whose transport depends on the ranks' devices may also have
    `use_device(device)` (collective; TorchDistCommunicator: NCCL only where every rank is on
    a GPU); lbtrain.session.setup_replica calls it once each rank has its device.
    """

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def allreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> None:
        """Sum `buffer` over all ranks, in place. CPU or CUDA tensors, or numpy arrays."""

    def iallreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> Request:
        """Start summing `buffer` over all ranks, in place; read it after the request's wait.

        Every rank starts its collectives in the same order. CPU tensors and numpy arrays;
        CUDA tensors only where `cuda_aware` (the caller synchronises the stream first).
        """

    @property
    def cuda_aware(self) -> bool:
        """Whether the engine takes CUDA buffers as they are (CUDA-aware MPI, NCCL)."""

    def broadcast_(self, buffer: torch.Tensor | np.ndarray, root: int = 0) -> None:
        """Overwrite `buffer` on every rank with `root`'s, in place."""

    def allgather(self, obj: Any) -> list[Any]:
        """Gather one small picklable object from each rank, in rank order, on every rank."""

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Return `root`'s object on every rank."""

    def barrier(self) -> None:
        """Wait until every rank gets here."""

    def abort(self, code: int = 1) -> None:
        """Terminate every rank of the job (never returns)."""
