"""Re-planning between epochs: the plan that what each rank measured implies, and the rule
that decides when to switch to it (on evidence, never on noise).

`propose` is the arithmetic: each rank's measured compute against the plan's model gives
a rescaled model and the plan it implies. `Replanner.observe` is the memory and the rule:
it takes each epoch's allgathered per-rank figures, so every rank holds the same memory and
reaches the same decision (the trainer still takes rank 0's, so nothing can make the ranks'
loaders differ). Its state is plain values, checkpointed, so a resumed run decides what an
uninterrupted one decides. The update stays exact across a switch: the gradient weights
follow the shares.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lbtrain.balancer import WORTHWHILE, BalancePlan, CommCost, ReplicaSpeed, plan_batches
from lbtrain.logs import logger

__all__ = [
    "CHANGE",
    "MIN_EPOCHS",
    "REPLAN_GAIN",
    "SIGMAS",
    "Replan",
    "Replanner",
    "predicted_steps",
    "propose",
    "refreshed",
    "rescaled_replicas",
]


# A rank's factor this far from its segment's mean (relative) is a change, not noise: the
# epoch waits for a second one that agrees before it counts.
CHANGE = 0.25
# The gain must beat this many standard errors of the measured rates.
SIGMAS = 3.0
# The smallest predicted gain worth a switch: a switch moves no data and keeps the update
# exact, so a small gain is worth it once the measurements show it is real.
REPLAN_GAIN = 0.02
# Epochs of one segment needed before a switch: one epoch cannot tell its noise.
MIN_EPOCHS = 2
# Epochs of one segment kept for its statistics.
WINDOW = 8
# Two epochs cannot tell their noise: each rank's spread starts from this prior (one
# pseudo-epoch 5% off), which the measured epochs outweigh as they come.
PRIOR_SPREAD = 0.05


@dataclass(frozen=True)
class Replan:
    """A better plan, and why."""

    plan: BalancePlan
    old_step: float
    new_step: float
    factors: tuple[float | None, ...]

    def describe(self, old: BalancePlan) -> str:
        """One line for the log."""
        rates = ", ".join(
            f"rank {rank} {factor:.2f}x" for rank, factor in enumerate(self.factors) if factor
        )
        return (
            f"re-planned: batches {list(old.batch_sizes)} -> {list(self.plan.batch_sizes)}; "
            f"measured compute against the plan's model: {rates}; predicted step "
            f"{1e3 * self.old_step:.1f} -> {1e3 * self.new_step:.1f} ms"
        )

    def to_dict(self, old: BalancePlan) -> dict[str, Any]:
        """JSON-ready record of the switch."""
        return {
            "old_batch_sizes": list(old.batch_sizes),
            "new_batch_sizes": list(self.plan.batch_sizes),
            "old_step_seconds": self.old_step,
            "new_step_seconds": self.new_step,
            "factors": list(self.factors),
        }


def predicted_steps(plan: BalancePlan, shares: Sequence[int], rank: int) -> tuple[float, float]:
    """(this rank's predicted compute, the job's predicted step) for one step's shares."""
    times = [r.step_time(b) if b > 0 else 0.0 for r, b in zip(plan.replicas, shares, strict=True)]
    return times[rank], max(times) + plan.predicted_comm_time


def _per_step(entry: Mapping[str, float]) -> tuple[float, float] | None:
    """(mean batch, mean compute seconds) per step of one rank's epoch, or None.

    Over the steps it had samples in: a step without any (a tail shorter than the ranks)
    costs next to nothing (with synchronised BatchNorm, a forward and backward of no
    samples), and counted, it would pull the fitted fixed cost down.
    """
    steps = _busy(entry)
    samples, compute = entry.get("samples", 0.0), entry.get("compute", 0.0)
    if not (steps > 0 and samples > 0 and compute > 0):
        return None
    return samples / steps, compute / steps


def _two_point(
    replica: ReplicaSpeed,
    now: tuple[float, float],
    before: tuple[float, float] | None,
    reference: float,
) -> ReplicaSpeed | None:
    """The line through two epochs at batch sizes at least 25% apart, if it rises with b."""
    if before is None:
        return None
    (b2, t2), (b1, t1) = now, before
    if abs(b2 - b1) < 0.25 * max(b1, b2):
        return None
    beta = (t2 - t1) / (b2 - b1)
    alpha = t2 - beta * b2
    if not (beta > 0 and math.isfinite(alpha + beta)):
        return None  # noise, or a device that changed speed between the two epochs
    if alpha < 0:
        # A device with next to no fixed cost lands a hair below zero: no fixed cost, and
        # the line through the latest epoch.
        alpha, beta = 0.0, t2 / b2
    # Samples/s at the batch every rank shares (B / P), as in profiles, so `proportional`
    # compares the ranks at one batch size.
    throughput = reference / (alpha + beta * reference)
    return dataclasses.replace(replica, throughput=throughput, alpha=alpha, beta=beta)


