"""The balance report's data: what each policy predicts for a set of replica profiles.

A what-if over plans, not a measurement: the profiles are read, never re-timed. Every figure
is read at the batch sizes a plan actually gives each rank: the step of each policy, and the
ideal step (the continuous optimum under the caps, zero shares allowed) that the efficiency
divides by, so no efficiency exceeds 100%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lbtrain.balancer import (
    POLICIES,
    BalancePlan,
    CommCost,
    Ideal,
    ideal_step,
    idle_ranks_note,
    min_batch_note,
    plan_batches,
    subset_note,
)
from lbtrain.profiling.record import ReplicaProfile

__all__ = ["BalanceReport", "PolicyResult", "build_report", "rank_rows"]


def rank_rows(plan: BalancePlan) -> list[tuple[int, float, float, float]]:
    """Per rank: batch, weight, predicted compute and idle seconds (0 compute at b = 0)."""
    return list(
        zip(
            plan.batch_sizes,
            plan.weights,
            plan.predicted_step_times,
            plan.predicted_idle_times,
            strict=True,
        )
    )


@dataclass(frozen=True)
class PolicyResult:
    """One policy's plan and its predicted figures.

    Args:
        plan: the BalancePlan.
        speedup_over_equal: equal's predicted step time / this policy's.
        efficiency: the ideal step (compute T* plus sync) / this policy's predicted step;
            at most 1.
    """

    plan: BalancePlan
    speedup_over_equal: float
    efficiency: float

    @property
    def policy(self) -> str:
        """The policy name."""
        return self.plan.policy

    @property
    def compute_time(self) -> float:
        """Predicted compute seconds per step: the slowest rank's."""
        return self.plan.predicted_compute_time

    @property
    def comm_time(self) -> float:
        """Predicted seconds of the gradient sync per step (0 when not measured)."""
        return self.plan.predicted_comm_time

    @property
    def predicted_step_time(self) -> float:
        """Predicted seconds per synchronous step: compute, then the sync."""
        return self.plan.predicted_step_time

    @property
    def idle_ranks(self) -> tuple[int, ...]:
        """Ranks the plan gives no samples."""
        return self.plan.idle_ranks


@dataclass(frozen=True)
class BalanceReport:
    """Per-rank and per-policy predictions for one global batch size.

    Args:
        profiles: one profile per rank.
        global_batch_size: B.
        results: one PolicyResult per policy reported, in order.
        ideal: the step no integer plan beats, for these replicas, caps and sync.
        notes: one-line explanations that apply (idle ranks, min_batch, fewer ranks).
        min_batch: the smallest batch the plans could give a rank.
        comm: the sync cost the predictions include, or None (0 s).
    """

    profiles: tuple[ReplicaProfile, ...]
    global_batch_size: int
    results: tuple[PolicyResult, ...]
    ideal: Ideal
    notes: tuple[str, ...] = ()
    min_batch: int = 0
    comm: CommCost | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every figure the report shows."""
        return {
            "global_batch_size": self.global_batch_size,
            "world_size": len(self.profiles),
            "min_batch": self.min_batch,
            "comm": None if self.comm is None else self.comm.to_dict(),
            "ideal": {
                "compute": self.ideal.compute,
                "comm": self.ideal.comm,
                "step": self.ideal.step,
            },
            "notes": list(self.notes),
            "replicas": [_replica_dict(p) for p in self.profiles],
            "policies": {
                result.policy: {
                    "compute_time": result.compute_time,
                    "comm_time": result.comm_time,
                    "predicted_step_time": result.predicted_step_time,
                    "speedup_over_equal": result.speedup_over_equal,
                    "efficiency": result.efficiency,
                    "idle_ranks": list(result.idle_ranks),
                    "ranks": [
                        {
                            "rank": rank,
                            "batch_size": b,
                            "weight": w,
                            "compute_time": t,
                            "idle_time": idle,
                        }
                        for rank, (b, w, t, idle) in enumerate(rank_rows(result.plan))
                    ],
                }
                for result in self.results
            },
        }


def _replica_dict(profile: ReplicaProfile) -> dict[str, Any]:
    return {
        "rank": profile.rank,
        "host": profile.host,
        "device": profile.device,
        "device_name": profile.device_name,
        "threads": profile.threads,
        "slowdown": profile.slowdown,
        "samples_per_second": profile.throughput,
        "throughput_batch": profile.throughput_batch,
        "alpha": profile.alpha,
        "beta": profile.beta,
        "r_squared": profile.r_squared,
        "cap": profile.cap,
    }


def build_report(
    profiles: Sequence[ReplicaProfile],
    global_batch_size: int,
    policies: Sequence[str] | str = "all",
    *,
    min_batch: int = 0,
    comm: CommCost | None = None,
) -> BalanceReport:
    """Plan one global batch under each policy and predict what each buys.

    Args:
        profiles: one profile per rank, in rank order.
        global_batch_size: B.
        policies: "all", one policy name, or a list of them.
        min_batch: smallest batch any rank may get; 0 lets `cost` give a rank no samples.
        comm: one step's measured sync cost, added to every prediction; None counts 0 s.

    Returns:
        The BalanceReport. `equal` is always planned, as the baseline of the speedups. The
        notes explain the `cost` plan when it is reported, else the last policy's plan.
    """
    policies = _named_policies(policies)
    profiles = tuple(profiles)
    if not profiles:
        raise ValueError("no profiles to report on; profile at least one rank")
    plans: dict[str, BalancePlan] = {}
    for policy in ("equal", *policies):
        if policy not in plans:
            plans[policy] = plan_batches(
                profiles, global_batch_size, policy, min_batch=min_batch, comm=comm
            )
    # ideal_step clamps T* to the plan's own compute (bisection stops a hair above T*), so
    # the smallest over the plans is T* and no efficiency can exceed 1.
    ideal = min((ideal_step(plan) for plan in plans.values()), key=lambda i: i.step)
    baseline = plans["equal"].predicted_step_time
    results = tuple(
        PolicyResult(
            plan=plans[policy],
            speedup_over_equal=baseline / plans[policy].predicted_step_time,
            efficiency=ideal.step / plans[policy].predicted_step_time,
        )
        for policy in policies
    )
    advised = plans["cost"] if "cost" in policies else results[-1].plan
    notes = (idle_ranks_note(advised), min_batch_note(advised), subset_note(advised))
    return BalanceReport(
        profiles=profiles,
        global_batch_size=global_batch_size,
        results=results,
        ideal=ideal,
        notes=tuple(note for note in notes if note is not None),
        min_batch=min_batch,
        comm=comm,
    )


def _named_policies(policies: Sequence[str] | str) -> Sequence[str]:
    """The policies `policies` names ("all", one name or a list), each checked known."""
    if isinstance(policies, str):
        policies = list(POLICIES) if policies == "all" else [policies]
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(
                f"policy={policy!r} is unknown; choose one of {', '.join(POLICIES)} or all"
            )
    if not policies:
        raise ValueError("policies is empty; name at least one policy, or all")
    return policies
