"""Launching fewer ranks: the predicted step of the fastest k ranks, and the best k.

`subset_predictions` plans every k (P water-fills over up to P ranks each: O(P^2) work).
`best_subset` finds the same best k while planning only a few: a cheap lower bound on every
k's step (the continuous water-filling optimum, swept over k in O(P log P)) rules out each k
that cannot beat the best planned so far, and the k it cannot rule out are planned exactly as
`subset_predictions` plans them, so the winner and its figures are the same.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from lbtrain.balancer.network import CommCost
from lbtrain.balancer.plan import cost_sizes
from lbtrain.balancer.replica import ReplicaSpeed

__all__ = ["SubsetPrediction", "best_subset", "subset_predictions"]

# Relative slack taken off each lower bound for float noise in its running sums; the sums
# are of at most a few times P terms, so their rounding error is far below this.
_BOUND_SLACK = 1e-9


@dataclass(frozen=True)
class SubsetPrediction:
    """The predicted step of launching only `ranks`, planned by the cost model."""

    ranks: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    compute: float
    comm: float

    @property
    def step(self) -> float:
        """Predicted seconds per step."""
        return self.compute + self.comm


def subset_predictions(
    replicas: Sequence[ReplicaSpeed], total: int, comm: CommCost | None = None
) -> list[SubsetPrediction]:
    """Predicted steps of launching the fastest P, P - 1, ..., 1 ranks (slowest dropped first).

    Ranks are ranked by their step at an equal share B / P. A subset whose caps cannot hold
    B ends the list.
    """
    order = _speed_order(replicas, total)
    predictions = []
    for k in range(len(replicas), 0, -1):
        if not _holds(replicas, order[:k], total):
            break
        predictions.append(_predict(replicas, order, k, total, comm))
    return predictions


def best_subset(
    replicas: Sequence[ReplicaSpeed], total: int, comm: CommCost | None = None
) -> SubsetPrediction | None:
    """min(subset_predictions(...), key=(step, -ranks)) without planning every subset.

    Every k whose lower bound lies above the best step planned so far is skipped: its step
    cannot be smaller, nor equal (which would favour it if it had more ranks). The k are
    tried from the smallest bound up, so the first few planned usually settle it.
    """
    order = _speed_order(replicas, total)
    bounds = _compute_bounds(replicas, order, total)
    candidates = sorted(
        (bound + (0.0 if comm is None else comm.time(k)), -k)
        for k, bound in enumerate(bounds, start=1)
        if math.isfinite(bound)
    )
    best: SubsetPrediction | None = None
    for bound, negative in candidates:
        if best is not None and bound > best.step:
            break  # the rest are bounded above this too: sorted by bound
        prediction = _predict(replicas, order, -negative, total, comm)
        # The old order: the smaller step, then (a tie) the larger subset.
        if best is None or (prediction.step, negative) < (best.step, -len(best.ranks)):
            best = prediction
    return best


def _speed_order(replicas: Sequence[ReplicaSpeed], total: int) -> list[int]:
    """Ranks from fastest to slowest at an equal share B / P (ties: lower rank first)."""
    equal = total / len(replicas)
    return sorted(range(len(replicas)), key=lambda i: (replicas[i].step_time(equal), i))


def _holds(replicas: Sequence[ReplicaSpeed], ranks: Sequence[int], total: int) -> bool:
    """Whether the caps of `ranks` hold `total` samples (ints sum exactly)."""
    return sum(math.inf if replicas[i].cap is None else replicas[i].cap for i in ranks) >= total


def _predict(
    replicas: Sequence[ReplicaSpeed],
    order: Sequence[int],
    k: int,
    total: int,
    comm: CommCost | None,
) -> SubsetPrediction:
    """The cost plan of the fastest k ranks, launched alone."""
    keep = sorted(order[:k])
    chosen = [replicas[i] for i in keep]
    upper = [math.inf if r.cap is None else r.cap for r in chosen]
    sizes = cost_sizes(chosen, total, [0] * k, upper)
    compute = max(r.step_time(b) for r, b in zip(chosen, sizes, strict=True) if b > 0)
    sync = 0.0 if comm is None else comm.time(k)
    return SubsetPrediction(tuple(keep), tuple(sizes), compute, sync)


def _compute_bounds(
    replicas: Sequence[ReplicaSpeed], order: Sequence[int], total: int
) -> list[float]:
    """A lower bound on the compute of every plan of the fastest k ranks, k = 1..P.

    The bound is T*_k, the root of F_k(T) = sum_i clip((T - alpha_i) / beta_i, 0, cap_i) = B
    over those ranks (math.inf where their caps cannot hold B): any integer plan's slowest
    rank takes at least T*_k. Adding a rank only raises F, so T*_k never rises with k, and
    each rank moves at most twice as T falls: from full (at its cap) to filling, and from
    filling to empty (T below its fixed cost). Filling ranks contribute T * sum(1 / beta) -
    sum(alpha / beta), kept as running sums; heaps give the next rank to move.
    """
    slope = offset = 0.0  # sums of 1 / beta and alpha / beta over the filling ranks
    filling = 0  # how many ranks are filling (the sums are reset exactly at none)
    full = 0  # sum of the caps of the full ranks: an int, exact
    # Sums of every term ever added to `slope` and `offset`: their rounding error is a few
    # ulps of these per term, which the slack below scales into seconds.
    slope_size = offset_size = 0.0
    full_heap: list[tuple[float, int]] = []  # (-(alpha + beta * cap), rank): leaves first
    fill_heap: list[tuple[float, int]] = []  # (-alpha, rank): empties first
    finish = math.inf
    bounds = []
    for rank in order:
        replica = replicas[rank]
        if finish <= replica.alpha:
            pass  # its fixed cost is past the finish, which only falls: never gets samples
        elif replica.cap is not None and replica.alpha + replica.beta * replica.cap <= finish:
            full += replica.cap
            heapq.heappush(full_heap, (-(replica.alpha + replica.beta * replica.cap), rank))
        else:
            slope, offset, filling = slope + 1 / replica.beta, offset + _ratio(replica), filling + 1
            slope_size, offset_size = slope_size + 1 / replica.beta, offset_size + _ratio(replica)
            heapq.heappush(fill_heap, (-replica.alpha, rank))
        while True:
            if filling == 0:
                slope = offset = 0.0
                root = math.inf if full < total else -math.inf
            else:
                root = (total - full + offset) / slope
            edge = max(-full_heap[0][0] if full_heap else -math.inf,
                       -fill_heap[0][0] if fill_heap else -math.inf)  # fmt: skip
            if root >= edge:
                finish = root
                break
            finish = edge  # F(edge) >= B already: the root lies below, move the next rank
            if full_heap and -full_heap[0][0] == edge:
                moved = heapq.heappop(full_heap)[1]
                mover = replicas[moved]
                full -= mover.cap
                slope, offset, filling = slope + 1 / mover.beta, offset + _ratio(mover), filling + 1
                slope_size, offset_size = slope_size + 1 / mover.beta, offset_size + _ratio(mover)
                heapq.heappush(fill_heap, (-mover.alpha, moved))
            else:
                mover = replicas[heapq.heappop(fill_heap)[1]]
                slope, offset, filling = slope - 1 / mover.beta, offset - _ratio(mover), filling - 1
        bounds.append(_slackened(finish, total, filling, slope, slope_size, offset_size))
    return bounds


def _slackened(
    finish: float, total: int, filling: int, slope: float, slope_size: float, offset_size: float
) -> float:
    """`finish` less the slack for float noise in the running sums (inf: caps cannot hold B)."""
    if not math.isfinite(finish):
        return math.inf  # these caps cannot hold B
    noise = abs(finish)
    if filling:
        noise += (abs(finish) * slope_size + offset_size + total) / slope
    return finish - _BOUND_SLACK * noise


def _ratio(replica: ReplicaSpeed) -> float:
    """alpha / beta: the samples' worth of time a rank's fixed cost takes."""
    return replica.alpha / replica.beta
