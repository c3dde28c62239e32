"""Time real training steps of a workload on this replica's device.

The profiler runs forward, backward and the optimizer step on synthetic batches over a ladder
of batch sizes, keeps the median of several repeats at each size, fits t(b) = alpha + beta*b
and finds a memory cap. The model and optimizer are left exactly as they were.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lbtrain.comm import Communicator
from lbtrain.devices import device_name, node_layout
from lbtrain.emulation import Slowdown, rank_cpu_time
from lbtrain.profiling.fit import LinearFit, fit_step_time
from lbtrain.profiling.memory import (
    MEMORY_SAFETY,
    CapResult,
    available_host_memory,
    cpu_memory_cap,
    memory_per_sample,
    probe_cap,
)
from lbtrain.profiling.record import ReplicaProfile, utc_now
from lbtrain.profiling.state import TrainingState
from lbtrain.profiling.steps import LossFn, MakeBatch, StepTimer, resolve_device, step_sandbox
from lbtrain.profiling.sync import time_sync

__all__ = ["ProfileConfig", "TrainingState", "profile_all", "profile_replica"]


MAX_WARMUP = 100  # untimed steps before profiling's first timing


@dataclass(frozen=True)
class ProfileConfig:
    """How long and how carefully to profile.

    Args:
        batch_sizes: explicit ladder of batch sizes; default doubles from min_batch to
            max_batch while the time budget lasts.
        min_batch: first rung of the default ladder. Steps much shorter than a millisecond
            measure timer and Python overhead more than the model, hence 16, not 1.
        max_batch: last rung of the default ladder.
        warmup: untimed steps before the first timing (lazy initialisation, kernel choice);
            each later rung also gets one untimed step.
        repeats: timed steps per batch size wanted; the median is kept. Rungs are only
            added to the ladder while `repeats` rounds of them fit in the budget.
        max_repeats: timed steps per batch size at most. Beyond `repeats`, rounds go on
            while the budget lasts, so fast steps get more samples and steadier medians.
        min_repeats: fewest repeats a rung may be cut to when the budget runs short.
        time_budget: seconds the whole profile should take, about; the first two rungs are
            always measured so that a line can be fitted.
        memory_cap: find a memory cap (OOM probe on CUDA, RAM estimate on CPU).
        probe_limit: largest batch size the CUDA probe tries.
        seed: seed of the synthetic batches (the caller's RNG state is restored afterwards).
        reference_batch: batch size at which the profile's throughput is read off the
            fitted line; default the largest batch measured, which `profile_all` lowers to
            the largest one every rank measured.
    """

    batch_sizes: tuple[int, ...] | None = None
    min_batch: int = 16
    max_batch: int = 1024
    warmup: int = 2
    repeats: int = 5
    max_repeats: int = 50
    min_repeats: int = 3
    time_budget: float = 10.0
    memory_cap: bool = True
    probe_limit: int = 1 << 16
    seed: int = 0
    reference_batch: int | None = None

    def __post_init__(self) -> None:
        if self.batch_sizes is not None:
            sizes = tuple(self.batch_sizes)
            if not sizes or any(isinstance(b, bool) or not isinstance(b, int) for b in sizes):
                raise ValueError(f"--batch-sizes {sizes!r} must be a list of whole numbers")
            if any(b < 1 for b in sizes) or list(sizes) != sorted(set(sizes)):
                raise ValueError(
                    f"--batch-sizes {list(sizes)} must be distinct, increasing and >= 1, "
                    "e.g. 16,32,64,128"
                )
            object.__setattr__(self, "batch_sizes", sizes)
        if not 1 <= self.min_batch <= self.max_batch:
            raise ValueError(
                f"need 1 <= min_batch <= max_batch, got {self.min_batch} and {self.max_batch}"
            )
        if not 0 <= self.warmup <= MAX_WARMUP:
            # Untimed, and outside the time budget: a huge count would profile for ever.
            raise ValueError(
                f"--warmup {self.warmup} must be from 0 to {MAX_WARMUP} (untimed steps before "
                "the first timing: lazy initialisation and kernel choice settle in a few)"
            )
        if not 1 <= self.min_repeats <= self.repeats <= self.max_repeats:
            raise ValueError(
                f"--repeats {self.repeats} must be >= min_repeats ({self.min_repeats}) >= 1 "
                f"and <= max_repeats ({self.max_repeats})"
            )
        if not (math.isfinite(self.time_budget) and self.time_budget > 0):
            raise ValueError(f"--time-budget {self.time_budget} must be a positive number of s")
        if self.reference_batch is not None and (
            isinstance(self.reference_batch, bool)
            or not isinstance(self.reference_batch, int)
            or self.reference_batch < 1
        ):
            raise ValueError(f"--reference-batch {self.reference_batch!r} must be >= 1")
        reference = self.reference_batch if self.batch_sizes is None else None
        if reference is not None and reference > self.max_batch and len(self.ladder()) < 2:
            # Far above --max-batch, every rung clamps to it: one batch, no fixed cost. (One
            # below --min-batch, as balance-report's B/P on a small batch, is left as it was.)
            raise ValueError(
                f"--reference-batch {self.reference_batch} leaves one batch size to time "
                f"({self.ladder()[0]}, within --min-batch {self.min_batch} and --max-batch "
                f"{self.max_batch}): a line needs two; give a reference batch of at most "
                f"--max-batch, or raise --max-batch"
            )

    def ladder(self) -> tuple[int, ...]:
        """The batch sizes to try, increasing.

        With a reference batch r and no explicit sizes, the rungs are r/8, r/4, r/2, r and
        2r (within min_batch and max_batch): a line fitted there is accurate where balanced
        shares of about r fall, rather than bent by tiny batches dominated by per-call
        overhead or by huge ones that spill the caches.
        """
        if self.batch_sizes is not None:
            return self.batch_sizes
        if self.reference_batch is not None:
            ref = self.reference_batch
            rungs = sorted(
                {min(self.max_batch, max(self.min_batch, ref * 2**k // 8)) for k in range(5)}
            )
            # Clamping can leave neighbours such as 4 and 5; a slow rank whose budget
            # affords two rungs must not spend them on batches too close to tell the fixed
            # cost from the per-sample one.
            spaced = [rungs[0]]
            for rung in rungs[1:]:
                if rung >= 1.5 * spaced[-1]:
                    spaced.append(rung)
            return tuple(spaced)
        sizes, size = [], self.min_batch
        while size <= self.max_batch:
            sizes.append(size)
            size *= 2
        if sizes[-1] != self.max_batch:
            sizes.append(self.max_batch)
        return tuple(sizes)


def profile_replica(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    make_batch: MakeBatch,
    *,
    device: torch.device | str | None = None,
    config: ProfileConfig | None = None,
    rank: int = 0,
    workload: str = "custom",
    slowdown: Slowdown | None = None,
    timer: Callable[[], float] = time.perf_counter,
    cpu_timer: Callable[[], float] | None = rank_cpu_time,
    memory_share: float = 1.0,
    available_memory: Callable[[], int] = available_host_memory,
    host: str | None = None,
    sync_batchnorm: bool = False,
) -> ReplicaProfile:
    """Measure how fast this replica trains the workload; leaves model and optimizer as found.

    Args:
        model, optimizer: the model (on `device`) and the optimizer over its parameters.
        loss_fn, make_batch: the mean-reduced loss on (outputs, targets); `make_batch(b,
            device)` returns synthetic (inputs, targets) of b samples.
        device, config: the replica's device (default the model's first parameter's); the
            ladder, repeats, warm-up and time budget (default ProfileConfig()).
        rank, workload, host: recorded in the profile (host: default this machine's).
        slowdown: emulated slowdown applied after each timed step, as training applies it.
        timer, cpu_timer: the clock in seconds (injectable for tests), and this rank's CPU
            seconds (`rank_cpu_time`) for the emulated slowdown on CPU devices, or None.
        memory_share, available_memory: this rank's share of the node's RAM (1 / ranks on
            the node), and a function giving the node's available RAM in bytes.
        sync_batchnorm: time BatchNorm layers as synchronised BatchNorm computes them on
            several ranks (its own arithmetic, with one-rank collectives).
    """
    config = config or ProfileConfig()
    slowdown = slowdown or Slowdown(1.0)
    device = resolve_device(model, device)
    started_at, start = utc_now(), timer()
    with step_sandbox(
        model, optimizer, loss_fn, make_batch, device=device, seed=config.seed,
        slowdown=slowdown, timer=timer, cpu_timer=cpu_timer, sync_batchnorm=sync_batchnorm,
    ) as steps:  # fmt: skip
        sizes, times, rounds = _climb(steps, config, device, lambda: timer() - start)
        fit = fit_step_time(sizes, times)
        per_sample, cap = _memory(
            steps, model, optimizer, loss_fn, make_batch, device, config, sizes, fit,
            memory_share, available_memory, lambda: config.time_budget - timer() + start,
        )  # fmt: skip
    return ReplicaProfile(
        rank=rank, host=host or socket.gethostname(), device=str(device),
        device_kind=device.type, device_name=device_name(device),
        threads=torch.get_num_threads(), workload=workload, batch_sizes=tuple(sizes),
        step_times=tuple(times), alpha=fit.alpha, beta=fit.beta, r_squared=fit.r_squared,
        cap=cap.cap, cap_source=cap.source, memory_per_sample=per_sample,
        slowdown=float(slowdown.factor), repeats=rounds, started_at=started_at,
        finished_at=utc_now(), reference_batch=config.reference_batch,
        fit_relative_error=fit.relative_error,
    )  # fmt: skip


def _climb(
    steps: StepTimer, config: ProfileConfig, device: torch.device, elapsed: Callable[[], float]
) -> tuple[list[int], list[float], int]:
    """Warm up, then time the ladder's affordable rungs (`_time_ladder`)."""
    ladder = config.ladder()
    for _ in range(config.warmup):
        steps.train_step(ladder[0])
    # On CUDA the OOM probe needs time too; hold back part of the budget for it.
    reserve = 0.3 if device.type == "cuda" and config.memory_cap else 0.0
    budget = config.time_budget * (1.0 - reserve)
    measured = _time_ladder(
        ladder, config, _fitting(steps.timed_step, config.batch_sizes is not None), elapsed,
        budget=budget,
        tail=config.memory_cap and device.type != "cuda",
    )  # fmt: skip
    steps.clear()
    return measured


# What torch says where a batch's tensors do not fit: the CPU allocator's, CUDA's.
_NO_MEMORY = ("can't allocate memory", "tried to allocate", "out of memory")


def _fitting(timed_step: Callable[[int], float], asked: bool) -> Callable[[int], float]:
    """`timed_step`, where a batch too big for memory is one line naming its size (a rung
    asked for, as --batch-sizes 16,1000000000, when `asked`; else one the ladder took from
    the global batch). torch's message names bytes, not batches."""

    def step(size: int) -> float:
        try:
            return timed_step(size)
        except RuntimeError as exc:  # torch.OutOfMemoryError is one
            text = " ".join(str(exc).split())
            if not any(words in text.lower() for words in _NO_MEMORY):
                raise
            fix = (
                "profile smaller --batch-sizes"
                if asked
                else "lower the global batch, or give this rank more memory"
            )
            raise ValueError(
                f"profiling: a training step at batch {size:,} does not fit in this rank's "
                f"memory ({text[:160]}); {fix}"
            ) from None

    return step


def _memory(
    steps: StepTimer,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    make_batch: MakeBatch,
    device: torch.device,
    config: ProfileConfig,
    sizes: list[int],
    fit: LinearFit,
    memory_share: float,
    available_memory: Callable[[], int],
    time_left: Callable[[], float],
) -> tuple[float | None, CapResult]:
    """Bytes a sample and the largest batch that fits (`_memory_cap`), unless disabled."""
    if not config.memory_cap:
        return None, CapResult(None, "disabled")
    # Saved activations grow linearly in b, so the two smallest rungs tell the bytes per
    # sample as well as any pair, at a fraction of the time.
    per_sample = memory_per_sample(
        model, loss_fn, lambda b: make_batch(b, device), sizes[0],
        sizes[1] if len(sizes) > 1 else 2 * sizes[0],
    )  # fmt: skip
    cap = _memory_cap(
        device, config, per_sample, fixed=_fixed_bytes(model, optimizer), share=memory_share,
        available_memory=available_memory, try_step=steps.train_step, start=sizes[-1],
        time_left=time_left,
        # The timed steps include the emulated sleep, so the fitted line already is a slowed
        # rank's step time: no second slowdown factor. (Probe steps do not sleep; forecasting
        # the slowed time stops an emulated rank where a device that much slower would stop.)
        predicted_time=lambda b: fit.alpha + fit.beta * b,
    )  # fmt: skip
    return per_sample, cap


def _time_ladder(
    ladder: tuple[int, ...],
    config: ProfileConfig,
    timed_step: Callable[[int], float],
    elapsed: Callable[[], float],
    budget: float,
    tail: bool = False,
) -> tuple[list[int], list[float], int]:
    """Median step time at each affordable rung, and the timed steps each got.

    A pilot pass climbs the ladder one step per rung (that step also warms the rung up) and
    stops where `repeats` more rounds would overrun the budget. Timed rounds then cycle
    through the chosen rungs, so a burst of load from elsewhere on the node hits every batch
    size alike instead of bending the fitted line at one rung. Each visit to a rung starts
    with an untimed step: the first step after a change of batch size pays for re-allocating
    and re-caching (about a millisecond on a CPU), which training, repeating one size, never
    pays.

    Args:
        tail: keep time for the work after the ladder (the CPU memory estimate: a forward
            pass at each of the two smallest rungs, at most the time of their pilot steps).
    """
    sizes: list[int] = []
    pilots: list[float] = []

    def reserved() -> float:
        return sum(pilots[:2]) if tail else 0.0

    for size in ladder:
        if len(sizes) >= 2:
            # Linear scaling of the last rung over-estimates alpha + beta*b: a safe forecast.
            predicted = pilots[-1] * size / sizes[-1]
            cost = (1 + 2 * config.repeats) * predicted + 2 * config.repeats * sum(pilots)
            if elapsed() + cost + reserved() > budget:
                break
        pilots.append(timed_step(size))
        sizes.append(size)
    samples: list[list[float]] = [[] for _ in sizes]
    for round_index in range(config.max_repeats):
        round_cost = 2 * sum(
            statistics.median(s) if s else p for s, p in zip(samples, pilots, strict=True)
        )
        if round_index >= config.min_repeats and elapsed() + round_cost + reserved() > budget:
            break
        for rung, size in enumerate(sizes):
            if len(sizes) > 1:
                timed_step(size)  # re-warm after the change of size; not kept
            samples[rung].append(timed_step(size))
    return sizes, [statistics.median(s) for s in samples], len(samples[0])


def _fixed_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes a replica holds whatever the batch: parameters, gradients, optimizer state."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(
        value.numel() * value.element_size()
        for entry in optimizer.state.values()
        for value in entry.values()
        if isinstance(value, torch.Tensor)
    )
    return 2 * params + state


def _memory_cap(
    device: torch.device,
    config: ProfileConfig,
    per_sample: float,
    *,
    fixed: int,
    share: float,
    available_memory: Callable[[], int],
    try_step: Callable[[int], None],
    start: int,
    time_left: Callable[[], float],
    predicted_time: Callable[[int], float],
) -> CapResult:
    if device.type != "cuda":
        return cpu_memory_cap(per_sample, available_memory(), fixed=fixed, share=share)
    result = probe_cap(
        try_step,
        start,
        config.probe_limit,
        time_left=time_left,
        predicted_time=predicted_time,
        cleanup=torch.cuda.empty_cache,
    )
    if result.source != "cuda-probe-out-of-time" or per_sample <= 0:
        return result
    # Out of budget before an OOM: estimate from free memory instead of claiming no limit.
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(device)
    return CapResult(start + math.floor(free * MEMORY_SAFETY / per_sample), "cuda-free-estimate")


def profile_all(
    comm: Communicator,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    make_batch: MakeBatch,
    **kwargs: Any,
) -> list[ReplicaProfile]:
    """Profile every replica at once and give every rank the same list, in rank order.

    Collective: every rank must call it. Ranks profile concurrently, as they will train, so
    shared resources (memory bandwidth, the node's cores) are contended as in training.

    Args:
        comm: the job's communicator.
        model, optimizer, loss_fn, make_batch: as for `profile_replica`.
        **kwargs: further `profile_replica` arguments (device, config, slowdown, timer,
            workload); rank and memory_share default to this rank and 1 / ranks on its node;
            and `sync_batchnorm` (default True): training synchronises BatchNorm, so on
            several ranks each rank's steps compute as its layers will, and `time_sync`
            counts their collectives; and `known` (default None): this rank's profile from
            an earlier world on the same device, which it keeps instead of profiling again
            (the sync, which depends on the world, is timed afresh).

    Returns:
        One ReplicaProfile per rank. Unless the config names a reference batch, every
        profile's throughput refers to the largest batch that every rank measured, so a
        rank whose budget ran out lower on the ladder is still compared like for like.
        Every profile carries the job's gradient-sync time (`time_sync`) for this model.
    """
    if "memory_share" not in kwargs or "host" not in kwargs:
        layout = node_layout(comm)
        kwargs.setdefault("memory_share", 1.0 / layout.local_size)
        kwargs.setdefault("host", layout.host)
    # Start together: ranks sharing a node should be measured while all of them compete.
    sync_batchnorm = bool(kwargs.pop("sync_batchnorm", True))
    known = kwargs.pop("known", None)
    comm.barrier()
    if known is not None:  # its throughput read at this world's reference batch
        config = kwargs.get("config")
        reference = config.reference_batch if config is not None else known.reference_batch
        profile = dataclasses.replace(known, rank=comm.rank, reference_batch=reference)
    else:
        profile = profile_replica(
            model, optimizer, loss_fn, make_batch, rank=comm.rank,
            sync_batchnorm=sync_batchnorm and comm.size > 1, **kwargs,
        )  # fmt: skip
    # After every rank's compute, as in training; time_sync is collective and gives every
    # rank the same (slowest rank's) figure.
    seconds, nbytes = time_sync(
        comm, model, timer=kwargs.get("timer", time.perf_counter), sync_batchnorm=sync_batchnorm
    )
    profile = dataclasses.replace(
        profile, sync_time=seconds, sync_bytes=nbytes, sync_ranks=comm.size
    )
    profiles = [ReplicaProfile.from_dict(entry) for entry in comm.allgather(profile.to_dict())]
    if all(p.reference_batch is None for p in profiles):
        common = min(p.batch_sizes[-1] for p in profiles)
        profiles = [dataclasses.replace(p, reference_batch=common) for p in profiles]
    return profiles
