"""Pure-Python load balancer: per-replica batch sizes from measured speeds.

Imports neither torch nor mpi4py, so the arithmetic is testable anywhere.
"""

from lbtrain.balancer.advice import (
    WORTHWHILE,
    Ideal,
    SubsetPrediction,
    ideal_step,
    idle_ranks_note,
    min_batch_note,
    subset_note,
    subset_predictions,
)
from lbtrain.balancer.network import CommCost
from lbtrain.balancer.plan import (
    MAX_GLOBAL_BATCH,
    POLICIES,
    BalancePlan,
    cost_sizes,
    plan_batches,
)
from lbtrain.balancer.replica import ReplicaSpeed, SupportsReplicaSpeed, as_replica_speed

__all__ = [
    "MAX_GLOBAL_BATCH",
    "POLICIES",
    "WORTHWHILE",
    "BalancePlan",
    "CommCost",
    "Ideal",
    "ReplicaSpeed",
    "SubsetPrediction",
    "SupportsReplicaSpeed",
    "as_replica_speed",
    "cost_sizes",
    "ideal_step",
    "idle_ranks_note",
    "min_batch_note",
    "plan_batches",
    "subset_note",
    "subset_predictions",
]