def rescaled_replicas(
    plan: BalancePlan,
    measured: Sequence[Mapping[str, float]],
    previous: Sequence[Mapping[str, float]] | None = None,
) -> tuple[tuple[ReplicaSpeed, ...], tuple[float | None, ...]]:
    """Each rank's speed model brought in line with what the epoch measured.

    When the rank also ran the previous epoch at a batch size at least 25% away, the line
    through those two measurements replaces the model: a profile that split the fixed and
    the per-sample cost wrongly would otherwise keep misjudging every other batch size, and
    plans would swing between epochs. Otherwise the model is scaled by measured / predicted
    compute: a device that turned f times slower takes f times as long for its fixed cost
    and per sample alike. A rank with no samples measured nothing and keeps its model.

    Returns:
        The replicas, and per rank measured / predicted compute (None where nothing ran).
    """
    replicas, factors = [], []
    earlier = previous if previous is not None and len(previous) == len(measured) else None
    for rank, (replica, entry) in enumerate(zip(plan.replicas, measured, strict=True)):
        predicted, compute = entry.get("predicted", 0.0), entry.get("compute", 0.0)
        if entry.get("samples", 0) <= 0 or not predicted > 0 or not compute > 0:
            replicas.append(replica)
            factors.append(None)
            continue
        factor = compute / predicted
        now = _per_step(entry)
        before = None if earlier is None else _per_step(earlier[rank])
        reference = plan.global_batch_size / plan.world_size
        fitted = None if now is None else _two_point(replica, now, before, reference)
        replicas.append(
            fitted
            or dataclasses.replace(
                replica,
                throughput=replica.throughput / factor,
                alpha=replica.alpha * factor,
                beta=replica.beta * factor,  # type: ignore[operator]
            )
        )
        factors.append(factor)
    return tuple(replicas), tuple(factors)


def measured_comm(plan: BalancePlan, measured: Sequence[Mapping[str, float]]) -> CommCost | None:
    """The sync as measured while training: the slowest rank's mean per step, or the plan's.

    Every rank takes part in the same allreduce calls, so their figures differ only by
    noise; the largest keeps the prediction on the safe side, as the profiled figure does.
    """
    steps = [entry.get("steps", 0.0) for entry in measured]
    if len(measured) != plan.world_size or not all(n > 0 for n in steps):
        return plan.comm
    seconds = max(entry.get("comm", 0.0) / n for entry, n in zip(measured, steps, strict=True))
    if not (math.isfinite(seconds) and seconds > 0):
        return plan.comm
    nbytes = plan.comm.nbytes if plan.comm is not None else 0
    return CommCost(seconds=seconds, world_size=plan.world_size, nbytes=nbytes)


def refreshed(
    plan: BalancePlan,
    measured: Sequence[Mapping[str, float]],
    previous: Sequence[Mapping[str, float]] | None = None,
) -> BalancePlan:
    """The same batches, with the speed model and the sync cost the last epoch measured.

    The prediction of the next epoch then rests on what this hardware did in the last one
    (a device that slowed down, a sync slower than profiled), not on the profile alone.
    """
    if len(measured) != plan.world_size:
        return plan
    replicas, _ = rescaled_replicas(plan, measured, previous)
    return dataclasses.replace(plan, replicas=replicas, comm=measured_comm(plan, measured))


