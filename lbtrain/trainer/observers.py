"""Callbacks that let a user see a run: a per-rank Perfetto trace, TensorBoard scalars.

Both are opt-in (`--trace FILE`, `--tensorboard DIR`, relative to the run folder) and cost
nothing per step when off. The trace records each rank's phases per step (compute, waiting
for the slowest, gradient sync, optimizer) for a bounded window of steps, on every rank's
own clock from a common start (all ranks leave one barrier together), and rank 0 writes it
at the end: the picture of the idle time balancing removes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lbtrain.trainer.control import Control
from lbtrain.trainer.engine import Callback, Engine
from lbtrain.trainer.records import EpochRecord
from lbtrain.trainer.timing import PendingTimes, StepTimes

__all__ = ["TensorBoardCallback", "TraceCallback", "TRACE_STEPS"]

# Steps recorded per rank: the first half of the run's steps up to this many, then samples
# of every 10th epoch (lbtrain.viz.trace.StepTrace), so a long run's trace stays small.
TRACE_STEPS = 400


class TraceCallback(Callback):
    """Records every rank's step phases; rank 0 writes a Chrome/Perfetto trace to `path`."""

    order = 80

    def __init__(
        self, path: Path, labels: list[str], write: Any, marks: list[Any] | None = None
    ) -> None:
        """`marks`: (seconds from the fit's start, name, args) lines across every track."""
        from lbtrain.viz.trace import StepTrace

        self.path, self.labels, self.write = path, labels, write
        self.marks = list(marks or [])
        self.trace = StepTrace(TRACE_STEPS, every_epoch=10)
        self.t0 = 0.0
        self.alone = False
        self.plans: list[tuple[int, ...]] = []  # the batches of the steps recorded, in order
        self.pending: list[tuple[int, int, Any, tuple[int, ...]]] = []  # this epoch's steps

    def on_fit_start(self, engine: Engine) -> None:
        self.pending = []  # nothing left over from a fit an exception ended
        engine.comm.barrier()  # every rank's clock starts at the same moment, near enough
        self.t0 = engine.timer.now()
        self.alone = engine.comm.size == 1  # no rank to wait for: as the epoch records count

    def on_step_end(
        self, engine: Engine, control: Control, times: StepTimes | PendingTimes
    ) -> None:
        state = engine.state
        # Epochs and steps as a user counts them (from 1), as in metrics.jsonl. The times
        # are read at the epoch's end: with CUDA events, reading them now would wait.
        if len(self.pending) < self.trace.room(state.epoch + 1):  # only what will be kept
            batches = tuple(engine.loader.plan.batch_sizes)
            self.pending.append((state.epoch + 1, state.step, times, batches))

    def on_epoch_end(self, engine: Engine, record: EpochRecord) -> None:
        self._flush()

    def _flush(self) -> None:
        t0 = self.t0
        for epoch, step, pending, batches in self.pending:
            times = pending.resolve()
            # One rank: its control step is compute (it waits for no one), one span.
            computed = times.waited if self.alone else times.computed
            phases = (
                ("compute", times.start - t0, computed - t0),
                *((("wait", times.computed - t0, times.waited - t0),) if not self.alone else ()),
                ("sync", times.waited - t0, times.synced - t0),
                ("optimizer", times.synced - t0, times.done - t0),
            )
            if self.trace.add(epoch, step, phases) and (
                not self.plans or self.plans[-1] != batches
            ):
                self.plans.append(batches)
        self.pending = []

    def on_fit_end(self, engine: Engine) -> None:
        self._flush()  # an epoch a stop cut short
        spans = engine.comm.allgather(self.trace.spans())
        plans = self.plans or [tuple(engine.loader.plan.batch_sizes)]
        labels = [
            f"{label}, batch " + " then ".join(str(p[rank]) for p in plans)
            for rank, label in enumerate(self.labels)
        ]
        marks = self.marks
        self.write(lambda: _write_trace(self.path, spans, labels, marks))  # rank 0 only


def _write_trace(path: Path, spans: list[Any], labels: list[str], marks: list[Any]) -> Path:
    from lbtrain.viz.trace import write_trace

    path.parent.mkdir(parents=True, exist_ok=True)  # --trace sub/trace.json: made as needed
    return write_trace(path, spans, labels, marks)


class TensorBoardCallback(Callback):
    """Logs every metrics entry (epoch, eval) as TensorBoard scalars, on rank 0."""

    order = 35

    def __init__(self, logdir: Path | None) -> None:
        self.logger: Any = None
        if logdir is not None:
            from lbtrain.viz.tensorboard import TensorBoardLogger

            self.logger = TensorBoardLogger(logdir)

    def on_log(self, engine: Engine, entry: dict[str, Any]) -> None:
        if self.logger is not None and entry.get("type") in ("epoch", "eval"):
            self.logger.log(entry)

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
            self.logger = None
