"""Pure-Python load balancer: per-replica batch sizes from measured speeds.

Imports neither torch nor mpi4py, so the arithmetic is testable anywhere.
"""

from lbtrain.balancer.plan import POLICIES, BalancePlan, plan_batches
from lbtrain.balancer.replica import ReplicaSpeed, SupportsReplicaSpeed, as_replica_speed

__all__ = [
    "POLICIES",
    "BalancePlan",
    "ReplicaSpeed",
    "SupportsReplicaSpeed",
    "as_replica_speed",
    "plan_batches",
]
