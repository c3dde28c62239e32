"""Per-replica batch sizes for one global batch: the policies and the plan they produce."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from lbtrain.balancer.checks import listed, whole
from lbtrain.balancer.network import CommCost
from lbtrain.balancer.replica import ReplicaSpeed, as_replica_speed
from lbtrain.balancer.rounding import largest_remainder, min_max_round, water_fill

__all__ = ["MAX_GLOBAL_BATCH", "POLICIES", "BalancePlan", "cost_sizes", "plan_batches"]

POLICIES = ("equal", "proportional", "cost")
# The planner shares batches through float water-filling, exact for integers up to 2**53;
# larger batches are refused rather than rounded loosely (no step holds that many samples).
MAX_GLOBAL_BATCH = 2**53


@dataclass(frozen=True)
class BalancePlan:
    """How one global batch is shared among replicas.

    Args:
        policy: the policy that produced the plan (one of POLICIES).
        global_batch_size: B, the samples in one full global batch.
        batch_sizes: b_i per rank; they sum to B.
        replicas: the speed model and cap of each rank that the plan was computed from.
        min_batch: the smallest batch any rank may get; 0 lets a rank sit out (it computes
            nothing and adds zeros to the gradient sum).
        comm: the measured cost of one step's gradient sync, or None when unknown (0 s).

    The weight of rank i is b_i / B: scaling rank i's mean-loss gradient by it and summing over
    ranks gives the mean gradient over the global batch.
    """

    policy: str
    global_batch_size: int
    batch_sizes: tuple[int, ...]
    replicas: tuple[ReplicaSpeed, ...]
    min_batch: int = 0
    comm: CommCost | None = None

    def __post_init__(self) -> None:
        # numpy integers become ints (a plan goes to JSON); anything else is refused below.
        object.__setattr__(self, "batch_sizes", tuple(_plain(b) for b in self.batch_sizes))
        object.__setattr__(self, "min_batch", _plain(self.min_batch))
        object.__setattr__(self, "global_batch_size", _plain(self.global_batch_size))
        object.__setattr__(
            self,
            "replicas",
            tuple(as_replica_speed(r, i) for i, r in enumerate(self.replicas)),
        )
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is unknown; choose one of {POLICIES}")
        # A float, a bool or 0 once passed here and failed deep in the loader (or as a
        # ZeroDivisionError in the weights).
        whole("global_batch_size", self.global_batch_size, low=1)
        if not self.batch_sizes:
            raise ValueError("batch_sizes is empty; a plan needs one batch size per rank")
        if self.comm is not None and not isinstance(self.comm, CommCost | dict):
            raise TypeError(
                f"comm={self.comm!r:.60} ({type(self.comm).__name__}) is not a CommCost; "
                "pass CommCost(...) or leave it out"
            )
        if len(self.batch_sizes) != len(self.replicas):
            raise ValueError(
                f"batch_sizes has {len(self.batch_sizes)} entries but replicas has "
                f"{len(self.replicas)}; a plan needs one of each per rank"
            )
        if (
            isinstance(self.min_batch, bool)
            or not isinstance(self.min_batch, int)
            or (self.min_batch < 0)
        ):
            raise ValueError(f"min_batch={self.min_batch!r} must be an integer >= 0")
        if isinstance(self.comm, dict):
            object.__setattr__(self, "comm", CommCost.from_dict(self.comm))
        if any(
            isinstance(b, bool) or not isinstance(b, int) or b < self.min_batch
            for b in self.batch_sizes
        ):
            raise ValueError(
                f"batch_sizes={list(self.batch_sizes)} must be integers >= min_batch="
                f"{self.min_batch}"
            )
        if sum(self.batch_sizes) != self.global_batch_size:
            raise ValueError(
                f"batch_sizes={list(self.batch_sizes)} sum to {sum(self.batch_sizes)}, not "
                f"global_batch_size={self.global_batch_size}"
            )
        for rank, (b, replica) in enumerate(zip(self.batch_sizes, self.replicas, strict=True)):
            if replica.cap is not None and b > replica.cap:
                raise ValueError(
                    f"rank {rank} has batch size {b} above its cap {replica.cap}; plan "
                    "again, within the caps"
                )

    @property
    def world_size(self) -> int:
        """Number of replicas P."""
        return len(self.batch_sizes)

    @property
    def weights(self) -> tuple[float, ...]:
        """w_i = b_i / B for a full global batch."""
        return tuple(b / self.global_batch_size for b in self.batch_sizes)

    @property
    def idle_ranks(self) -> tuple[int, ...]:
        """Ranks with a zero share: they compute nothing and add zeros to the sync."""
        return tuple(rank for rank, b in enumerate(self.batch_sizes) if b == 0)

    @property
    def active_ranks(self) -> tuple[int, ...]:
        """Ranks with at least one sample per global batch."""
        return tuple(rank for rank, b in enumerate(self.batch_sizes) if b > 0)

    @property
    def predicted_step_times(self) -> tuple[float, ...]:
        """Predicted compute seconds per step for each rank: alpha_i + beta_i * b_i, 0 at b = 0."""
        return tuple(
            r.step_time(b) if b > 0 else 0.0
            for r, b in zip(self.replicas, self.batch_sizes, strict=True)
        )

    @property
    def predicted_compute_time(self) -> float:
        """Predicted compute seconds of one step: the slowest rank's."""
        return max(self.predicted_step_times)

    @property
    def predicted_comm_time(self) -> float:
        """Predicted seconds of one step's gradient sync; every rank takes part, idle or not."""
        return 0.0 if self.comm is None else self.comm.time(self.world_size)

    @property
    def predicted_step_time(self) -> float:
        """Predicted seconds of one synchronous step: slowest compute, then the sync."""
        return self.predicted_compute_time + self.predicted_comm_time

    @property
    def predicted_idle_times(self) -> tuple[float, ...]:
        """Predicted seconds each rank waits for the slowest one, per step."""
        slowest = self.predicted_compute_time
        return tuple(slowest - t for t in self.predicted_step_times)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; derived figures are included for readers, ignored on load."""
        return {
            "policy": self.policy,
            "global_batch_size": self.global_batch_size,
            "batch_sizes": list(self.batch_sizes),
            "min_batch": self.min_batch,
            "replicas": [r.to_dict() for r in self.replicas],
            "comm": None if self.comm is None else self.comm.to_dict(),
            "weights": list(self.weights),
            "predicted_step_times": list(self.predicted_step_times),
            "predicted_step_time": self.predicted_step_time,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BalancePlan:
        """Rebuild and re-validate a plan written by `to_dict`."""
        try:
            return cls(
                policy=data["policy"],
                global_batch_size=data["global_batch_size"],
                batch_sizes=tuple(data["batch_sizes"]),
                replicas=tuple(ReplicaSpeed(**r) for r in data["replicas"]),
                min_batch=data.get("min_batch", 1),
                comm=CommCost.from_dict(data["comm"]) if data.get("comm") else None,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"not a BalancePlan dict ({exc}); expected BalancePlan.to_dict()"
            ) from exc

    def to_json(self, indent: int | None = 2) -> str:
        """Serialise to JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> BalancePlan:
        """Parse JSON text written by `to_json`."""
        return cls.from_dict(json.loads(text))


