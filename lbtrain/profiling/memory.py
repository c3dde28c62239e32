"""Memory caps: the largest batch a replica can train without running out of memory."""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "CapResult",
    "activation_bytes",
    "available_host_memory",
    "cpu_memory_cap",
    "is_out_of_memory",
    "memory_per_sample",
    "probe_cap",
]

# A training step holds the saved activations plus, during backward, their gradients and
# temporaries; twice the saved bytes is a rough but safe per-sample figure.
ACTIVATION_OVERHEAD = 2.0
# Leave room for the allocator, the data pipeline and everything else on the node.
MEMORY_SAFETY = 0.8


@dataclass(frozen=True)
class CapResult:
    """A memory cap and how it was found.

    Args:
        cap: largest batch that fits, or None when no limit was found.
        source: how it was found.
    """

    cap: int | None
    source: str


def activation_bytes(
    model: nn.Module, loss_fn: Callable, batch: tuple[torch.Tensor, torch.Tensor]
) -> int:
    """Bytes autograd saves for backward in one forward pass on `batch` (no backward run).

    Counting the tensors saved for backward measures activation memory the same way on every
    device, without allocator statistics that CPUs lack.
    """
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    inputs, targets = batch
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = loss_fn(model(inputs), targets)
    del loss
    return total


def memory_per_sample(
    model: nn.Module,
    loss_fn: Callable,
    make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    small: int,
    large: int,
) -> float:
    """Estimated bytes per sample of a training step, from the growth of saved activations.

    Args:
        model: the model, in the mode it trains in.
        loss_fn: loss on (outputs, targets).
        make_batch: returns a batch of the given size on the model's device.
        small, large: two batch sizes; their difference isolates the per-sample part.
    """
    if not 0 < small < large:
        raise ValueError(f"need 0 < small < large, got {small} and {large}")
    first = make_batch(small)
    second = make_batch(large)
    grown = activation_bytes(model, loss_fn, second) - activation_bytes(model, loss_fn, first)
    input_bytes = sum(t[:1].numel() * t.element_size() for t in second)
    return max(grown / (large - small), 0.0) * ACTIVATION_OVERHEAD + input_bytes


def available_host_memory() -> int:
    """Bytes of RAM available to new allocations on this node (MemAvailable on Linux)."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def cpu_memory_cap(
    per_sample: float, available: int, fixed: int = 0, share: float = 1.0
) -> CapResult:
    """Cap a CPU replica's batch by its share of available RAM and the memory per sample.

    Args:
        per_sample: bytes per sample of a training step.
        available: available bytes on the node.
        fixed: bytes the replica needs whatever the batch (parameters, gradients, state).
        share: this rank's share of the node's memory (1 / ranks on the node).
    """
    if per_sample <= 0 or available <= 0:
        return CapResult(None, "cpu-ram-unknown")
    budget = available * share * MEMORY_SAFETY - fixed
    return CapResult(max(1, math.floor(budget / per_sample)), "cpu-ram-estimate")


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an out-of-memory error from torch (CUDA or CPU allocator)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _fits(try_step: Callable[[int], None], size: int, cleanup: Callable[[], None] | None) -> bool:
    """Whether one step at `size` runs without running out of memory."""
    failed = False
    try:
        try_step(size)
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        failed = True
    # Outside the except block: the traceback no longer pins the failed step's tensors.
    if failed:
        gc.collect()
        if cleanup is not None:
            cleanup()
    return not failed


def probe_cap(
    try_step: Callable[[int], None],
    start: int,
    limit: int,
    *,
    time_left: Callable[[], float] | None = None,
    predicted_time: Callable[[int], float] | None = None,
    cleanup: Callable[[], None] | None = None,
) -> CapResult:
    """Find the largest batch for which `try_step` does not run out of memory.

    Doubles from `start` (known to fit) until a step runs out of memory, then bisects to
    about 1/16 of the cap.

    Args:
        try_step: runs one training step on a batch of the given size; raises an
            out-of-memory error when it does not fit.
        start: a batch size known to fit.
        limit: largest batch size worth probing.
        time_left: seconds of budget left; probing stops when a step would not fit in it.
        predicted_time: predicted seconds of a step at a batch size.
        cleanup: frees cached memory after an out-of-memory error.

    Returns:
        The largest size that fitted ("cuda-oom-probe"), None when nothing failed up to
        `limit` ("cuda-no-oom-up-to-<limit>"), or None with source "cuda-probe-out-of-time"
        when the budget ran out before a failure was seen.
    """

    def affordable(size: int) -> bool:
        if time_left is None or predicted_time is None:
            return True
        return predicted_time(size) <= time_left()

    def fits(size: int) -> bool:
        return _fits(try_step, size, cleanup)

    good, bad = start, None
    size = start * 2
    while size <= limit:
        if not affordable(size):
            return CapResult(None, "cuda-probe-out-of-time")
        if not fits(size):
            bad = size
            break
        good = size
        size *= 2
    if bad is None:
        return CapResult(None, f"cuda-no-oom-up-to-{good}")
    while bad - good > max(1, good // 16):
        middle = (good + bad) // 2
        if not affordable(middle):
            break
        if fits(middle):
            good = middle
        else:
            bad = middle
    return CapResult(good, "cuda-oom-probe")
