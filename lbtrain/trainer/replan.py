"""Re-planning between epochs from what each rank measured while training.

Every rank calls `propose` with the same allgathered measurements, so every rank reaches the
same decision; the job still takes rank 0's, so nothing can make the ranks' loaders differ.
The update stays exact across a switch: the gradient weights follow the shares.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lbtrain.balancer import WORTHWHILE, BalancePlan, CommCost, ReplicaSpeed, plan_batches

__all__ = ["Replan", "predicted_steps", "propose", "refreshed", "rescaled_replicas"]


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
    """(mean batch, mean compute seconds) per step of one rank's epoch, or None."""
    steps, samples, compute = (entry.get(k, 0.0) for k in ("steps", "samples", "compute"))
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
