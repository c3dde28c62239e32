"""`train`: one whole run, on every rank — set up, build the engine, fit, finish.

Collective: every rank of the job calls `train` with the same config. Rank 0 alone reads
checkpoints and writes outputs; everything the other ranks need from those files reaches
them by broadcast, so no shared file system is assumed. A signal at any moment ends the run
with 130 or 143 (lbtrain/trainer/signals.py); once training started, with a checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtrain.comm import Communicator
from lbtrain.denormals import as_before, flushing_threads
from lbtrain.evaluation import evaluate, predict
from lbtrain.outputs import atomic_write_text
from lbtrain.text import plural
from lbtrain.trainer.callbacks import CheckpointCallback, EvaluateCallback
from lbtrain.trainer.config import TrainConfig
from lbtrain.trainer.engine import Callback, Engine, StepTimer
from lbtrain.trainer.outputs_stream import draw_curves, end_record, open_metrics
from lbtrain.trainer.resume import resumed_from
from lbtrain.trainer.run_folder import discard_reserved
from lbtrain.trainer.setup import Setup, build_engine, set_up
from lbtrain.trainer.signals import StopSignal
from lbtrain.trainer.summary import build_summary, format_summary, rank_totals
from lbtrain.workloads import ArtifactContext

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
    _import_what_torch_imports_late()
    stop = StopSignal(announce=comm.rank == 0)
    with stop.installed(), as_before():
        try:
            setup = set_up(config, comm)
            engine = build_engine(setup, stop, callbacks, timer)
        except BaseException:
            discard_reserved()  # the default folder, made early, if no run started in it
            raise
        with open_metrics(setup, engine) as stream:
            state = engine.fit()
            if state.stop_code:
                return _stopped(setup, engine)
            result = _finish(setup, engine, stream)
            return result


def _import_what_torch_imports_late() -> None:
    """Import torch._dynamo now, before the run's clock starts.

    torch.optim imports it at an optimizer's first use (only to mark some methods as not to
    be compiled). That is 2.3 s of start-up on the development machine, and it fell inside
    profiling, where the first optimizer is built: summary.json's profile_seconds counted
    an import as profiling. Imported here, it is start-up, as torch's own import is.
    """
    import torch._dynamo  # noqa: F401


def _stopped(setup: Setup, engine: Engine) -> TrainResult:
    state, comm = engine.state, engine.comm
    saver = engine.callback(CheckpointCallback)
    saved = saver.path if isinstance(saver, CheckpointCallback) else None
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
            f"stopped by a signal {where}; checkpoint {saved}; continue with --resume {setup.out}",
            flush=True,
        )
    comm.barrier()
    return TrainResult(setup.out, None, None, state.stop_code, Path(saved) if saved else None)


def _finish(setup: Setup, engine: Engine, stream: Any) -> TrainResult:
    """The final evaluation, predictions, summary and outputs, after the last epoch."""
    comm, workload, config = engine.comm, setup.workload, setup.config
    plan = engine.loader.plan  # re-planning may have switched it
    evaluator = workload.get_evaluator()
    metrics = evaluate(
        engine.model,
        workload.eval_set,
        evaluator,
        comm,
        plan.weights,
        device=engine.device,
        batch_size=config.eval_batch,
        collate_fn=workload.collate_fn,
    )
    evaluations = engine.callback(EvaluateCallback)
    assert isinstance(evaluations, EvaluateCallback)
    evaluations.add(engine, config.epochs, metrics)
    predictions = None
    if workload.predict_set is not None and workload.artifacts is not None:
        predictions = predict(
            engine.model,
            workload.predict_set,
            comm,
            plan.weights,
            device=engine.device,
            unit=workload.predict_unit,
            batch_size=config.eval_batch,
            collate_fn=workload.collate_fn,
        )
    # Each rank's emulated slowdown as the run ended: --emulate-change may have moved it.
    last = comm.allgather(setup.slowdown_at(max(config.epochs - 1, 0)).factor)
    summary = build_summary(
        plan=plan,
        devices=[
            {**device, "slowdown": factor}
            for device, factor in zip(setup.devices, last, strict=True)
        ],
        totals=engine.state.totals,
        ranks_totals=rank_totals(comm, engine.state.totals),
        evaluations=evaluations.evaluations,
        metrics={k: v for k, v in evaluations.evaluations[-1].items() if k != "epoch"},
        **setup.seconds_so_far(),  # all sessions', when resumed, as train_seconds are
        resumed_from=resumed_from(setup.checkpoint),
        # Read on each rank's training thread as the run ends: still in force, or not.
        flushing=comm.allgather(flushing_threads()),
    )
    setup.on_root(lambda: _write_outputs(setup, plan, metrics, summary, predictions))
    # After the outputs: the end line and summary.json say the run finished, so a stop while
    # the map or curves were drawn must leave neither.
    stream.write(end_record(summary["wall_seconds"]))
    saver = engine.callback(CheckpointCallback)
    final = saver.path if isinstance(saver, CheckpointCallback) else None
    if comm.rank == 0:
        print(format_summary(summary, evaluator.headline, setup.out), flush=True)
    comm.barrier()
    return TrainResult(setup.out, metrics, summary, 0, final)


def _write_outputs(
    setup: Setup, plan: Any, metrics: dict[str, Any], summary: dict[str, Any], predictions: Any
) -> None:
    out, workload = setup.out, setup.workload
    atomic_write_text(out / "plan.json", plan.to_json() + "\n")  # the plan in force now
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    title = f"{workload.name}, {plural(setup.comm.size, 'rank')}, policy {plan.policy}"
    if setup.config.curves:
        draw_curves(out, title)
    if workload.artifacts is not None:
        workload.artifacts(ArtifactContext(out, metrics, predictions, title))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")  # the last
