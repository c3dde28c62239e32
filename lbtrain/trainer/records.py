"""What a run measures: one epoch's record, and per-rank running totals for the summary.

Records stream to metrics.jsonl as they close; only running totals stay in memory and in
checkpoints, so a run of 40,000 epochs holds as much as one of 4.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EpochRecord", "Totals"]


@dataclass
class EpochRecord:
    """One epoch as this rank saw it; loss and metric sums are over the whole global batch."""

    epoch: int
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    metric_sum: float | None = None
    seconds: float = 0.0
    compute: float = 0.0
    wait: float = 0.0
    comm: float = 0.0
    own_samples: int = 0
    # Steps where this rank had samples (a tail shorter than the ranks leaves some out), on
    # this world.
    own_steps: int = 0
    predicted_compute: float = 0.0
    predicted_seconds: float = 0.0
    slowdown: float = 1.0
    lr: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    ranks: list[dict[str, float]] = field(default_factory=list)
    replan: dict[str, Any] | None = None
    # Of `steps` and `seconds`, what ran before a resume on another world size: this rank's
    # own figures (what re-planning reads) are the rest.
    carried_steps: int = 0
    carried_seconds: float = 0.0
    # How far the epochs before this one sat from their predictions (measured / predicted,
    # `Totals.correction`), fixed at the epoch's start.
    correction: float = 1.0

    @property
    def step_seconds(self) -> float:
        """Measured seconds per step."""
        return self.seconds / max(self.steps, 1)

    @property
    def predicted_step_seconds(self) -> float:
        """The plan's predicted seconds per step, for the steps this epoch took."""
        return self.predicted_seconds / max(self.steps, 1)

    @property
    def forecast_step_seconds(self) -> float:
        """The plan's prediction corrected by the epochs measured before this one."""
        return self.correction * self.predicted_step_seconds

    @property
    def idle_fraction(self) -> float:
        """The share of the working ranks' time spent waiting for the slowest.

        Ranks with no samples are left out: the plan idles them on purpose (and says so).
        """
        working = [r for r in self.ranks if r["samples"] > 0]
        total = sum(r["seconds"] for r in working)
        return sum(r["wait"] for r in working) / total if total > 0 else 0.0

    @property
    def loss(self) -> float:
        """Mean training loss over the epoch's samples."""
        return self.loss_sum / max(self.samples, 1)

    @property
    def accuracy(self) -> float | None:
        """The workload's step metric over the epoch's samples (None without one)."""
        return None if self.metric_sum is None else self.metric_sum / max(self.samples, 1)

    def measured(self) -> dict[str, float]:
        """What this rank shares at the end of an epoch (the log, the summary, re-planning)."""
        return {
            "compute": self.compute,
            "predicted": self.predicted_compute,
            "wait": self.wait,
            "comm": self.comm,
            "seconds": self.seconds - self.carried_seconds,
            "samples": float(self.own_samples),
            "steps": float(self.steps - self.carried_steps),
            "busy_steps": float(self.own_steps),
            "slowdown": self.slowdown,
            "seconds_per_sample": self.compute / self.own_samples if self.own_samples else 0.0,
        }

    def to_metrics(self) -> dict[str, Any]:
        """The metrics.jsonl line of this epoch (1-based epoch)."""
        return {
            "type": "epoch",
            "epoch": self.epoch + 1,
            "time": time.time(),
            "steps": self.steps,
            "samples": self.samples,
            "loss": self.loss,
            "accuracy": self.accuracy,
            "lr": self.lr,
            "seconds": self.seconds,
            "step_seconds": self.step_seconds,
            "predicted_step_seconds": self.predicted_step_seconds,
            "forecast_step_seconds": self.forecast_step_seconds,
            "idle_fraction": self.idle_fraction,
            "batch_sizes": list(self.batch_sizes),
            "ranks": [
                {
                    "rank": rank,
                    # busy_steps: the steps it had samples in (fewer where a tail left it none).
                    **{
                        k: r[k]
                        for k in ("samples", "compute", "wait", "comm", "seconds", "busy_steps")
                    },
                }
                for rank, r in enumerate(self.ranks)
            ],
            "replan": self.replan,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain values (an interrupted epoch's accumulators travel in a checkpoint)."""
        return dataclasses.asdict(self)

    def job_wide(self, batch_sizes: list[int], slowdown: float) -> EpochRecord:
        """This interrupted epoch as another world continues it: the job's sums (steps,
        samples, loss, metric, seconds, the plan's predicted seconds, the rate) are kept;
        this rank's own (time split, samples, prediction) start at zero, under its plan."""
        return dataclasses.replace(
            self,
            carried_steps=self.steps,
            carried_seconds=self.seconds,
            compute=0.0,
            wait=0.0,
            comm=0.0,
            own_samples=0,
            own_steps=0,
            predicted_compute=0.0,
            slowdown=slowdown,
            batch_sizes=batch_sizes,
            ranks=[],
            correction=1.0,  # the other world's epochs say nothing of this one's steps
        )


# Epochs whose prediction error the summary's median is taken over: the latest ones.
ERROR_WINDOW = 256
# Epochs whose measured / predicted ratio corrects the next epoch's prediction: enough to
# average this machine's noise, few enough to follow a drift.
CALIBRATION_WINDOW = 8


@dataclass
class Totals:
    """This rank's running sums over the run, for summary.json; O(1) in the epochs run."""

    epochs: int = 0
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    compute: float = 0.0
    wait: float = 0.0
    comm: float = 0.0
    predicted_seconds: float = 0.0
    replans: int = 0
    first_loss: float | None = None
    last: dict[str, Any] | None = None
    errors: deque[float] = field(default_factory=lambda: deque(maxlen=ERROR_WINDOW))
    forecast_errors: deque[float] = field(default_factory=lambda: deque(maxlen=ERROR_WINDOW))
    # (measured, predicted) seconds of the latest epochs from the run's second on, and of
    # its first, for `correction`.
    calibration: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=CALIBRATION_WINDOW)
    )
    first_calibration: tuple[float, float] | None = None
    calibrated_batches: list[int] | None = None  # the plan those epochs ran

    def correction(self, batch_sizes: list[int] | None = None) -> float:
        """Measured over predicted seconds of the latest epochs on the plan of
        `batch_sizes`: what the next epoch's prediction is multiplied by. The plan's model
        misses by what profiling each rank alone cannot see (ranks contending for cores and
        memory, the step's bookkeeping, a machine that drifts); the epochs just run measure
        it. The run's first epoch (which also pays for allocation and caches) counts only
        until a later one is measured. A re-planned plan starts afresh (1.0): its model was
        rescaled to the measured epochs already."""
        if batch_sizes is not None and list(batch_sizes) != self.calibrated_batches:
            return 1.0
        pairs = self.calibration or ([self.first_calibration] if self.first_calibration else [])
        measured = sum(m for m, _ in pairs)
        predicted = sum(p for _, p in pairs)
        return measured / predicted if predicted > 0 and measured > 0 else 1.0

    def add(self, record: EpochRecord) -> None:
        """Count one finished (or interrupted) epoch."""
        self.epochs += 1
        self.steps += record.steps
        self.samples += record.samples
        self.seconds += record.seconds
        self.compute += record.compute
        self.wait += record.wait
        self.comm += record.comm
        self.predicted_seconds += record.predicted_seconds
        if self.first_loss is None and record.steps:
            self.first_loss = record.loss
        if not (record.steps and record.predicted_seconds > 0):
            return
        if record.epoch >= 1:
            predicted = record.predicted_step_seconds
            self.errors.append(abs(record.step_seconds - predicted) / predicted)
        if record.carried_steps:  # begun on another world size: no figure of this one
            return
        pair = (record.seconds, record.predicted_seconds)
        if record.batch_sizes != self.calibrated_batches:  # another plan: start afresh
            self.calibration.clear()
            self.first_calibration = None
            self.calibrated_batches = list(record.batch_sizes)
        # The first epoch pays one-off costs (allocation, caches) no steady model predicts.
        if record.epoch == 0:
            self.first_calibration = pair
            return
        forecast = record.forecast_step_seconds
        self.forecast_errors.append(abs(record.step_seconds - forecast) / forecast)
        self.calibration.append(pair)

    def state_dict(self) -> dict[str, Any]:
        """Plain values for a checkpoint."""
        state = dataclasses.asdict(self)
        for name in ("errors", "forecast_errors"):
            state[name] = list(getattr(self, name))
        state["calibration"] = [list(pair) for pair in self.calibration]
        first = self.first_calibration
        state["first_calibration"] = list(first) if first is not None else None
        return state

    def job_wide(self) -> Totals:
        """These totals as another world continues them: the job's figures (epochs, steps,
        samples, seconds, predictions, re-plans, losses) kept, this rank's split zeroed,
        and no correction carried over from another world's steps."""
        return dataclasses.replace(
            self, compute=0.0, wait=0.0, comm=0.0,
            calibration=deque(maxlen=CALIBRATION_WINDOW), first_calibration=None,
            calibrated_batches=None,
        )  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Totals:
        """The totals a checkpoint saved."""
        state = dict(state)
        errors = deque(state.pop("errors", []), maxlen=ERROR_WINDOW)
        forecast = deque(state.pop("forecast_errors", []), maxlen=ERROR_WINDOW)
        calibration = deque(
            (tuple(pair) for pair in state.pop("calibration", [])), maxlen=CALIBRATION_WINDOW
        )
        first = state.pop("first_calibration", None)
        return cls(
            **state, errors=errors, forecast_errors=forecast, calibration=calibration,
            first_calibration=tuple(first) if first is not None else None,
        )  # fmt: skip
