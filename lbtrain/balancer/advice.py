"""What the plan cannot fix by itself: the ideal step, idle ranks, and launching fewer ranks.

Pure arithmetic on the alpha-beta model plus the sync term, like the rest of the balancer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lbtrain.balancer.plan import BalancePlan, cost_sizes
from lbtrain.balancer.rounding import water_fill
from lbtrain.balancer.subsets import SubsetPrediction, best_subset, subset_predictions

__all__ = [
    "WORTHWHILE",
    "Ideal",
    "SubsetPrediction",
    "ideal_step",
    "idle_ranks_note",
    "min_batch_note",
    "subset_note",
    "subset_predictions",
]

# Re-planning and launch advice only speak up for gains above this; smaller ones are noise.
WORTHWHILE = 0.05


@dataclass(frozen=True)
class Ideal:
    """The step no plan can beat: the continuous water-filling optimum plus the sync.

    Args:
        compute: T*, the smallest T with sum_i clip((T - alpha_i) / beta_i, 0, cap_i) >= B:
            every integer plan's slowest rank takes at least this long.
        comm: the sync of the launched ranks (all of them take part in it).
    """

    compute: float
    comm: float

    @property
    def step(self) -> float:
        """Ideal seconds per step."""
        return self.compute + self.comm


def ideal_step(plan: BalancePlan) -> Ideal:
    """T* of the plan's replicas and caps, with zero shares allowed, plus the plan's sync."""
    replicas = plan.replicas
    upper = [math.inf if r.cap is None else r.cap for r in replicas]
    shares = water_fill(
        plan.global_batch_size,
        [r.alpha for r in replicas],
        [r.beta for r in replicas],
        [0] * len(replicas),
        upper,
    )
    compute = max(r.step_time(b) for r, b in zip(replicas, shares, strict=True) if b > 0)
    # Bisection stops a hair above T*; an integer plan that reaches T* exactly (equal
    # speeds, B divisible by P) must not read as beating the ideal.
    return Ideal(min(compute, plan.predicted_compute_time), plan.predicted_comm_time)


def subset_note(plan: BalancePlan) -> str | None:
    """Advice when launching fewer ranks is predicted more than 5% faster than this plan."""
    # The best of subset_predictions, planning only the subsets that could be it.
    best = best_subset(plan.replicas, plan.global_batch_size, plan.comm)
    if best is None:
        return None
    slower = best.step >= (1 - WORTHWHILE) * plan.predicted_step_time
    if len(best.ranks) == plan.world_size or slower:
        return None
    return (
        f"the fastest launch uses {_ranks(best.ranks)} only: {_ms(best.step)} ms/step "
        f"against {_ms(plan.predicted_step_time)} ms with all {plan.world_size}; launch "
        f"{len(best.ranks)} rank{'s' if len(best.ranks) != 1 else ''} on those devices"
    )


def idle_ranks_note(plan: BalancePlan) -> str | None:
    """Why the plan's zero-share ranks get nothing, or None when every rank has samples."""
    idle = plan.idle_ranks
    if not idle:
        return None
    alphas = [plan.replicas[i].alpha for i in idle]
    one = min(plan.replicas[i].step_time(1) for i in idle)
    low, high = min(alphas), max(alphas)
    fixed = _ms(low) if math.isclose(low, high, rel_tol=0.05) else f"{_ms(low)} to {_ms(high)}"
    many = len(idle) > 1
    return (
        f"{_ranks(idle)} get{'' if many else 's'} no samples: "
        f"{'their' if many else 'its'} fixed cost per step ({fixed} ms; {_ms(one)} ms or more "
        f"for one sample) exceeds the step of the others ({_ms(plan.predicted_compute_time)} "
        f"ms); leave {'them' if many else 'it'} out of the launch"
    )


def min_batch_note(plan: BalancePlan) -> str | None:
    """For a cost plan forced to give every rank a sample: what zero shares would save."""
    if plan.policy != "cost" or plan.min_batch == 0:
        return None
    upper = [math.inf if r.cap is None else r.cap for r in plan.replicas]
    sizes = cost_sizes(plan.replicas, plan.global_batch_size, [0] * plan.world_size, upper)
    free = BalancePlan("cost", plan.global_batch_size, tuple(sizes), plan.replicas, 0, plan.comm)
    if not free.idle_ranks or free.predicted_step_time >= (1 - WORTHWHILE) * (
        plan.predicted_step_time
    ):
        return None
    return (
        f"if {_ranks(free.idle_ranks)} could get no samples, a step would take "
        f"{_ms(free.predicted_step_time)} ms instead of {_ms(plan.predicted_step_time)} ms; "
        "allow zero shares with a minimum batch of 0 (--min-batch 0, or min_batch=0 in "
        "the library)"
    )


def _ranks(ranks: Sequence[int]) -> str:
    """ "rank 1" or "ranks 0, 2": the noun agrees with the count."""
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g}" if seconds < 0.1 else f"{1e3 * seconds:.0f}"
