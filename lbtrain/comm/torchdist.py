"""torch.distributed (torchrun): the only module in lbtrain that communicates through it.

The default process group is gloo, always: small objects and CPU buffers (the per-step
control allreduce, evaluation sums, profiles) go through it on every job, since NCCL carries
CUDA memory only and would place object collectives on a GPU before the ranks have chosen
theirs. CUDA buffers get NCCL when every rank is on a GPU; in a CPU+GPU mix they go through
gloo. The choice is made once the devices are known (`use_device`), and agreed by all ranks,
so no collective ever has ranks on two transports.

A CUDA rank beside CPU ranks (gloo) has run on real GPUs (BENCHMARKS.md); NCCL, with every
rank on a GPU, has not: CPU stand-ins cover the staged path, nothing covers NCCL itself.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lbtrain.comm.base import RESTART_EXIT, RankLost, Request
from lbtrain.comm.launchers import BACKENDS, check_backend, torchrun_world

__all__ = ["BACKENDS", "TorchDistCommunicator", "check_backend", "choose_backend", "torch_world"]

# The store key `abort` leaves: "<status>:<rank>". The other ranks' collectives fail as the
# aborting process's connections close; finding the key, they end quietly with its status.
_ABORT_KEY = "abort"

# What the errors of a collective whose peer is gone say (gloo: "Connection reset by peer",
# "Connection closed by peer", a timeout); other RuntimeErrors are real errors, raised as is.
_LOST_WORDS = ("connection", "closed by peer", "reset by peer", "broken pipe", "timed out")


def choose_backend(requested: str, devices: Sequence[str], nccl_available: bool = True) -> str:
    """The transport of CUDA buffers ("gloo" or "nccl") for ranks on `devices`, in rank order.

    "auto" takes NCCL where every rank is on a GPU and torch has NCCL, else gloo; "nccl"
    insists, so a CPU rank is an error that names it.

    Raises:
        ValueError: backend="nccl" with a rank off the GPU, or a torch without NCCL.
    """
    check_backend(requested)
    off_gpu = [(r, device) for r, device in enumerate(devices) if device.split(":")[0] != "cuda"]
    if requested == "nccl":
        if off_gpu:
            rank, device = off_gpu[0]
            raise ValueError(
                f"backend='nccl' needs a CUDA device on every rank, but rank {rank} is on "
                f"{device}; use backend='gloo' or backend='auto' (gloo for a CPU+GPU mix), or "
                "put every rank on a GPU"
            )
        if not nccl_available:
            raise ValueError(
                f"backend='nccl' but this torch ({torch.__version__}) was built without NCCL; "
                "use backend='gloo' or backend='auto', or install a CUDA build of torch"
            )
        return "nccl"
    return "nccl" if requested == "auto" and not off_gpu and nccl_available else "gloo"


class TorchDistCommunicator:
    """A Communicator over torch.distributed's default process group (every rank).

    CUDA buffers under gloo are copied through a pinned host buffer for the blocking calls,
    as MPICommunicator does, and `cuda_aware` is False, so GradientSync stages its buckets
    itself: one staged path for both engines, tested on CPU stand-ins, whose downloads
    overlap backward on a side stream. (gloo could take CUDA tensors itself, but would copy
    them on its own schedule, and no machine here can check that path.)

    Args:
        backend: "auto", "gloo" or "nccl" (module docstring).
        store: the rendezvous store. With it, `abort` leaves its status there, so the ranks
            whose collectives fail as this one ends leave quietly with that status; and when
            a rank vanishes without a word (killed), exactly one other rank reports it.

    Raises:
        RuntimeError: torch.distributed is not initialised.
    """

    def __init__(self, backend: str = "auto", store: dist.Store | None = None) -> None:
        self.backend = check_backend(backend)
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised: call torch.distributed."
                "init_process_group() first, or use lbtrain.world_communicator() under torchrun"
            )
        self._store = store
        self._rank, self._size = dist.get_rank(), dist.get_world_size()
        world = dist.get_backend()
        self._cpu = dist.group.WORLD if world == "gloo" else dist.new_group(backend="gloo")
        self._cuda: Any = None  # the NCCL group, once chosen
        self._transport: str | None = None
        self._staging: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self.owns_groups = False  # torch_world sets it when it initialised torch.distributed

    def close(self) -> None:
        """Destroy the process groups `torch_world` made; call on every rank once all are
        past their last collective (the command line does, on its way out).

        Left to interpreter exit, gloo's threads can abort the process ("terminate called
        without an active exception"); groups the caller initialised are the caller's.
        """
        if self.owns_groups and dist.is_initialized():
            dist.destroy_process_group()
            # This object's references would keep the groups, and gloo's threads, alive
            # until the interpreter tears itself down, where one of those threads can still
            # abort the process (about 1 finished torchrun job in 50 here): free them now,
            # while the interpreter is whole.
            self._cpu = self._cuda = None
            self._staging.clear()
            gc.collect()
        self.owns_groups = False

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._size

    @property
    def transport(self) -> str | None:
        """How CUDA buffers travel, "gloo" or "nccl"; None until chosen."""
        return self._transport

    @property
    def cuda_aware(self) -> bool:
        """Whether CUDA buffers go to the engine as they are (NCCL), not through the host."""
        return self._transport == "nccl"

    thread_safe = True  # gradient hooks may start collectives from autograd's threads

    def use_device(self, device: torch.device | str) -> str:
        """Choose the transport of CUDA buffers from every rank's device; collective.

        Called by lbtrain.session.setup_replica once each rank has its device; without it,
        the first tensor collective's buffer stands for the rank's device.

        Returns:
            "gloo" or "nccl".

        Raises:
            ValueError: on every rank alike, when backend="nccl" cannot run on the devices.
        """
        facts = self.allgather((str(torch.device(device)), dist.is_nccl_available()))
        transport = choose_backend(
            self.backend, [d for d, _ in facts], all(nccl for _, nccl in facts)
        )
        if transport == "nccl" and self._cuda is None:
            world = dist.get_backend()
            self._cuda = dist.group.WORLD if world == "nccl" else dist.new_group(backend="nccl")
        self._transport = transport
        return transport

    def allreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> None:
        """Sum `buffer` over all ranks, in place."""
        tensor = self._tensor(buffer, "allreduce_sum_")
        group = self._group(tensor)
        if group is not None:
            with self._guard():
                dist.all_reduce(tensor, group=group)
            return
        host = self._host_buffer(tensor)
        host.copy_(tensor.view(-1))
        with self._guard():
            dist.all_reduce(host, group=self._cpu)
        tensor.view(-1).copy_(host)

    def iallreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> Request:
        """Start summing `buffer` over all ranks, in place (async_op=True)."""
        tensor = self._tensor(buffer, "iallreduce_sum_")
        group = self._group(tensor)
        if group is None:
            raise ValueError(
                f"iallreduce_sum_ got a {tensor.device} tensor but CUDA buffers travel through "
                "gloo in this job; stage it through a host buffer (GradientSync does)"
            )
        with self._guard():
            work = dist.all_reduce(tensor, group=group, async_op=True)
        return _TorchRequest(self, work, buffer)

    def broadcast_(self, buffer: torch.Tensor | np.ndarray, root: int = 0) -> None:
        """Overwrite `buffer` with `root`'s, in place (CUDA under gloo through the host)."""
        self._check_root(root)
        tensor = self._tensor(buffer, "broadcast_")
        group = self._group(tensor)
        if group is not None:
            with self._guard():
                dist.broadcast(tensor, src=root, group=group)
            return
        host = self._host_buffer(tensor)
        host.copy_(tensor.view(-1))
        with self._guard():
            dist.broadcast(host, src=root, group=self._cpu)
        tensor.view(-1).copy_(host)

    def allgather(self, obj: Any) -> list[Any]:
        """Gather one small object per rank, in rank order."""
        gathered: list[Any] = [None] * self._size
        with self._guard():
            dist.all_gather_object(gathered, obj, group=self._cpu)
        return gathered

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Return `root`'s object on every rank."""
        self._check_root(root)
        box = [obj]
        with self._guard():
            dist.broadcast_object_list(box, src=root, group=self._cpu)
        return box[0]

    def barrier(self) -> None:
        """Wait for all ranks."""
        with self._guard():
            dist.barrier(group=self._cpu)

    def abort(self, code: int = 1) -> None:
        """End this process, leaving `code` in the store for the others (never returns).

        torchrun's agent ends the other workers when one exits with an error; before it does,
        their collectives with this rank fail, and they leave quietly with `code`.
        """
        _flush()
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set(_ABORT_KEY, f"{code}:{self._rank}")
        os._exit(code)

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self._size:
            raise ValueError(
                f"Invalid root {root}, root should be in the interval [0, {self._size - 1}]"
            )

    def _tensor(self, buffer: torch.Tensor | np.ndarray, op: str) -> torch.Tensor:
        if isinstance(buffer, np.ndarray):
            if not buffer.flags.c_contiguous:
                raise ValueError("collective buffers must be C-contiguous numpy arrays")
            return torch.from_numpy(buffer)  # shares the array's memory
        if not buffer.is_contiguous():
            raise ValueError(f"{op} needs a contiguous tensor; call .contiguous() first")
        return buffer

    def _group(self, tensor: torch.Tensor) -> Any:
        """The group that takes `tensor` as it is; None for CUDA memory staged through gloo."""
        if self._transport is None:
            # Every rank makes the same tensor collectives in the same order, so they all
            # choose here, at the same call. A CPU buffer (a control array) says little of
            # the rank's device: with NCCL asked for, the current GPU stands for it.
            device = tensor.device
            if device.type == "cpu" and self.backend == "nccl" and torch.cuda.is_available():
                device = torch.device("cuda", torch.cuda.current_device())
            self.use_device(device)
        if tensor.device.type == "cpu":
            return self._cpu
        return self._cuda if self._transport == "nccl" else None

    def _host_buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        key = (tensor.dtype, tensor.numel())
        host = self._staging.get(key)
        if host is None:
            host = torch.empty(tensor.numel(), dtype=tensor.dtype, pin_memory=True)
            self._staging[key] = host
        return host

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn a collective that failed because a peer is gone into a quiet exit or RankLost."""
        try:
            yield
        except RuntimeError as exc:
            if not any(word in str(exc).lower() for word in _LOST_WORDS):
                raise
            self._peer_gone()

    def _peer_gone(self) -> None:
        code = self._claim()
        if code is not None:  # another rank aborted (and said why) or already reported this
            _flush()
            os._exit(code)
        raise RankLost(
            "lost contact with another rank in a collective: it ended without a message "
            "(killed, or crashed outside Python), so the job stops; the launcher's report "
            f"names that rank; exit {RESTART_EXIT}: the same command with resume=auto "
            "continues from the run's newest checkpoint"
        ) from None

    def _claim(self) -> int | None:
        """The status another rank left, or None when this rank is the one to report."""
        if self._store is None:
            return None
        mine = f"{RESTART_EXIT}:{self._rank}"  # the others leave with it
        try:
            found = self._store.compare_set(_ABORT_KEY, "", mine)
        except Exception:
            return None  # the store left with the rank that served it: report
        text = found.decode() if isinstance(found, bytes) else str(found)
        if text == mine:
            return None
        status = text.split(":", 1)[0]
        return int(status) if status.isdigit() else 1


class _TorchRequest:
    """A torch.distributed Work and the buffer it writes into."""

    __slots__ = ("_buffer", "_comm", "_done", "_work")

    def __init__(self, comm: TorchDistCommunicator, work: Any, buffer: Any) -> None:
        self._comm, self._work, self._buffer, self._done = comm, work, buffer, False

    def test(self) -> bool:
        if not self._done and self._work.is_completed():
            self.wait()  # raises here if it failed, rather than leaving garbage in the buffer
        return self._done

    def wait(self) -> None:
        if not self._done:
            with self._comm._guard():
                self._work.wait()
            self._done = True


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def torch_world(backend: str = "auto") -> TorchDistCommunicator | None:
    """The job torchrun started, as a communicator; None for a world of one rank.

    Meets the other ranks through torch's env:// variables (torchrun's agent store when it
    offers one) and initialises the default process group over gloo, unless the caller
    initialised torch.distributed already, in which case that group is used.

    Raises:
        LauncherError: torchrun's variables are incomplete.
        RuntimeError: this torch build has no torch.distributed.
    """
    check_backend(backend)
    if not dist.is_available():
        raise RuntimeError(
            f"launched by torchrun but this torch ({torch.__version__}) has no "
            "torch.distributed; install a build that has it, or launch with mpiexec"
        )
    if dist.is_initialized():
        return TorchDistCommunicator(backend) if dist.get_world_size() > 1 else None
    rank, size = torchrun_world()
    if size == 1:
        return None
    store, rank, size = next(dist.rendezvous("env://", rank=rank, world_size=size))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("default_pg", store), rank=rank, world_size=size
    )
    world = TorchDistCommunicator(backend, store=dist.PrefixStore("lbtrain", store))
    world.owns_groups = True
    return world
