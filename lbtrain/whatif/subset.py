"""The fastest part of a cluster: how many devices of each entry are worth their place.

Every device takes part in the gradient sync, even one the plan gives no samples, so a slow
entry, or the device that opens a new node, can cost more in sync than it saves in compute.
`best_subset` predicts candidate counts of every entry and returns the fastest: for each
entry none, all, the powers of two and the whole nodes (1, 2, 4, ... nodes) below its
count, since the sync changes most where a node fills or a new one opens. With few
combinations every one is predicted; with many, one entry at a time is improved until none
improves (coordinate descent, which may stop short of the best).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from lbtrain.whatif.cluster import Cluster, DeviceGroup, Network
from lbtrain.whatif.predict import Prediction, SpeedModel, predict

__all__ = ["EXHAUSTIVE", "Subset", "best_subset"]

EXHAUSTIVE = 4096  # combinations predicted one by one (milliseconds each); beyond, descent


@dataclass(frozen=True)
class Subset:
    """The devices kept of each entry (0: left out) and their prediction."""

    counts: tuple[int, ...]
    cluster: Cluster
    prediction: Prediction


def _candidates(group: DeviceGroup) -> list[int]:
    """Counts worth trying for one entry: none, all, powers of two, whole nodes."""
    n, per_node = group.count, group.per_node
    counts = {0, n}
    counts |= {1 << k for k in range(n.bit_length()) if 1 << k <= n}
    counts |= {per_node << k for k in range(n.bit_length()) if per_node << k <= n}
    return sorted(counts)


def best_subset(
    cluster: Cluster,
    network: Network,
    speeds: Mapping[str, SpeedModel],
    global_batch: int,
    policy: str = "cost",
    gradient_bytes: int = 0,
    min_batch: int = 0,
    caps: Mapping[str, float] | None = None,
) -> Subset:
    """The candidate counts with the shortest predicted step; on a tie, the one with more
    devices (the whole cluster first). Counts too small for the global batch under the
    policy, or for the devices' memory, are skipped."""

    @functools.cache  # the descent visits a count again, and the main loop after it
    def step(counts: tuple[int, ...]) -> tuple[float, Prediction | None]:
        if not any(counts):
            return math.inf, None
        try:
            result = predict(cluster.with_counts(counts), network, speeds, global_batch, policy,
                             gradient_bytes, min_batch, caps)  # fmt: skip
        except ValueError:  # too few devices, or too little memory, for the batch
            return math.inf, None
        return result.step, result

    options = [_candidates(g) for g in cluster.groups]
    whole = tuple(g.count for g in cluster.groups)
    best, (best_step, best_result) = whole, step(whole)

    def better(counts: tuple[int, ...], value: float) -> bool:
        # Strictly faster, or as fast with more devices (a tie keeps the larger cluster).
        if value < best_step * (1 - 1e-12):
            return True
        return value <= best_step * (1 + 1e-12) and sum(counts) > sum(best)

    if math.prod(len(o) for o in options) <= EXHAUSTIVE:
        trials = itertools.product(*options)
    else:
        trials = _descent(options, whole, step)
    for counts in trials:
        value, result = step(counts)
        if result is not None and better(counts, value):
            best, best_step, best_result = counts, value, result
    if best_result is None:
        raise ValueError("no subset of the cluster's devices can take the global batch")
    return Subset(best, cluster.with_counts(best), best_result)


def _descent(options, start, step):  # noqa: ANN001, ANN202
    """Counts visited by coordinate descent from `start`: one entry at a time, to its best
    candidate with the others held, until a pass changes nothing (at most 5 passes)."""
    current = tuple(start)
    for _ in range(5):
        moved = False
        for i, candidates in enumerate(options):
            trial_best, trial_step = current, step(current)[0]
            for c in candidates:
                trial = (*current[:i], c, *current[i + 1 :])
                yield trial
                value = step(trial)[0]
                if value < trial_step * (1 - 1e-12):
                    trial_best, trial_step = trial, value
            moved |= trial_best != current
            current = trial_best
        if not moved:
            return