def propose(
    plan: BalancePlan,
    measured: Sequence[Mapping[str, float]],
    threshold: float = WORTHWHILE,
    previous: Sequence[Mapping[str, float]] | None = None,
) -> Replan | None:
    """The plan the measured rates imply, if it lowers the step by more than `threshold`.

    Args:
        plan: the plan in force.
        measured: per rank, "compute" (seconds measured), "predicted" (seconds the plan's
            model predicted for the same steps), "samples" (this rank's samples), "steps",
            and "comm" (seconds in the gradient sync).
        threshold: the relative gain below which the plan stays (measurement noise).
        previous: the same figures from the epoch before, if any (see rescaled_replicas).

    `equal` is the unbalanced baseline and never re-plans.
    """
    if plan.policy == "equal" or len(measured) != plan.world_size:
        return None
    replicas, factors = rescaled_replicas(plan, measured, previous)
    if all(f is None for f in factors):
        return None
    current = refreshed(plan, measured, previous)
    candidate = plan_batches(
        replicas, plan.global_batch_size, plan.policy, min_batch=plan.min_batch, comm=current.comm
    )
    old, new = current.predicted_step_time, candidate.predicted_step_time
    if candidate.batch_sizes == plan.batch_sizes or not new < (1 - threshold) * old:
        return None
    if not all(math.isfinite(v) for v in (old, new)):
        return None
    return Replan(candidate, old, new, factors)


def _factors(measured: Sequence[Mapping[str, float]]) -> list[float | None]:
    """Per rank, measured / predicted compute of one epoch (None where nothing ran)."""
    factors: list[float | None] = []
    for entry in measured:
        predicted, compute = entry.get("predicted", 0.0), entry.get("compute", 0.0)
        ok = entry.get("samples", 0) > 0 and predicted > 0 and compute > 0
        factors.append(compute / predicted if ok and math.isfinite(compute / predicted) else None)
    return factors


def _relative(measured: Sequence[Mapping[str, float]]) -> list[float | None]:
    """Per rank, its factor over the mean of the ranks that ran that epoch: what a plan can
    act on, free of a slowdown common to all."""
    factors = _factors(measured)
    working = [f for f in factors if f is not None]
    if not working:
        return factors
    mean = sum(working) / len(working)
    return [None if f is None else f / mean for f in factors]


def _versus_others(measured: Sequence[Mapping[str, float]]) -> list[float | None]:
    """Per rank, its factor over the mean of the other ranks that ran that epoch (1 for a
    rank alone): a change on one rank shows in full, even among two."""
    factors = _factors(measured)
    total = sum(f for f in factors if f is not None)
    count = sum(1 for f in factors if f is not None)
    relative: list[float | None] = []
    for f in factors:
        others = count - 1
        relative.append(None if f is None else 1.0 if others == 0 else f / ((total - f) / others))
    return relative


def _busy(entry: Mapping[str, float]) -> float:
    """The steps a rank had samples in (all of them, in figures saved before they were
    counted)."""
    return entry.get("busy_steps", entry.get("steps", 0.0))


def _pooled(epochs: Sequence[Sequence[Mapping[str, float]]]) -> list[dict[str, float]]:
    """Per rank, the sums of several epochs' measurements (as one long epoch)."""
    keys = ("compute", "predicted", "samples", "steps", "comm")
    pooled = [
        {k: sum(epoch[rank].get(k, 0.0) for epoch in epochs) for k in keys}
        for rank in range(len(epochs[-1]))
    ]
    for rank, entry in enumerate(pooled):
        entry["busy_steps"] = sum(_busy(epoch[rank]) for epoch in epochs)
    return pooled


def _shown(values: Sequence[float | None]) -> str:
    return "[" + ", ".join("-" if v is None else f"{v:.3f}" for v in values) + "]"


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _agree(a: Sequence[float | None], b: Sequence[float | None]) -> bool:
    return all(
        x is None or y is None or abs(x - y) <= CHANGE * max(x, y)
        for x, y in zip(a, b, strict=True)
    )


