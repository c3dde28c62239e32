"""The concerns of a run, one callback each: progress, re-planning, metrics, divergence,
evaluation, checkpoints. The engine calls them in the order of their `order`.

Every callback runs on every rank and decides from values every rank holds alike (the
control allreduce's sums, the allgathered epoch figures), so all ranks act at the same step
without another collective (a checkpoint's write, collective already, shares rank 0's timing
of it with one small broadcast); what only rank 0 does (printing, writing) it says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lbtrain.balancer import BalancePlan
from lbtrain.trainer.control import Control
from lbtrain.trainer.engine import Callback, Engine, TrainingDiverged
from lbtrain.trainer.progress import Progress
from lbtrain.trainer.records import EpochRecord
from lbtrain.trainer.replanner import Replanner
from lbtrain.trainer.summary import format_metric
from lbtrain.trainer.timing import PendingTimes, StepTimes

__all__ = [
    "CHECKPOINT_SHARE",
    "DIVERGENCE_FACTOR",
    "DIVERGENCE_PATIENCE",
    "CheckpointCallback",
    "DivergenceGuard",
    "EvaluateCallback",
    "MetricsCallback",
    "ProgressCallback",
    "ReplanCallback",
    "checkpoint_interval",
]


class ProgressCallback(Callback):
    """Rank 0's bar or lines: the running loss per step, one line per epoch."""

    order = 10

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._open = False

    def on_step_end(
        self, engine: Engine, control: Control, times: StepTimes | PendingTimes
    ) -> None:
        record, state = engine.state.record, engine.state
        assert record is not None
        if not self._open:
            self.progress.start_epoch(state.epoch, len(engine.loader), state.step - 1)
            self._open = True
        self.progress.step(state.step - 1, record.loss, record.samples / max(record.seconds, 1e-9))

    def on_epoch_end(self, engine: Engine, record: EpochRecord) -> None:
        self._open = False
        accuracy = "" if record.accuracy is None else f"  train acc {100 * record.accuracy:6.2f} %"
        # Once epochs have been measured, the prediction they correct beside the plan's.
        corrected = (
            f", corrected {1e3 * record.forecast_step_seconds:.1f}"
            if record.correction != 1.0
            else ""
        )
        self.progress.end_epoch(
            f"epoch {record.epoch + 1}/{engine.state.epochs}  loss {record.loss:.4f}{accuracy}"
            f"  {record.seconds:.1f} s  {record.samples / max(record.seconds, 1e-9):,.0f} "
            f"samples/s  step {1e3 * record.step_seconds:.1f} ms (predicted "
            f"{1e3 * record.predicted_step_seconds:.1f}{corrected})  "
            f"idle {100 * record.idle_fraction:.0f} %"
        )

    def on_fit_end(self, engine: Engine) -> None:
        self.progress.close()


class ReplanCallback(Callback):
    """At each epoch's end, rank 0's re-planning decision, from what every rank measured.

    Its checkpointed memory holds for the plan it was measured under: a run resumed under
    another plan or on another number of ranks starts the re-planner afresh.
    """

    order = 20
    key = "replanner"

    def __init__(self, replanner: Replanner, say: Callable[[str], None]) -> None:
        self.replanner = replanner
        self.say = say
        self._plan: dict[str, Any] | None = None  # the plan in force, as checkpoints hold it
        self._saved: dict[str, Any] | None = None  # a checkpoint's memory, until fit starts

    def on_fit_start(self, engine: Engine) -> None:
        self._plan = engine.loader.plan.to_dict()
        saved, self._saved = self._saved, None
        if saved is None or saved.get("plan") is None:  # none, or older than the plan kept
            return
        # A plan names its ranks' batches: the same plan is also the same number of ranks.
        if BalancePlan.from_dict(saved["plan"]).to_dict() == self._plan:
            self.replanner.load_state_dict(saved["memory"])

    def on_epoch_end(self, engine: Engine, record: EpochRecord) -> None:
        # Also after the last epoch: a run extended later (--resume --epochs more) then
        # decides what one run of that length decides.
        plan = engine.loader.plan
        change = self.replanner.observe(plan, record.ranks)
        # Rank 0's decision for all: every rank must switch to the very same plan.
        chosen = engine.comm.bcast(None if change is None else change.plan.to_dict(), root=0)
        if chosen is None:
            return
        # Counted here, not when the epoch joined the totals: that was before this decision,
        # and the checkpoint (after it) must carry the count. On every rank alike.
        engine.state.totals.replans += 1
        if change is not None:
            record.replan = change.to_dict(plan)
            last = record.epoch + 1 == engine.state.epochs
            self.say(
                f"  after epoch {record.epoch + 1}: {change.describe(plan)}"
                + (" (the last epoch: the plan for epochs a resume adds)" if last else "")
            )
        engine.loader.set_plan(BalancePlan.from_dict(chosen))
        self._plan = engine.loader.plan.to_dict()

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.replanner.state_dict(), "plan": self._plan}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Kept until fit starts, where the plan it holds for can be compared.
        self._saved = state


