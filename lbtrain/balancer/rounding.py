"""Continuous water-filling and the integer rounding that follows it."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

__all__ = ["water_fill", "largest_remainder", "min_max_round"]

# Bisection on the finishing time runs until lo and hi are adjacent doubles, so T* is exact
# to the last bit (the ideal step must never read above a plan that reaches it); 200
# halvings of a double always get there.
_BISECTION_STEPS = 200


def water_fill(
    total: int,
    alphas: Sequence[float],
    betas: Sequence[float],
    lower: Sequence[int],
    upper: Sequence[float],
) -> list[float]:
    """Continuous shares that put every unclipped replica on one finishing time.

    Solves sum_i clip((T - alpha_i) / beta_i, lower_i, upper_i) = total for T. The left side
    is continuous and non-decreasing in T, so bisection finds it; clipped replicas are fixed
    at their bound and the rest share one T, which is the water-filling optimum.

    Args:
        total: samples to share out; sum(lower) <= total <= sum(upper).
        alphas, betas: per-replica step-time model t(b) = alpha + beta * b.
        lower, upper: per-replica bounds (upper may be math.inf).

    Returns:
        Real-valued shares summing to `total` (to float precision).
    """

    # No share can exceed the total (every lower bound is >= 0): the cap also keeps a replica
    # that is 1e300 times faster than another from reaching infinity.
    def shares(finish: float) -> list[float]:
        return [
            min(upper[i], total, max(lower[i], (finish - alphas[i]) / betas[i]))
            for i in range(len(alphas))
        ]

    lo = min(a + b * low for a, b, low in zip(alphas, betas, lower, strict=True))
    hi = max(a + b * total for a, b in zip(alphas, betas, strict=True))
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if sum(shares(mid)) < total:
            lo = mid
        else:
            hi = mid
    high = shares(hi)
    excess = sum(high) - total
    if abs(excess) <= 0.5:
        return high
    # Speeds so far apart that one ulp of T moves a share by many samples: the total lies
    # between the shares at two adjacent finishing times, so interpolate between them (each
    # share stays within its own two values, hence within its bounds).
    low = shares(lo)
    gap = sum(high) - sum(low)
    fraction = (total - sum(low)) / gap if gap > 0 else 1.0
    return [a + fraction * (b - a) for a, b in zip(low, high, strict=True)]


def largest_remainder(
    targets: Sequence[float],
    total: int,
    lower: Sequence[int],
    upper: Sequence[float],
    tie_break: Sequence[float] | None = None,
) -> list[int]:
    """Round real `targets` to integers summing to `total` by largest remainder.

    Each replica first gets floor(target) clamped to its bounds; the samples still missing go
    one at a time to the largest fractional parts (ties: larger `tie_break`, then lower index).
    No replica's leftover is dumped on a single replica.
    """
    count = len(targets)
    keys = tie_break if tie_break is not None else [0.0] * count
    sizes = [int(min(upper[i], max(lower[i], math.floor(targets[i] + 1e-9)))) for i in range(count)]
    missing = total - sum(sizes)
    order = sorted(
        range(count), key=lambda i: (-(targets[i] - math.floor(targets[i] + 1e-9)), -keys[i], i)
    )
    while missing > 0:
        progressed = False
        for i in order:
            if missing == 0:
                break
            if sizes[i] < upper[i]:
                sizes[i] += 1
                missing -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"cannot place {missing} more samples: every replica is at its cap")
    while missing < 0:
        # Float noise can only overshoot by a sample or two; take them back from the
        # smallest fractional parts.
        progressed = False
        for i in reversed(order):
            if missing == 0:
                break
            if sizes[i] > lower[i]:
                sizes[i] -= 1
                missing += 1
                progressed = True
        if not progressed:
            raise ValueError(f"cannot remove {-missing} samples: every replica is at its minimum")
    return sizes


def min_max_round(
    targets: Sequence[float],
    total: int,
    alphas: Sequence[float],
    betas: Sequence[float],
    lower: Sequence[int],
    upper: Sequence[float],
) -> list[int]:
    """Round to integers summing to `total` while minimising the slowest step time.

    Start from floor(target) and hand out each remaining sample to the replica whose step
    would finish earliest with it. Given continuous water-filling targets this is the exact
    integer optimum of max_i alpha_i + beta_i * b_i: any feasible integer plan must fill at
    least as many slots, and greedy fills the cheapest ones.
    """
    count = len(targets)
    sizes = [int(min(upper[i], max(lower[i], math.floor(targets[i] - 1e-9)))) for i in range(count)]
    heap = [(alphas[i] + betas[i] * (sizes[i] + 1), i) for i in range(count) if sizes[i] < upper[i]]
    heapq.heapify(heap)
    missing = total - sum(sizes)
    while missing < 0:
        # Float noise in the targets: take samples back from the slowest replicas.
        slowest = max(
            (i for i in range(count) if sizes[i] > lower[i]),
            key=lambda i: alphas[i] + betas[i] * sizes[i],
            default=None,
        )
        if slowest is None:
            raise ValueError(f"cannot remove {-missing} samples: every replica is at its minimum")
        sizes[slowest] -= 1
        missing += 1
        heap = [
            (alphas[i] + betas[i] * (sizes[i] + 1), i) for i in range(count) if sizes[i] < upper[i]
        ]
        heapq.heapify(heap)
    while missing > 0:
        if not heap:
            raise ValueError(f"cannot place {missing} more samples: every replica is at its cap")
        _, i = heapq.heappop(heap)
        sizes[i] += 1
        missing -= 1
        if sizes[i] < upper[i]:
            heapq.heappush(heap, (alphas[i] + betas[i] * (sizes[i] + 1), i))
    return sizes