class Replanner:
    """Decides at each epoch's end whether what was measured justifies another plan.

    It switches on evidence, never on noise. The epochs since the last switch form a
    segment; each rank's measured/predicted factor, relative to the other ranks' (a drift
    common to all changes no share), gives its mean and standard error over the segment.
    With two epochs or more, it moves when a plan still gains more than `threshold` with
    every rank's rate pulled `SIGMAS` standard errors toward the others', and then to the
    plan of the best estimate: jitter of +-10% on fixed speeds never switches. An epoch
    whose rates jump by more than `CHANGE` waits for a second that agrees; the two then
    start a new segment, so a device that turned 4x slower is followed after the two epochs
    that measured it. `state_dict` carries all of it, so a resumed run decides what the
    uninterrupted run decides.
    """

    def __init__(self, threshold: float = REPLAN_GAIN) -> None:
        self.threshold = threshold
        self.segment: list[list[dict[str, float]]] = []
        self.pending: list[dict[str, float]] | None = None
        self.anchor: list[dict[str, float]] | None = None
        self.switches = 0

    def observe(self, plan: BalancePlan, measured: Sequence[Mapping[str, float]]) -> Replan | None:
        """Add one epoch's per-rank figures (every rank's, allgathered); a switch or None."""
        if plan.policy == "equal" or len(measured) != plan.world_size:
            return None
        epoch = [dict(entry) for entry in measured]
        logger.debug("re-planner: factors %s; segment of %d epoch(s)",
                     _shown(_factors(epoch)), len(self.segment))  # fmt: skip
        if self._changed(epoch):
            if self.pending is None or not self._same_change(self.pending, epoch):
                logger.debug("re-planner: rates jumped more than %d%%; waiting for a second "
                             "epoch that agrees", round(100 * CHANGE))  # fmt: skip
                self.pending = epoch
                return None
            self.segment, self.anchor = [self.pending], None  # the old rates are gone
        self.pending = None
        self.segment = [*self.segment, epoch][-WINDOW:]
        return self._decide(plan)

    def _changed(self, epoch: list[dict[str, float]]) -> bool:
        if not self.segment:
            return False
        means = self._means(_versus_others)
        return not _agree(means, _versus_others(epoch))

    def _same_change(self, first: list[dict[str, float]], second: list[dict[str, float]]) -> bool:
        """Whether two epochs that left the segment moved the same way on every rank (their
        sizes may differ: a loaded machine adds its own noise to a real change)."""
        means = self._means(_versus_others)
        for mean, a, b in zip(means, _versus_others(first), _versus_others(second), strict=True):
            if mean is None or a is None or b is None:
                continue
            da, db = a / mean - 1, b / mean - 1
            if max(abs(da), abs(db)) > CHANGE and not (
                da * db > 0 and min(abs(da), abs(db)) > CHANGE / 2
            ):
                return False
        return True

    def _means(self, relative: Callable[..., list[float | None]]) -> list[float | None]:
        """Each rank's mean relative rate over the segment."""
        columns = zip(*(relative(epoch) for epoch in self.segment), strict=True)
        return [_mean(column) for column in columns]

    def _shrunk(self) -> list[dict[str, float]]:
        """The segment's pooled figures, each rank's rate pulled toward the others' by
        SIGMAS standard errors of its own: what is left is the evidence, not the noise.

        Rates are compared relative to each epoch's mean over the ranks: a machine that
        slows every rank alike changes no share, so only what differs between ranks counts.
        """
        pooled = _pooled(self.segment)
        columns = list(zip(*(_relative(epoch) for epoch in self.segment), strict=True))
        absolute = [f for epoch in self.segment for f in _factors(epoch) if f is not None]
        if not absolute:
            return pooled
        centre = sum(absolute) / len(absolute)
        for entry, column in zip(pooled, columns, strict=True):
            values = [v for v in column if v is not None]
            if not values:
                continue
            mean = sum(values) / len(values)
            spread = sum((v / mean - 1) ** 2 for v in values) + PRIOR_SPREAD**2
            error = mean * math.sqrt(spread / len(values)) / math.sqrt(len(values))
            gap = mean - 1
            shrunk = 1 + math.copysign(max(0.0, abs(gap) - SIGMAS * error), gap)
            entry["compute"] = entry["predicted"] * centre * shrunk
        return pooled

    def _decide(self, plan: BalancePlan) -> Replan | None:
        if len(self.segment) < MIN_EPOCHS:
            return None
        previous = _pooled([self.anchor]) if self.anchor is not None else None
        # The evidence decides whether to move; the best estimate decides where to.
        if propose(plan, self._shrunk(), threshold=self.threshold, previous=previous) is None:
            logger.debug(
                "re-planner: no plan beats %d%% once each rate is pulled %g standard errors "
                "toward the others'",
                round(100 * self.threshold),
                SIGMAS,
            )
            return None
        pooled = _pooled(self.segment)
        change = propose(plan, pooled, threshold=self.threshold, previous=previous)
        if change is None:
            return None
        self.anchor, self.segment = pooled, []
        self.switches += 1
        return change

    def state_dict(self) -> dict[str, Any]:
        """Everything it remembers, as plain values (for checkpoints)."""
        return {
            "segment": self.segment,
            "pending": self.pending,
            "anchor": self.anchor,
            "switches": self.switches,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state_dict()`'s values."""
        self.segment = [list(epoch) for epoch in state.get("segment", [])]
        self.pending = state.get("pending")
        self.anchor = state.get("anchor")
        self.switches = int(state.get("switches", 0))
