"""`train`: one whole run, on every rank — set up, build the engine, fit, finish.

Collective: every rank of the job calls `train` with the same config. Rank 0 alone reads
checkpoints and writes outputs; everything the other ranks need from those files reaches
them by broadcast, so no shared file system is assumed. A signal at any moment ends the run
with 130 or 143 (lbtrain/trainer/signals.py); once training started, with a checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtrain.comm import Communicator
from lbtrain.denormals import as_before, flushing_threads
from lbtrain.evaluation import predict
from lbtrain.text import plural
from lbtrain.trainer.build import Run, build_run
from lbtrain.trainer.config import TrainConfig
from lbtrain.trainer.engine import Callback, StepTimer
from lbtrain.trainer.progress import item_bar
from lbtrain.trainer.resume import AUTO, resumed_from
from lbtrain.trainer.run_folder import discard_reserved
from lbtrain.trainer.run_outputs import (
    RunOutputs,
    draw_curves,
    end_record,
    open_run,
    write_outputs,
)
from lbtrain.trainer.setup import Setup, set_up
from lbtrain.trainer.signals import StopSignal
from lbtrain.trainer.summary import build_summary, format_summary, rank_totals

__all__ = ["TrainResult", "train"]


@dataclass
class TrainResult:
    """What a run produced: metrics (None if stopped early), where, and its exit status."""

    out_dir: Path
    metrics: dict[str, Any] | None
    summary: dict[str, Any] | None
    exit_code: int = 0
    checkpoint: Path | None = None


def train(
    config: TrainConfig,
    comm: Communicator,
    *,
    callbacks: Iterable[Callback] = (),
    timer: StepTimer | None = None,
) -> TrainResult:
    """Run one training job as `config` says; collective.

    Args:
        config: the validated settings.
        comm: the job's communicator.
        callbacks: extra engine callbacks, placed among the run's own by their `order`.
        timer: the engine's clock (tests pass one that follows a model).

    Raises:
        CollectiveError: bad input found on any rank, before the expensive work where it can
            be checked then; TrainingDiverged when the loss runs away or stops being finite.
        Interrupted, KeyboardInterrupt: a signal outside the training steps.
    """
    stop = StopSignal(announce=comm.rank == 0)
    with stop.installed(), as_before():
        try:
            setup = set_up(config, comm)
            outputs = RunOutputs()  # the metrics callback writes to it once open_run opens it
            run = build_run(setup, outputs, stop, callbacks, timer)
        except BaseException:
            discard_reserved()  # the default folder, made early, if no run started in it
            raise
        # The callbacks' files close after the outputs are written, the run folder last.
        with open_run(setup, outputs), closing(run.engine):
            state = run.engine.fit()
            if state.stop_code:
                return _stopped(setup, run)
            return _finish(setup, run, outputs)


def _stopped(setup: Setup, run: Run) -> TrainResult:
    engine = run.engine
    state, comm = engine.state, engine.comm
    saved = run.checkpoints.path
    saved = comm.bcast(str(saved) if saved else None, root=0)
    engine.log(
        {
            "type": "stop",
            "epoch": state.epoch + (1 if state.step else 0),
            "step": state.step,
            "reason": "signal",
            "code": state.stop_code,
            "time": time.time(),
        }
    )
    if setup.config.curves:
        setup.on_root(lambda: draw_curves(setup.out, f"{setup.workload.name}, stopped"))
    if comm.rank == 0:
        where = (
            f"in epoch {state.epoch + 1} after step {state.step}"
            if state.step
            else f"after epoch {state.epoch}"
        )
        print(
            f"stopped by a signal {where}; checkpoint {saved}; continue with "
            + ("the same command" if setup.config.resume == AUTO else f"--resume {setup.out}"),
            flush=True,
        )
    comm.barrier()
    return TrainResult(setup.out, None, None, state.stop_code, Path(saved) if saved else None)


def _predictions(setup: Setup, run: Run) -> tuple[Any, float]:
    """The workload's predict_set predicted for its artifacts (None if it has none), and the
    seconds that took; announced first, since it may take longer than an epoch."""
    workload, engine = setup.workload, run.engine
    if workload.predict_set is None or workload.artifacts is None:
        return None, 0.0
    count = len(workload.predict_set)  # type: ignore[arg-type]
    setup.say(
        f"predicting {workload.predict_note or 'the predict set'}: {count:,} items on "
        f"{plural(engine.comm.size, 'rank')}"
    )
    started = time.perf_counter()
    with item_bar(setup.prints, "predicting (rank 0's share)") as progress:
        predictions = predict(
            engine.model,
            workload.predict_set,
            engine.comm,
            engine.plan.weights,
            device=engine.device,
            unit=workload.predict_unit,
            batch_size=setup.config.eval_batch,
            collate_fn=workload.collate_fn,
            progress=progress,
        )
    return predictions, time.perf_counter() - started


def _finish(setup: Setup, run: Run, outputs: RunOutputs) -> TrainResult:
    """Predictions, the summary and the outputs, after the last epoch and its evaluation."""
    engine, workload, config = run.engine, setup.workload, setup.config
    comm, plan = engine.comm, engine.plan
    metrics = run.evaluations.final
    assert metrics is not None  # a fit that was not stopped ends with its evaluation
    predictions, predict_seconds = _predictions(setup, run)
    # Each rank's emulated slowdown as the run ended: --emulate-change may have moved it.
    last = comm.allgather(setup.slowdown_at(max(config.epochs - 1, 0)).factor)
    evaluations = run.evaluations.evaluations
    summary = build_summary(
        plan=plan,
        devices=[
            {**device, "slowdown": factor}
            for device, factor in zip(setup.devices, last, strict=True)
        ],
        totals=engine.state.totals,
        ranks_totals=rank_totals(comm, engine.state.totals),
        evaluations=evaluations,
        metrics={k: v for k, v in evaluations[-1].items() if k != "epoch"},
        **setup.seconds_so_far(),  # all sessions', when resumed, as train_seconds are
        resumed_from=resumed_from(setup.checkpoint),
        worlds=setup.worlds,
        # Read on each rank's training thread as the run ends: still in force, or not.
        flushing=comm.allgather(flushing_threads()),
        checkpoints=run.checkpoints.count,
        checkpoint_seconds=run.checkpoints.total,
        eval_seconds=run.evaluations.seconds,
        predict_seconds=predict_seconds,
    )
    setup.on_root(lambda: write_outputs(setup, plan, metrics, summary, predictions))
    # After the outputs: the end line and summary.json say the run finished, so a stop while
    # the map or curves were drawn must leave neither.
    outputs.write(end_record(summary["wall_seconds"]))
    if comm.rank == 0:
        print(format_summary(summary, workload.get_evaluator().headline, setup.out), flush=True)
    comm.barrier()
    return TrainResult(setup.out, metrics, summary, 0, run.checkpoints.path)