class MetricsCallback(Callback):
    """Streams each epoch's record (and every logged entry) to `write`, which only rank 0's
    writes to a file."""

    order = 30

    def __init__(self, write: Callable[[dict[str, Any]], None]) -> None:
        self.write = write

    def on_epoch_end(self, engine: Engine, record: EpochRecord) -> None:
        engine.log(record.to_metrics())

    def on_log(self, engine: Engine, entry: dict[str, Any]) -> None:
        self.write(entry)


# A step's loss this many times the first step's has run away (a NaN or infinite loss is
# caught by the engine itself).
DIVERGENCE_FACTOR = 1e3
# Epochs of a growing loss, ending above the first epoch's, that count as running away.
DIVERGENCE_PATIENCE = 8


class DivergenceGuard(Callback):
    """Stops a run whose loss ran away, on every rank at the same step, with one line.

    Diverged: a step's loss above `factor` x the run's first step's loss, or an epoch loss
    that grew for `patience` epochs in a row to above the first epoch's. A NaN or infinite
    loss is caught by the engine itself, on or off.
    """

    order = 40
    key = "divergence"

    def __init__(
        self, factor: float = DIVERGENCE_FACTOR, patience: int = DIVERGENCE_PATIENCE
    ) -> None:
        self.factor, self.patience = factor, patience
        self.first_step: float | None = None
        self.first_epoch: float | None = None
        self.previous: float | None = None
        self.growing = 0

    def on_step_end(
        self, engine: Engine, control: Control, times: StepTimes | PendingTimes
    ) -> None:
        loss = control.loss  # the global batch's mean loss: the same on every rank
        if self.first_step is None:
            if loss > 0 and math.isfinite(loss):
                self.first_step = loss
            return
        if loss > self.factor * self.first_step:
            self._stop(
                engine,
                f"the training loss reached {loss:.4g}, more than "
                f"{self.factor:g} x its first value {self.first_step:.4g}",
            )

    def on_epoch_end(self, engine: Engine, record: EpochRecord) -> None:
        loss = record.loss
        if self.first_epoch is None:
            self.first_epoch = loss
        self.growing = self.growing + 1 if self.previous is not None and loss > self.previous else 0
        self.previous = loss
        if self.growing >= self.patience and loss > self.first_epoch:
            self._stop(
                engine,
                f"the training loss grew for {self.growing} epochs in a row, "
                f"to {loss:.4g} (first epoch: {self.first_epoch:.4g})",
            )

    def _stop(self, engine: Engine, what: str) -> None:
        state = engine.state
        where = (
            f"at epoch {state.epoch + 1}, step {state.step}"
            if state.step
            else f"after epoch {state.epoch}"
        )
        raise TrainingDiverged(
            f"training diverged {where}: {what}; lower the learning rate (--lr), or turn the "
            "guard off with --no-divergence; earlier checkpoints, if any, are kept"
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "first_step": self.first_step,
            "first_epoch": self.first_epoch,
            "previous": self.previous,
            "growing": self.growing,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first_step, self.first_epoch = state.get("first_step"), state.get("first_epoch")
        self.previous, self.growing = state.get("previous"), int(state.get("growing", 0))


class EvaluateCallback(Callback):
    """Evaluates every `every` epochs, and once more when training ends with every epoch
    run (`final`); collective, as `evaluate` is."""

    order = 50
    key = "evaluations"

    def __init__(
        self,
        evaluate: Callable[[Engine], dict[str, Any]],
        every: int,
        headline: tuple[str, ...],
        say: Callable[[str], None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.evaluate, self.every, self.headline, self.say = evaluate, every, headline, say
        self._clock = clock
        self.evaluations: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None  # all the metrics of the last evaluation
        # This rank's seconds evaluating, in all sessions, and those of the final evaluation
        # (which a checkpoint at the fit's end leaves out, as it leaves out its figures).
        self.seconds, self._final_seconds = 0.0, 0.0

    def on_epoch_end(self, engine: Engine, record: EpochRecord) -> None:
        epoch = record.epoch + 1
        # The last epoch's evaluation is the final one, at the fit's end.
        if self.every and epoch % self.every == 0 and not engine.state.finished:
            self._add(engine, epoch, self._timed(engine))

    def on_fit_end(self, engine: Engine) -> None:
        # Also a run resumed with every epoch done: it evaluates only. Not a stopped run.
        if not engine.state.stop_code:
            before = self.seconds
            self.final = self._timed(engine)
            self._final_seconds = self.seconds - before
            self._add(engine, engine.state.epochs, self.final)

    def _timed(self, engine: Engine) -> dict[str, Any]:
        started = self._clock()
        metrics = self.evaluate(engine)
        self.seconds += self._clock() - started
        return metrics

    def _add(self, engine: Engine, epoch: int, metrics: dict[str, Any]) -> None:
        """Keep (and log) one evaluation's headline figures."""
        shown = {name: metrics[name] for name in self.headline if name in metrics}
        self.evaluations.append({"epoch": epoch, **shown})
        engine.log({"type": "eval", "epoch": epoch, "time": time.time(), "metrics": shown})
        self.say("  eval: " + "  ".join(f"{k} {format_metric(k, v)}" for k, v in shown.items()))

    def state_dict(self) -> dict[str, Any]:
        # Without the final evaluation (a checkpoint written at the fit's end comes after
        # it): a resume evaluates at its own end, and would list that epoch twice.
        kept = self.evaluations[:-1] if self.final is not None else self.evaluations
        return {"evaluations": kept, "seconds": self.seconds - self._final_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.evaluations = list(state.get("evaluations", []))
        self.seconds = float(state.get("seconds", 0.0))  # none kept before the figure was


# Writing checkpoints by time may take at most this share of the training time: a write
# that takes longer than this share of the interval lengthens the interval.
CHECKPOINT_SHARE = 0.02


def checkpoint_interval(
    seconds: float, save_seconds: float, share: float = CHECKPOINT_SHARE
) -> float:
    """Seconds of training between checkpoints by time: `seconds` (so a lost rank costs at
    most that much work), unless a write of `save_seconds` would then take more than `share`
    of the time: then as long as makes it `share`. 0 (none by time) when `seconds` is 0."""
    if seconds <= 0:
        return 0.0
    return max(seconds, save_seconds / share)


class CheckpointCallback(Callback):
    """Saves every `every` epochs, after the last one, where a signal stopped the run, and
    every `seconds` of training (mid-epoch too; 0: not by time).

    Every rank must save at the same step (the save is collective), and no rank's own clock
    may decide: the time is rank 0's training clock, which every step's control allreduce
    hands to every rank up to the step before (`Control.clock`; evaluations and writes left
    out), and a broadcast whole at each epoch's end and each save. A save's own
    time (rank 0's) lengthens the interval, so that saving by time costs at most
    `CHECKPOINT_SHARE` of the run, and is left out of the epoch's time.
    """

    order = 60
    key = "checkpoints"

    def __init__(
        self, save: Callable[[Engine], Path | None], every: int, seconds: float = 0.0
    ) -> None:
        self.save, self.every, self.seconds = save, every, seconds
        self.saved_at: int | None = None  # the global step of the newest checkpoint
        self.path: Path | None = None
        # Checkpoints written in all sessions (each counts itself) and rank 0's seconds of
        # the writes before the newest, as wall_seconds has them.
        self.count, self.total = 0, 0.0
        self.interval = 0.0  # seconds of training between checkpoints by time
        self._save_seconds = 0.0
        # Rank 0's training clock at the latest step, and at the latest save (or the start).
        self._clock = self._mark = 0.0

    def on_fit_start(self, engine: Engine) -> None:
        # Rank 0's clock where this session starts (a resumed run's carries on).
        self._clock = self._mark = engine.comm.bcast(engine.training_clock(), root=0)
        self.interval = checkpoint_interval(self.seconds, self._save_seconds)

    def on_step_end(
        self, engine: Engine, control: Control, times: StepTimes | PendingTimes
    ) -> None:
        self._clock = control.clock
        # At an epoch's last step the epoch's end decides, with the epoch counted.
        if engine.state.step < len(engine.loader) and self._due():
            self._save(engine, mid_epoch=True)

    def on_epoch_end(self, engine: Engine, record: EpochRecord) -> None:
        # The steps carried the clock up to the step before the last: the epoch's whole.
        self._clock = engine.comm.bcast(engine.training_clock(), root=0)
        epoch = record.epoch + 1
        if engine.state.finished or (self.every and epoch % self.every == 0) or self._due():
            self._save(engine)

    def on_fit_end(self, engine: Engine) -> None:
        # Stopped by a signal, or resumed from a finished run into a new folder: this run's
        # folder gets the checkpoint of where it ended.
        if self.saved_at != engine.state.global_step:
            self._save(engine)

    def _due(self) -> bool:
        return bool(self.interval) and self._clock - self._mark >= self.interval - 1e-9

    def _save(self, engine: Engine, mid_epoch: bool = False) -> None:
        state, timer = engine.state, engine.timer
        began = timer.now()
        if mid_epoch:
            engine.settle()  # the record it saves holds every step's times
        self.count += 1
        self.path = self.save(engine)
        took = timer.now() - began
        if mid_epoch:  # the steps' time stays the steps'
            engine.leave_out(took)
        # Rank 0's figures for every rank: the save was collective, so they are at hand. The
        # clock of the saved step (the write itself is left out of it).
        self._save_seconds, self._mark = engine.comm.bcast((took, engine.training_clock()), root=0)
        self.total += self._save_seconds
        self.saved_at = state.global_step
        self.interval = checkpoint_interval(self.seconds, self._save_seconds)

    def state_dict(self) -> dict[str, Any]:
        # The last write's time too: a resumed run keeps the 2% rule's interval.
        return {"count": self.count, "seconds": self.total, "last": self._save_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.total = int(state.get("count", 0)), float(state.get("seconds", 0.0))
        self._save_seconds = float(state.get("last", 0.0))
