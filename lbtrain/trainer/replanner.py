"""The re-planner's memory and its rule: switch on evidence, never on noise.

`Replanner.observe` takes each epoch's allgathered per-rank figures; every rank holds the
same memory and reaches the same decision (the trainer still takes rank 0's). Its state is
plain values, checkpointed, so a resumed run decides what an uninterrupted one decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lbtrain.balancer import BalancePlan
from lbtrain.logs import logger
from lbtrain.trainer.replan import Replan, propose

__all__ = ["CHANGE", "MIN_EPOCHS", "REPLAN_GAIN", "Replanner", "SIGMAS"]


# A rank's factor this far from its segment's mean (relative) is a change, not noise: the
# epoch waits for a second one that agrees before it counts.
CHANGE = 0.25
# The gain must beat this many standard errors of the measured rates.
SIGMAS = 3.0
# The smallest predicted gain worth a switch: a switch moves no data and keeps the update
# exact, so a small gain is worth it once the measurements show it is real.
REPLAN_GAIN = 0.02
# Epochs of one segment needed before a switch: one epoch cannot tell its noise.
MIN_EPOCHS = 2
# Epochs of one segment kept for its statistics.
WINDOW = 8
# Two epochs cannot tell their noise: each rank's spread starts from this prior (one
# pseudo-epoch 5% off), which the measured epochs outweigh as they come.
PRIOR_SPREAD = 0.05


def _factors(measured: Sequence[Mapping[str, float]]) -> list[float | None]:
    """Per rank, measured / predicted compute of one epoch (None where nothing ran)."""
    factors: list[float | None] = []
    for entry in measured:
        predicted, compute = entry.get("predicted", 0.0), entry.get("compute", 0.0)
        ok = entry.get("samples", 0) > 0 and predicted > 0 and compute > 0
        factors.append(compute / predicted if ok and math.isfinite(compute / predicted) else None)
    return factors


def _relative(measured: Sequence[Mapping[str, float]]) -> list[float | None]:
    """Per rank, its factor over the mean of the ranks that ran that epoch: what a plan can
    act on, free of a slowdown common to all."""
    factors = _factors(measured)
    working = [f for f in factors if f is not None]
    if not working:
        return factors
    mean = sum(working) / len(working)
    return [None if f is None else f / mean for f in factors]


def _versus_others(measured: Sequence[Mapping[str, float]]) -> list[float | None]:
    """Per rank, its factor over the mean of the other ranks that ran that epoch (1 for a
    rank alone): a change on one rank shows in full, even among two."""
    factors = _factors(measured)
    total = sum(f for f in factors if f is not None)
    count = sum(1 for f in factors if f is not None)
    relative: list[float | None] = []
    for f in factors:
        others = count - 1
        relative.append(None if f is None else 1.0 if others == 0 else f / ((total - f) / others))
    return relative


def _pooled(epochs: Sequence[Sequence[Mapping[str, float]]]) -> list[dict[str, float]]:
    """Per rank, the sums of several epochs' measurements (as one long epoch)."""
    keys = ("compute", "predicted", "samples", "steps", "comm")
    return [
        {k: sum(epoch[rank].get(k, 0.0) for epoch in epochs) for k in keys}
        for rank in range(len(epochs[-1]))
    ]


def _shown(values: Sequence[float | None]) -> str:
    return "[" + ", ".join("-" if v is None else f"{v:.3f}" for v in values) + "]"


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _agree(a: Sequence[float | None], b: Sequence[float | None]) -> bool:
    return all(
        x is None or y is None or abs(x - y) <= CHANGE * max(x, y)
        for x, y in zip(a, b, strict=True)
    )


