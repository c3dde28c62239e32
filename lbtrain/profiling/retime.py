"""Re-time profiles at the batch sizes a plan will really use, so no share is extrapolated."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from lbtrain.comm import Communicator
from lbtrain.emulation import Slowdown, rank_cpu_time
from lbtrain.profiling.fit import fit_step_time
from lbtrain.profiling.profiler import ProfileConfig
from lbtrain.profiling.record import ReplicaProfile
from lbtrain.profiling.steps import LossFn, MakeBatch, resolve_device, step_sandbox

__all__ = ["add_measurement", "outside_measured", "retime_profiles"]


def outside_measured(profile: ReplicaProfile, batch: int, tolerance: float = 0.25) -> bool:
    """True when `batch` lies beyond the profile's ladder by more than `tolerance`.

    A fitted line is trusted a little past its ends; further out, cache spills or per-call
    overheads the ladder never saw can bend the real curve away from it.

    Args:
        profile: the rank's profile.
        batch: a planned batch size; 0 (an idle rank) is never outside.
        tolerance: relative margin beyond the largest and below the smallest rung.
    """
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance={tolerance!r} must be a finite number >= 0")
    if batch <= 0:
        return False
    margin = 1.0 + tolerance
    return batch > margin * max(profile.batch_sizes) or batch < min(profile.batch_sizes) / margin


def add_measurement(
    profile: ReplicaProfile, batch: int, seconds: float, repeats: int | None = None
) -> ReplicaProfile:
    """The profile with (batch, seconds) in its ladder and its line refitted.

    A batch already in the ladder has its time replaced. The reference batch is kept, so
    the throughput still refers to the batch size every rank shares.

    Args:
        profile: the profile to extend.
        batch: batch size measured (>= 1).
        seconds: median seconds per step at `batch` (> 0).
        repeats: timed steps behind `seconds`; the profile records the fewest any rung got.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch={batch!r} must be a whole number >= 1")
    ladder = dict(zip(profile.batch_sizes, profile.step_times, strict=True))
    ladder[batch] = float(seconds)
    sizes = sorted(ladder)
    times = [ladder[b] for b in sizes]
    fit = fit_step_time(sizes, times)
    return dataclasses.replace(
        profile,
        batch_sizes=tuple(sizes),
        step_times=tuple(times),
        alpha=fit.alpha,
        beta=fit.beta,
        r_squared=fit.r_squared,
        fit_relative_error=fit.relative_error,
        repeats=profile.repeats if repeats is None else min(profile.repeats, repeats),
    )


def retime_profiles(
    comm: Communicator,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    make_batch: MakeBatch,
    profiles: Sequence[ReplicaProfile],
    batch_sizes: Sequence[int | None],
    *,
    device: torch.device | str | None = None,
    slowdown: Slowdown | None = None,
    config: ProfileConfig | None = None,
    timer: Callable[[], float] = time.perf_counter,
    cpu_timer: Callable[[], float] | None = rank_cpu_time,
    sync_batchnorm: bool = True,
) -> list[ReplicaProfile]:
    """Time each rank at its own batch size, add the point to its profile, refit; collective.

    Every rank must call it with the same profiles and batch sizes. A rank with a batch
    times `config.repeats` steps there (after one untimed step), as `profile_replica` times
    a rung; the model, optimizer and RNG are left exactly as found. A batch above the
    profile's memory cap is timed at the cap instead, since no plan gives the rank more.

    Args:
        comm: the job's communicator.
        model, optimizer, loss_fn, make_batch: as for `profile_replica`.
        profiles: the job's profiles, in rank order.
        batch_sizes: per rank, the batch to time, or None / 0 for none.
        device: this rank's device; default the model's.
        slowdown: this rank's emulated slowdown, as in profiling and training.
        config: repeats and seed; default ProfileConfig().
        timer: clock in seconds; injectable for tests.
        cpu_timer: CPU seconds of this rank (`rank_cpu_time`), for the slowdown on CPU devices.
        sync_batchnorm: training synchronises BatchNorm: on several ranks, time its layers as
            they will compute (as `profile_all` does).

    Returns:
        The updated profiles, the same on every rank, in rank order.
    """
    _check_ranks(comm.size, profiles, batch_sizes)
    config = config or ProfileConfig()
    profile = profiles[comm.rank]
    batch = int(batch_sizes[comm.rank] or 0)
    if profile.cap is not None:
        batch = min(batch, profile.cap)
    if batch > 0:
        device = resolve_device(model, device)
        with step_sandbox(
            model, optimizer, loss_fn, make_batch, device=device, seed=config.seed,
            slowdown=slowdown, timer=timer, cpu_timer=cpu_timer,
            sync_batchnorm=sync_batchnorm and comm.size > 1,
        ) as steps:  # fmt: skip
            seconds = steps.median_time(batch, config.repeats)
        profile = add_measurement(profile, batch, seconds, config.repeats)
    return [ReplicaProfile.from_dict(entry) for entry in comm.allgather(profile.to_dict())]


def _check_ranks(
    size: int, profiles: Sequence[ReplicaProfile], batch_sizes: Sequence[int | None]
) -> None:
    if len(profiles) != size or len(batch_sizes) != size:
        raise ValueError(
            f"need one profile and one batch size per rank ({size}), got "
            f"{len(profiles)} and {len(batch_sizes)}"
        )
    if [p.rank for p in profiles] != list(range(size)):
        raise ValueError(f"profiles must be in rank order, got ranks {[p.rank for p in profiles]}")
