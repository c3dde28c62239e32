"""Time one training step's synchronisation across the job: the communication term."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lbtrain.balancer.network import CommCost
from lbtrain.comm import Communicator
from lbtrain.devices import synchronize
from lbtrain.parallel.buckets import DEFAULT_BUCKET_MB, sync_layout
from lbtrain.profiling.record import ReplicaProfile

__all__ = ["CONTROL_FLOATS", "batchnorm_buffers", "comm_cost", "sync_buffers", "time_sync"]

# The trainer's per-step control allreduce: loss, correct, non-finite, SIGINT, SIGTERM, samples.
CONTROL_FLOATS = 6


def sync_buffers(model: nn.Module, bucket_mb: float = DEFAULT_BUCKET_MB) -> list[torch.Tensor]:
    """Zero flat buffers laid out as `GradientSync` reduces them: one per bucket, in order."""
    return [
        torch.zeros(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
        for bucket in sync_layout(model.parameters(), bucket_mb)
    ]


def batchnorm_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The small float64 buffers synchronised BatchNorm sums each step: two per layer.

    Per BatchNorm layer, the forward's tag slots, count, sums and sums of squares, and the
    backward's tag slots and two per-channel sums (lbtrain/parallel/batchnorm.py).
    """
    buffers = []
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            channels = module.num_features
            held = module.weight if module.weight is not None else module.running_mean
            device = held.device if held is not None else None
            buffers.append(torch.zeros(5 + 2 * channels, dtype=torch.float64, device=device))
            buffers.append(torch.zeros(4 + 2 * channels, dtype=torch.float64, device=device))
    return buffers


def time_sync(
    comm: Communicator,
    model: nn.Module,
    repeats: int = 5,
    timer: Callable[[], float] = time.perf_counter,
    *,
    bucket_mb: float = DEFAULT_BUCKET_MB,
    sync_batchnorm: bool = True,
) -> tuple[float, int]:
    """Seconds one step's sync takes on this job, and the gradient bytes it reduces.

    Collective. Each round is what a training step does after its compute: the small control
    allreduce, then a sum-allreduce of every gradient bucket. One untimed round comes first
    (connections, staging buffers); each timed round starts after a barrier, since the real
    sync starts once the slowest rank is done. Each rank keeps the median of its rounds and
    the job's figure is the largest, so every rank returns the same numbers. On one rank the
    figure is the local cost only (no network). With `sync_batchnorm`, each round also
    makes the two small allreduces per BatchNorm layer that synchronised BatchNorm makes
    during forward and backward, so the plan's communication term counts them; the bytes
    returned stay the gradients'.

    Args:
        comm: the job's communicator.
        model: the model whose trainable parameters' gradients are reduced.
        repeats: timed rounds (>= 1).
        timer: clock in seconds; injectable for tests.
        bucket_mb: bucket size, as passed to `sync_gradients`.
        sync_batchnorm: count synchronised BatchNorm's collectives.

    Returns:
        (seconds, nbytes).
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be a whole number >= 1")
    buffers = sync_buffers(model, bucket_mb)
    nbytes = sum(b.numel() * b.element_size() for b in buffers)
    small = batchnorm_buffers(model) if sync_batchnorm and comm.size > 1 else []
    control = np.zeros(CONTROL_FLOATS)
    devices = sorted({b.device for b in buffers if b.device.type == "cuda"}, key=str)

    def wait_for_devices() -> None:
        for device in devices:
            synchronize(device)

    def one_round() -> float:
        wait_for_devices()
        comm.barrier()
        begin = timer()
        for buffer in small:
            comm.allreduce_sum_(buffer)
        comm.allreduce_sum_(control)
        for buffer in buffers:
            comm.allreduce_sum_(buffer)
        wait_for_devices()
        return timer() - begin

    one_round()
    local = statistics.median([one_round() for _ in range(repeats)])
    return float(max(comm.allgather(local))), nbytes


def comm_cost(profiles: Sequence[ReplicaProfile]) -> CommCost | None:
    """The measured sync cost of a job's profiles, or None where they do not all carry one.

    None also when the profiles disagree on the ranks or bytes measured (files spliced from
    different jobs or models): such a figure would describe no one launch.
    """
    if not profiles or any(
        p.sync_time is None or p.sync_ranks is None or p.sync_bytes is None for p in profiles
    ):
        return None
    if len({p.sync_ranks for p in profiles}) != 1 or len({p.sync_bytes for p in profiles}) != 1:
        return None
    first = profiles[0]
    return CommCost(
        seconds=max(float(p.sync_time) for p in profiles),
        world_size=int(first.sync_ranks),
        nbytes=int(first.sync_bytes),
    )