def plan_batches(
    ranks: Sequence[object],
    global_batch_size: int,
    policy: str = "proportional",
    *,
    caps: Sequence[int | None] | None = None,
    min_batch: int = 0,
    comm: CommCost | None = None,
) -> BalancePlan:
    """Share a global batch of B samples among replicas of unequal speed.

    Args:
        ranks: one entry per replica: a throughput in samples/s, a ReplicaSpeed, or a
            profile record with `replica_speed()` (e.g. lbtrain.profiling.ReplicaProfile).
        global_batch_size: B, samples per global batch, at most MAX_GLOBAL_BATCH (2**53).
        policy: "equal" (B/P each, the unbalanced baseline), "proportional" (b_i proportional
            to throughput, largest-remainder rounding), or "cost" (minimise the slowest
            replica's alpha_i + beta_i * b_i).
        caps: optional per-replica maximum batch sizes (memory), combined with any cap the
            entries carry by taking the smaller.
        min_batch: smallest batch any replica gets. With 0, `cost` gives a replica no samples
            when its fixed cost alone would outlast the others' step; `equal` and
            `proportional` know no fixed cost and give every replica at least one sample.
        comm: one step's measured sync cost, carried into the plan's predictions.

    Returns:
        A validated BalancePlan whose batch sizes sum to B and honour caps and min_batch.

    Example:
        >>> plan_batches([100.0, 300.0], 8).batch_sizes
        (2, 6)
    """
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is unknown; choose one of {', '.join(POLICIES)}")
    ranks = listed("ranks", ranks, "throughputs or profiles, one per replica")
    min_batch = whole("min_batch", min_batch, low=0)
    global_batch_size = whole("global_batch_size", global_batch_size, low=1)
    if caps is not None:
        caps = [
            None if cap is None else whole(f"caps[{i}]", cap, low=1)
            for i, cap in enumerate(listed("caps", caps, "ints or None, one per replica"))
        ]
    if len(ranks) == 0:
        raise ValueError("ranks is empty: pass one throughput or profile per replica")
    replicas = [as_replica_speed(entry, i) for i, entry in enumerate(ranks)]
    floor = min_batch if policy == "cost" else max(1, min_batch)
    _check_global_batch(global_batch_size, len(replicas), floor, min_batch, policy)
    replicas = _merge_caps(replicas, caps)
    upper = _cap_bounds(replicas, global_batch_size, floor)
    sizes = _share(policy, replicas, global_batch_size, [floor] * len(replicas), upper)
    return BalancePlan(
        policy=policy,
        global_batch_size=global_batch_size,
        batch_sizes=tuple(sizes),
        replicas=tuple(replicas),
        min_batch=min_batch,
        comm=comm,
    )


