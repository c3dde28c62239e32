"""`plan_batches` for groups of identical devices, in time independent of the group sizes.

The balancer plans one share per rank: 4 s for 100,000 ranks here. Devices of one group
are identical, so the balancer gives them the same continuous share and, after rounding,
two neighbouring integers. This module computes the same thing per group:

- the continuous shares: `water_fill` over groups, a group of n devices being one device of
  ``beta / n`` with bounds ``n x lower`` (``n clip((T - a) / b, l, u) = clip((T - a) /
  (b / n), n l, n u)``);
- ``equal``/``proportional``: the balancer's largest remainder, whose order (fraction, then
  speed, then rank) keeps a group's devices together;
- ``cost``: the balancer's greedy min-max rounding (each sample to the device that would
  finish it first), moving a whole group up one sample at a time.

The step (the slowest device) equals `plan_batches`'s exactly; under ``cost``, devices of
different groups with equal finishing times may hold the extra samples in another order.
Caps (the most samples a device of a group holds, from its memory) bound each device, as
`plan_batches`'s `caps` do.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from lbtrain.balancer.plan import MAX_GLOBAL_BATCH, POLICIES
from lbtrain.balancer.rounding import water_fill

__all__ = ["GroupShare", "grouped_plan"]


@dataclass(frozen=True)
class GroupShare:
    """`count - extra` devices of a group take `base` samples, `extra` take `base + 1`."""

    count: int
    base: int
    extra: int

    @property
    def batch_min(self) -> int:
        """Smallest share in the group."""
        return self.base + 1 if self.extra == self.count else self.base

    @property
    def batch_max(self) -> int:
        """Largest share in the group."""
        return self.base + 1 if self.extra else self.base

    @property
    def samples(self) -> int:
        """Samples of the whole group."""
        return self.count * self.base + self.extra


def grouped_plan(
    counts: Sequence[int],
    alphas: Sequence[float],
    betas: Sequence[float],
    total: int,
    policy: str = "cost",
    min_batch: int = 0,
    caps: Sequence[float] | None = None,
) -> list[GroupShare]:
    """Each group's shares of `total` samples, as `plan_batches` would give its devices;
    `caps` bound each device of a group (math.inf: no cap)."""
    caps = [math.inf] * len(counts) if caps is None else list(caps)
    _check(counts, total, policy, min_batch, caps)
    floor = min_batch if policy == "cost" else max(1, min_batch)
    if policy == "cost":
        group_alphas, speeds = list(alphas), [1 / b for b in betas]
    else:
        group_alphas = [0.0] * len(counts)
        speeds = [1.0] * len(counts) if policy == "equal" else [1 / b for b in betas]
    shares = water_fill(
        total,
        group_alphas,
        [1 / (s * n) for s, n in zip(speeds, counts, strict=True)],
        [n * floor for n in counts],
        [n * cap for n, cap in zip(counts, caps, strict=True)],
    )
    targets = [x / n for x, n in zip(shares, counts, strict=True)]
    if policy == "cost":
        return _min_max(targets, counts, alphas, betas, total, floor, caps)
    return _largest_remainder(targets, counts, speeds, total, floor, caps)


def _check(
    counts: Sequence[int], total: int, policy: str, min_batch: int, caps: Sequence[float]
) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is unknown; choose one of {', '.join(POLICIES)}")
    if not counts or min(counts) < 1:
        raise ValueError("every device group needs at least one device")
    if not 1 <= total <= MAX_GLOBAL_BATCH:
        raise ValueError(f"global batch {total} must be between 1 and 2**53")
    floor = min_batch if policy == "cost" else max(1, min_batch)
    if total < sum(counts) * floor:
        raise ValueError(
            f"global batch {total:,} is smaller than {sum(counts):,} devices x {floor} (the "
            f"least policy {policy!r} gives each with min_batch={min_batch}); raise it to at "
            f"least {sum(counts) * floor:,} or use fewer devices"
        )
    if any(cap < floor for cap in caps):
        raise ValueError(
            f"a device's memory holds fewer samples than the {floor} policy {policy!r} gives "
            "each: lower --min-batch, or leave that device out"
        )
    room = sum(n * cap for n, cap in zip(counts, caps, strict=True))
    if total > room:
        raise ValueError(
            f"global batch {total:,} does not fit the devices' memory, which holds at most "
            f"{int(room):,} samples a step; lower the global batch or add devices"
        )


def _largest_remainder(
    targets: list[float],
    counts: Sequence[int],
    speeds: list[float],
    total: int,
    floor: int,
    caps: Sequence[float],
) -> list[GroupShare]:
    bases = [
        min(cap, max(floor, math.floor(t + 1e-9))) for t, cap in zip(targets, caps, strict=True)
    ]
    missing = total - sum(n * b for n, b in zip(counts, bases, strict=True))
    # The balancer's order: larger fraction, then faster, then lower rank (group order).
    # Fractions are rounded: a group's target x / n carries noise that a rank's lacks.
    fractions = [round(t - math.floor(t + 1e-9), 9) for t in targets]
    order = sorted(range(len(counts)), key=lambda g: (-fractions[g], -speeds[g], g))
    extras = [0] * len(counts)
    for g in order if missing > 0 else ():
        if bases[g] + 1 > caps[g]:  # a group at its cap takes no extra sample
            continue
        extras[g] = min(counts[g], missing)
        missing -= extras[g]
    for g in reversed(order) if missing < 0 else ():  # float noise: take back the last ones
        take = min(counts[g], -missing)
        bases[g], extras[g] = bases[g] - 1, counts[g] - take
        missing += take
    return [GroupShare(n, b, e) for n, b, e in zip(counts, bases, extras, strict=True)]


def _min_max(
    targets: list[float],
    counts: Sequence[int],
    alphas: Sequence[float],
    betas: Sequence[float],
    total: int,
    floor: int,
    caps: Sequence[float],
) -> list[GroupShare]:
    bases = [
        min(cap, max(floor, math.floor(t - 1e-9))) for t, cap in zip(targets, caps, strict=True)
    ]
    missing = total - sum(n * b for n, b in zip(counts, bases, strict=True))
    while missing < 0:  # float noise: the slowest group gives a sample back on each device
        g = max((g for g in range(len(counts)) if bases[g] > floor),
                key=lambda g: alphas[g] + betas[g] * bases[g])  # fmt: skip
        bases[g] -= 1
        missing += counts[g]
    extras = [0] * len(counts)
    # One heap entry per group: the time its devices would finish with one more sample.
    heap = [
        (alphas[g] + betas[g] * (bases[g] + 1), g)
        for g in range(len(counts))
        if bases[g] + 1 <= caps[g]
    ]
    heapq.heapify(heap)
    while missing > 0:
        _, g = heapq.heappop(heap)
        extras[g] = min(counts[g], missing)
        missing -= extras[g]
        if extras[g] == counts[g]:  # the whole group moved up: it competes again
            bases[g], extras[g] = bases[g] + 1, 0
            if bases[g] + 1 <= caps[g]:
                heapq.heappush(heap, (alphas[g] + betas[g] * (bases[g] + 1), g))
    return [GroupShare(n, b, e) for n, b, e in zip(counts, bases, extras, strict=True)]
