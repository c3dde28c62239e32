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

from lbtrain.balancer import WORTHWHILE, BalancePlan, ReplicaSpeed, plan_batches

__all__ = ["Replan", "predicted_steps", "propose", "rescaled_replicas"]


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


def rescaled_replicas(
    plan: BalancePlan, measured: Sequence[Mapping[str, float]]
) -> tuple[tuple[ReplicaSpeed, ...], tuple[float | None, ...]]:
    """Each rank's speed model scaled by measured / predicted compute over the epoch.

    A device that turned f times slower (or faster) takes f times as long for its fixed
    cost and per sample alike. A rank with no samples measured nothing and keeps its model.
    """
    replicas, factors = [], []
    for replica, entry in zip(plan.replicas, measured, strict=True):
        predicted, compute = entry.get("predicted", 0.0), entry.get("compute", 0.0)
        if entry.get("samples", 0) <= 0 or not predicted > 0 or not compute > 0:
            replicas.append(replica)
            factors.append(None)
            continue
        factor = compute / predicted
        replicas.append(
            dataclasses.replace(
                replica,
                throughput=replica.throughput / factor,
                alpha=replica.alpha * factor,
                beta=replica.beta * factor,  # type: ignore[operator]
            )
        )
        factors.append(factor)
    return tuple(replicas), tuple(factors)


def propose(
    plan: BalancePlan, measured: Sequence[Mapping[str, float]], threshold: float = WORTHWHILE
) -> Replan | None:
    """The plan the measured rates imply, if it lowers the step by more than `threshold`.

    Args:
        plan: the plan in force.
        measured: per rank, "compute" (seconds measured), "predicted" (seconds the plan's
            model predicted for the same steps) and "samples" (this rank's samples).
        threshold: the relative gain below which the plan stays (measurement noise).

    `equal` is the unbalanced baseline and never re-plans.
    """
    if plan.policy == "equal" or len(measured) != plan.world_size:
        return None
    replicas, factors = rescaled_replicas(plan, measured)
    if all(f is None for f in factors):
        return None
    current = dataclasses.replace(plan, replicas=replicas)
    candidate = plan_batches(
        replicas, plan.global_batch_size, plan.policy, min_batch=plan.min_batch, comm=plan.comm
    )
    old, new = current.predicted_step_time, candidate.predicted_step_time
    if candidate.batch_sizes == plan.batch_sizes or not new < (1 - threshold) * old:
        return None
    if not all(math.isfinite(v) for v in (old, new)):
        return None
    return Replan(candidate, old, new, factors)
