"""What a set-up run trains with: the model, optimizer, loader and schedule, the run's
callbacks, and the engine; a resumed run's state put back. Collective."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lbtrain.data import balanced_loader
from lbtrain.evaluation import evaluate
from lbtrain.text import plural
from lbtrain.trainer.callbacks import (
    CheckpointCallback,
    DivergenceGuard,
    EvaluateCallback,
    MetricsCallback,
    ProgressCallback,
    ReplanCallback,
)
from lbtrain.trainer.checkpoint import CHECKPOINT_DIR, checkpoint_state, restore, save_checkpoint
from lbtrain.trainer.engine import Callback, Engine, RunState, StepTimer
from lbtrain.trainer.observers import TensorBoardCallback, TraceCallback
from lbtrain.trainer.optim import build_optimizer, build_scheduler
from lbtrain.trainer.progress import Progress, item_bar
from lbtrain.trainer.replanner import Replanner
from lbtrain.trainer.resume import follow_schedule
from lbtrain.trainer.run_outputs import RunOutputs, world_change
from lbtrain.trainer.setup import Setup
from lbtrain.trainer.signals import StopSignal
from lbtrain.trainer.summary import device_label
from lbtrain.trainer.timing import EventTimer

__all__ = ["Run", "build_run"]

# Ranks that are threads of one process (lbtrain.comm.LocalWorld) share torch's global
# generator: seeding and initialising under one lock keeps rank 0's weights the seed's.
_GLOBAL_RNG = threading.Lock()


@dataclass(frozen=True)
class Run:
    """The engine, and the callbacks whose results the job reads when training ends."""

    engine: Engine
    evaluations: EvaluateCallback
    checkpoints: CheckpointCallback


def build_run(
    setup: Setup,
    outputs: RunOutputs,
    stop: StopSignal,
    extra: Iterable[Callback] = (),
    timer: StepTimer | None = None,
) -> Run:
    """The engine with its callbacks (`extra` among them by their `order`), each given what
    it writes to; a resumed run's state put back."""
    config, comm, workload = setup.config, setup.comm, setup.workload
    model = _build_model(setup)
    optimizer = build_optimizer(
        model.parameters(),
        name=config.optimizer,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    loader = balanced_loader(setup.plan, workload.train_set, rank=comm.rank, seed=config.seed,
                             collate_fn=workload.collate_fn)  # fmt: skip
    steps = len(loader)
    scheduler = build_scheduler(
        optimizer,
        config.lr_schedule,
        config.epochs * steps,
        steps,
        config.lr_step_epochs,
        config.lr_gamma,
    )
    evaluations, checkpoints = _evaluations(setup), _checkpoints(setup)
    engine = Engine(
        model,
        optimizer,
        scheduler,
        loader,
        comm,
        loss_fn=workload.loss_fn,
        device=setup.replica.device,
        epochs=config.epochs,
        step_metric=workload.step_metric,
        slowdown_at=setup.slowdown_at,
        weighting=config.weighting,
        overlap=config.overlap,
        sync_batchnorm=config.sync_batchnorm,
        stop=stop,
        callbacks=[evaluations, checkpoints, *_callbacks(setup, outputs), *extra],
        timer=timer or _timer(setup),
    )
    _start_or_resume(setup, engine, steps)
    return Run(engine, evaluations, checkpoints)


def _build_model(setup: Setup) -> nn.Module:
    comm, config = setup.comm, setup.config
    with _GLOBAL_RNG:
        torch.manual_seed(config.seed)  # the workload's model initialisation
        model = setup.workload.build_model()
    for tensor in model.state_dict().values():  # rank 0's weights everywhere
        copy = tensor if tensor.is_contiguous() else tensor.contiguous()
        comm.broadcast_(copy, root=0)
        if copy is not tensor:
            tensor.copy_(copy)
    model.to(setup.replica.device)
    torch.manual_seed(config.seed + 1 + comm.rank)  # dropout masks differ between ranks
    return model


def _start_or_resume(setup: Setup, engine: Engine, steps: int) -> None:
    """Put a checkpoint's state back and say where training continues, or say what starts."""
    config = setup.config
    if setup.checkpoint is None:
        setup.say(
            f"training {plural(config.epochs, 'epoch')} of {plural(steps, 'step')} on "
            f"{plural(setup.comm.size, 'rank')}"
        )
        return
    restore(setup.checkpoint, engine)
    setup.say(_resume_line(setup.checkpoint["path"], engine.state, config.epochs, steps))
    changed = world_change(setup)
    if changed is not None:
        setup.say(
            f"world {changed['from']} -> {changed['to']} ranks at global step "
            f"{changed['global_step']}: re-planned, batches {changed['old_batch_sizes']} -> "
            f"{changed['batch_sizes']}"
        )
    state = engine.state
    moved = follow_schedule(engine, config.epochs * steps, state.epoch * steps + state.step)
    if moved:
        setup.say(moved)


def _timer(setup: Setup) -> StepTimer:
    """CUDA events on a GPU rank that nothing emulates (no synchronisation in the step; not
    yet run on a GPU here), else the host clock."""
    config, device = setup.config, setup.replica.device
    if device.type == "cuda" and not (config.emulate_slowdown or config.emulate_change):
        return EventTimer(device)
    return StepTimer()


def _resume_line(path: str, state: RunState, epochs: int, steps: int) -> str:
    """Where a resumed run continues and what is left, in one line."""
    left = epochs - state.epoch
    if left <= 0:
        return (
            f"resumed from {path}: {'the' if epochs == 1 else 'all'} {plural(epochs, 'epoch')} "
            f"{'is' if epochs == 1 else 'are'} done (global step "
            f"{state.global_step}); evaluating only"
        )
    where = f"epoch {state.epoch + 1} of {epochs}"
    if state.step:
        where += f" at its step {state.step + 1} of {steps}"
    return (
        f"resumed from {path}: continuing at {where}, global step {state.global_step}; "
        f"{plural(left, 'epoch')} left"
    )


def _evaluations(setup: Setup) -> EvaluateCallback:
    config, workload = setup.config, setup.workload
    evaluator = workload.get_evaluator()

    def run_eval(engine: Engine) -> dict[str, Any]:
        with item_bar(setup.prints, "evaluating (rank 0's share)") as progress:
            return evaluate(
                engine.model,
                workload.eval_set,
                evaluator,
                setup.comm,
                engine.plan.weights,  # re-planning may have switched the plan
                device=engine.device,
                batch_size=config.eval_batch,
                collate_fn=workload.collate_fn,
                progress=progress,
            )

    return EvaluateCallback(run_eval, config.eval_every, evaluator.headline, setup.say)


def _checkpoints(setup: Setup) -> CheckpointCallback:
    config = setup.config

    def save(engine: Engine) -> Path | None:
        state = checkpoint_state(
            engine, setup.profiles, config, setup.workload, setup.devices, setup.worlds
        )
        state.update(setup.seconds_so_far())
        return setup.on_root(
            lambda: save_checkpoint(setup.out / CHECKPOINT_DIR, state, config.keep)
        )

    return CheckpointCallback(save, config.checkpoint_every, config.checkpoint_seconds)


def _callbacks(setup: Setup, outputs: RunOutputs) -> list[Callback]:
    """The run's other concerns, as its settings ask for them."""
    config = setup.config
    callbacks: list[Callback] = [
        ProgressCallback(Progress(setup.prints, config.epochs, config.log_every)),
        MetricsCallback(outputs.write),
    ]
    if config.replan == "auto":
        callbacks.append(ReplanCallback(Replanner(), setup.say))
    if config.divergence:
        callbacks.append(DivergenceGuard())
    if config.trace:
        labels = [device_label(d) for d in setup.devices]
        changed = world_change(setup)  # the session's start: where the new world begins
        marks = [] if changed is None else [
            (0.0, f"world {changed['from']} -> {changed['to']} ranks", changed)
        ]  # fmt: skip
        callbacks.append(TraceCallback(setup.out / config.trace, labels, setup.on_root, marks))
    if config.tensorboard:
        root = setup.comm.rank == 0
        callbacks.append(TensorBoardCallback(setup.out / config.tensorboard if root else None))
    return callbacks