def _check_global_batch(
    global_batch_size: int, count: int, floor: int, min_batch: int, policy: str
) -> None:
    """Refuse a global batch too large to share exactly or too small to give each its floor."""
    if global_batch_size > MAX_GLOBAL_BATCH:
        raise ValueError(
            f"global_batch_size={global_batch_size} is above 2**53 = {MAX_GLOBAL_BATCH:,}, the "
            "largest batch the planner shares exactly; pass a smaller global batch"
        )
    if global_batch_size < count * floor:
        raise ValueError(
            f"global_batch_size={global_batch_size} is smaller than {count} replicas x "
            f"{floor} (policy {policy!r} gives every replica at least "
            + (
                f"min_batch={min_batch}"
                if floor == min_batch
                else f"1, above min_batch={min_batch}"
            )
            + "); "
            f"raise the global batch to at least {count * floor} or use fewer replicas"
        )


def _cap_bounds(
    replicas: Sequence[ReplicaSpeed], global_batch_size: int, floor: int
) -> list[float]:
    """Each replica's upper bound (its cap, or inf), checked to hold the floor and together B."""
    upper = [math.inf if r.cap is None else r.cap for r in replicas]
    for i, cap in enumerate(upper):
        if cap < floor:
            raise ValueError(
                f"rank {i} has cap {cap} below min_batch={floor}; lower min_batch or "
                "give that replica more memory"
            )
    if sum(upper) < global_batch_size:
        raise ValueError(
            f"caps {[r.cap for r in replicas]} hold at most {int(sum(upper))} samples, fewer "
            f"than global_batch_size={global_batch_size}; lower the global batch or add replicas"
        )
    return upper


def _share(
    policy: str,
    replicas: Sequence[ReplicaSpeed],
    total: int,
    lower: Sequence[int],
    upper: Sequence[float],
) -> list[int]:
    """The integer batch sizes `policy` gives, between `lower` and `upper`, summing to total."""
    if policy == "cost":
        return cost_sizes(replicas, total, lower, upper)
    count = len(replicas)
    speeds = [1.0] * count if policy == "equal" else [r.throughput for r in replicas]
    # Proportional sharing is water-filling with no fixed cost: b_i = T * s_i.
    targets = water_fill(total, [0.0] * count, [1 / s for s in speeds], lower, upper)
    return largest_remainder(targets, total, lower, upper, tie_break=speeds)


def _plain(value: object) -> object:
    """A numpy (or other) integer as an int; anything else unchanged, for the checks."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        return int(value)
    return value


def cost_sizes(
    replicas: Sequence[ReplicaSpeed],
    total: int,
    lower: Sequence[int],
    upper: Sequence[float],
) -> list[int]:
    """Integer batches that minimise the slowest alpha_i + beta_i * b_i (0 s at b_i = 0)."""
    alphas = [r.alpha for r in replicas]
    betas = [r.beta for r in replicas]
    targets = water_fill(total, alphas, betas, lower, upper)
    return min_max_round(targets, total, alphas, betas, lower, upper)


def _merge_caps(
    replicas: list[ReplicaSpeed], caps: Sequence[int | None] | None
) -> list[ReplicaSpeed]:
    if caps is None:
        return replicas
    if len(caps) != len(replicas):
        raise ValueError(
            f"caps has {len(caps)} entries but ranks has {len(replicas)}; give one cap (or "
            "None) per replica"
        )
    merged = []
    for replica, cap in zip(replicas, caps, strict=True):
        if cap is not None and (replica.cap is None or cap < replica.cap):
            replica = ReplicaSpeed(replica.throughput, replica.alpha, replica.beta, cap)
        merged.append(replica)
    return merged