class Replanner:
    """Decides at each epoch's end whether what was measured justifies another plan.

    It switches on evidence, never on noise. The epochs since the last switch form a
    segment; each rank's measured/predicted factor, relative to the other ranks' (a drift
    common to all changes no share), gives its mean and standard error over the segment.
    With two epochs or more, it moves when a plan still gains more than `threshold` with
    every rank's rate pulled `SIGMAS` standard errors toward the others', and then to the
    plan of the best estimate: jitter of +-10% on fixed speeds never switches. An epoch
    whose rates jump by more than `CHANGE` waits for a second that agrees; the two then
    start a new segment, so a device that turned 4x slower is followed after the two epochs
    that measured it. `state_dict` carries all of it, so a resumed run decides what the
    uninterrupted run decides.
    """

    def __init__(self, threshold: float = REPLAN_GAIN) -> None:
        self.threshold = threshold
        self.segment: list[list[dict[str, float]]] = []
        self.pending: list[dict[str, float]] | None = None
        self.anchor: list[dict[str, float]] | None = None
        self.switches = 0

    def observe(self, plan: BalancePlan, measured: Sequence[Mapping[str, float]]) -> Replan | None:
        """Add one epoch's per-rank figures (every rank's, allgathered); a switch or None."""
        if plan.policy == "equal" or len(measured) != plan.world_size:
            return None
        epoch = [dict(entry) for entry in measured]
        logger.debug("re-planner: factors %s; segment of %d epoch(s)",
                     _shown(_factors(epoch)), len(self.segment))  # fmt: skip
        if self._changed(epoch):
            if self.pending is None or not self._same_change(self.pending, epoch):
                logger.debug("re-planner: rates jumped more than %d%%; waiting for a second "
                             "epoch that agrees", round(100 * CHANGE))  # fmt: skip
                self.pending = epoch
                return None
            self.segment, self.anchor = [self.pending], None  # the old rates are gone
        self.pending = None
        self.segment = [*self.segment, epoch][-WINDOW:]
        return self._decide(plan)

    def _changed(self, epoch: list[dict[str, float]]) -> bool:
        if not self.segment:
            return False
        means = self._means(_versus_others)
        return not _agree(means, _versus_others(epoch))

    def _same_change(self, first: list[dict[str, float]], second: list[dict[str, float]]) -> bool:
        """Whether two epochs that left the segment moved the same way on every rank (their
        sizes may differ: a loaded machine adds its own noise to a real change)."""
        means = self._means(_versus_others)
        for mean, a, b in zip(means, _versus_others(first), _versus_others(second), strict=True):
            if mean is None or a is None or b is None:
                continue
            da, db = a / mean - 1, b / mean - 1
            if max(abs(da), abs(db)) > CHANGE and not (
                da * db > 0 and min(abs(da), abs(db)) > CHANGE / 2
            ):
                return False
        return True

    def _means(self, relative: Callable[..., list[float | None]]) -> list[float | None]:
        """Each rank's mean relative rate over the segment."""
        columns = zip(*(relative(epoch) for epoch in self.segment), strict=True)
        return [_mean(column) for column in columns]

    def _shrunk(self) -> list[dict[str, float]]:
        """The segment's pooled figures, each rank's rate pulled toward the others' by
        SIGMAS standard errors of its own: what is left is the evidence, not the noise.

        Rates are compared relative to each epoch's mean over the ranks: a machine that
        slows every rank alike changes no share, so only what differs between ranks counts.
        """
        pooled = _pooled(self.segment)
        columns = list(zip(*(_relative(epoch) for epoch in self.segment), strict=True))
        absolute = [f for epoch in self.segment for f in _factors(epoch) if f is not None]
        if not absolute:
            return pooled
        centre = sum(absolute) / len(absolute)
        for entry, column in zip(pooled, columns, strict=True):
            values = [v for v in column if v is not None]
            if not values:
                continue
            mean = sum(values) / len(values)
            spread = sum((v / mean - 1) ** 2 for v in values) + PRIOR_SPREAD**2
            error = mean * math.sqrt(spread / len(values)) / math.sqrt(len(values))
            gap = mean - 1
            shrunk = 1 + math.copysign(max(0.0, abs(gap) - SIGMAS * error), gap)
            entry["compute"] = entry["predicted"] * centre * shrunk
        return pooled

    def _decide(self, plan: BalancePlan) -> Replan | None:
        if len(self.segment) < MIN_EPOCHS:
            return None
        previous = _pooled([self.anchor]) if self.anchor is not None else None
        # The evidence decides whether to move; the best estimate decides where to.
        if propose(plan, self._shrunk(), threshold=self.threshold, previous=previous) is None:
            logger.debug(
                "re-planner: no plan beats %d%% once each rate is pulled %g standard errors "
                "toward the others'",
                round(100 * self.threshold),
                SIGMAS,
            )
            return None
        pooled = _pooled(self.segment)
        change = propose(plan, pooled, threshold=self.threshold, previous=previous)
        if change is None:
            return None
        self.anchor, self.segment = pooled, []
        self.switches += 1
        return change

    def state_dict(self) -> dict[str, Any]:
        """Everything it remembers, as plain values (for checkpoints)."""
        return {
            "segment": self.segment,
            "pending": self.pending,
            "anchor": self.anchor,
            "switches": self.switches,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state_dict()`'s values."""
        self.segment = [list(epoch) for epoch in state.get("segment", [])]
        self.pending = state.get("pending")
        self.anchor = state.get("anchor")
        self.switches = int(state.get("switches", 0))
