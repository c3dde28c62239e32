"""The fastest part of a cluster: which whole entries are worth their place.

Every device takes part in the gradient sync, even one the plan gives no samples, so a slow
entry can cost more in sync than it saves in compute. `best_entries` predicts every subset of
the cluster's entries (each kept whole or left out) and returns the fastest. To ask whether a
fifth GPU is worth it, write it as its own entry: ``"4x h100, 1x h100"``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from lbtrain.whatif.cluster import Cluster, Network
from lbtrain.whatif.predict import Prediction, SpeedModel, predict

__all__ = ["MAX_ENTRIES", "Subset", "best_entries"]

MAX_ENTRIES = 10  # 1,023 subsets, each predicted in milliseconds


@dataclass(frozen=True)
class Subset:
    """The entries kept (indices into the cluster's groups) and their prediction."""

    kept: tuple[int, ...]
    cluster: Cluster
    prediction: Prediction


def best_entries(
    cluster: Cluster,
    network: Network,
    speeds: Mapping[str, SpeedModel],
    global_batch: int,
    policy: str = "cost",
    gradient_bytes: int = 0,
    min_batch: int = 0,
    caps: Mapping[str, float] | None = None,
) -> Subset:
    """The subset of whole entries with the shortest predicted step (the whole cluster on a
    tie, then the subset with more entries). Subsets too small for the global batch under
    the policy are skipped. Raises ValueError beyond `MAX_ENTRIES` entries."""
    groups = cluster.groups
    if len(groups) > MAX_ENTRIES:
        raise ValueError(
            f"the best subset of entries searches {2 ** len(groups) - 1:,} subsets of "
            f"{len(groups)} entries; merge entries of the same device to at most {MAX_ENTRIES}"
        )
    best: Subset | None = None
    for size in range(len(groups), 0, -1):
        for kept in itertools.combinations(range(len(groups)), size):
            part = Cluster(tuple(groups[i] for i in kept))
            try:
                result = predict(part, network, speeds, global_batch, policy, gradient_bytes,
                                 min_batch, caps)  # fmt: skip
            except ValueError:  # too few devices (or too little memory) for the batch
                continue
            # Strictly faster only: the larger subset (and the whole) wins a tie.
            if best is None or result.step < best.prediction.step * (1 - 1e-12):
                best = Subset(kept, part, result)
    if best is None:
        raise ValueError("no subset of the cluster's entries can take the global batch")
    return best
