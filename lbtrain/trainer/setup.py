"""Before the first step: check, choose the folder, place, build, plan, and build the engine.

Every function here is collective. What can be checked is checked before the expensive
work (profiling), and bad input stops every rank with one line.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn

from lbtrain.balancer import BalancePlan
from lbtrain.comm import Communicator
from lbtrain.data import balanced_loader
from lbtrain.emulation import Slowdown, slowdown_schedule
from lbtrain.evaluation import evaluate
from lbtrain.logs import configure as configure_logging
from lbtrain.logs import set_rank
from lbtrain.outputs import atomic_write_text
from lbtrain.profiling import ReplicaProfile
from lbtrain.profiling.record import profiles_to_dict
from lbtrain.report import build_report, format_report
from lbtrain.session import Replica, agree, build_workload, root_value, setup_replica, write_on_root
from lbtrain.text import plural
from lbtrain.trainer.callbacks import (
    CheckpointCallback,
    DivergenceGuard,
    EvaluateCallback,
    MetricsCallback,
    ProgressCallback,
    ReplanCallback,
)
from lbtrain.trainer.checkpoint import CHECKPOINT_DIR, save_checkpoint
from lbtrain.trainer.config import TrainConfig, save_toml
from lbtrain.trainer.data_check import check_same_data, data_identity
from lbtrain.trainer.engine import Callback, Engine, RunState, StepTimer
from lbtrain.trainer.observers import TensorBoardCallback, TraceCallback
from lbtrain.trainer.optim import build_optimizer, build_scheduler
from lbtrain.trainer.planning import make_plan, plan_notes
from lbtrain.trainer.progress import Progress
from lbtrain.trainer.replanner import Replanner
from lbtrain.trainer.resume import check_trainable, follow_schedule, read_checkpoint
from lbtrain.trainer.run_folder import prepare_out, start_run_folder
from lbtrain.trainer.signals import StopSignal
from lbtrain.trainer.state import checkpoint_state, restore, same_plan
from lbtrain.trainer.summary import device_label
from lbtrain.trainer.timing import EventTimer
from lbtrain.workloads import Workload

__all__ = ["Setup", "build_engine", "set_up"]

# Ranks that are threads of one process (lbtrain.comm.LocalWorld) share torch's global
# generator: seeding and initialising under one lock keeps rank 0's weights the seed's.
_GLOBAL_RNG = threading.Lock()


@dataclass
class Setup:
    """What the run stands on once the plan is made."""

    config: TrainConfig
    comm: Communicator
    out: Path
    given: str  # the folder as the user named it, for messages
    clear: bool
    checkpoint: dict[str, Any] | None
    replica: Replica
    workload: Workload
    plan: BalancePlan
    profiles: list[ReplicaProfile] | None
    devices: list[dict[str, Any]]
    slowdown_at: Callable[[int], Slowdown]
    profile_seconds: float
    started: float = 0.0  # this session's start on the perf_counter clock
    lock: IO[str] | None = None  # rank 0's hold on the run folder, while it trains

    def seconds_so_far(self) -> dict[str, float]:
        """Wall and profiling seconds of the whole run: the sessions before a resume (as
        their checkpoint recorded them) and this one up to now."""
        earlier = self.checkpoint or {}
        return {
            "wall_seconds": float(earlier.get("wall_seconds", 0.0))
            + time.perf_counter()
            - self.started,
            "profile_seconds": float(earlier.get("profile_seconds", 0.0)) + self.profile_seconds,
        }

    @property
    def show(self) -> bool:
        """Whether this rank prints progress (rank 0, not quiet)."""
        return self.comm.rank == 0 and not self.config.quiet

    def say(self, text: str) -> None:
        """Print one line on rank 0 unless quiet."""
        if self.show:
            print(text, flush=True)

    def start_outputs(self) -> None:
        """On rank 0: create the run folder, and write config.toml, plan.json, profiles."""
        out = self.out
        self.lock = start_run_folder(out, self.given, self.clear, self.workload.outputs)
        plan, config = self.plan, self.config
        # With a plan file, its policy and smallest batch are what apply: the recipe says so.
        if config.plan:
            config = replace(config, policy=plan.policy, min_batch=plan.min_batch)
        save_toml(out / "config.toml", config)
        atomic_write_text(out / "plan.json", self.plan.to_json() + "\n")
        if self.profiles is not None:
            text = json.dumps(profiles_to_dict(self.profiles), indent=2) + "\n"
            atomic_write_text(out / "profiles.json", text)

    def on_root(self, write: Callable[[], Any]) -> Any:
        """Run `write` on rank 0; an OSError there stops every rank naming --out."""
        return write_on_root(self.comm, "out", self.config.out or str(self.out), write)


def set_up(config: TrainConfig, comm: Communicator) -> Setup:
    """Check the settings, pick the folder, place the rank, build the workload, plan."""
    started = time.perf_counter()
    agree(comm, config.validate)
    configure_logging(config.log_level)
    set_rank(comm.rank, thread=threading.current_thread() is not threading.main_thread())
    agree(comm, lambda: _check_extras(config))
    checkpoint = root_value(comm, lambda: read_checkpoint(config.resume))
    folder, clear = root_value(comm, lambda: prepare_out(config, checkpoint))
    flush = config.flush_denormals
    replica = setup_replica(comm, config.devices, config.threads, config.emulate_slowdown, flush)
    slowdown_at = agree(
        comm,
        lambda: slowdown_schedule(
            config.emulate_change, replica.slowdown, comm.rank, comm.size, config.epochs
        ),
    )
    workload = build_workload(comm, config.workload, config.seed, config.workload_options)
    agree(comm, lambda: check_trainable(workload, config, comm.size, checkpoint))
    built = comm.allgather(data_identity(workload))
    agree(comm, lambda: check_same_data(built))
    devices = comm.allgather(
        {
            "device": replica.assignment.device,
            "host": replica.assignment.host,
            "threads": replica.assignment.threads,
            "slowdown": replica.slowdown.factor,
        }
    )
    setup = Setup(
        config,
        comm,
        Path(folder),
        config.out or folder,
        clear,
        checkpoint,
        replica,
        workload,
        None,
        None,
        devices,
        slowdown_at,
        0.0,
        started,
    )  # type: ignore[arg-type]
    setup.say(f"{workload.name}: {workload.description}" if workload.description else workload.name)
    began = time.perf_counter()
    make_optimizer = functools.partial(
        build_optimizer,
        name=config.optimizer,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    setup.plan, setup.profiles = make_plan(
        comm, config, replica, workload, make_optimizer, checkpoint, devices
    )
    setup.profile_seconds = time.perf_counter() - began
    _describe_plan(setup)
    return setup


def _describe_plan(setup: Setup) -> None:
    plan, config = setup.plan, setup.config
    if setup.profiles is not None:
        report = build_report(
            setup.profiles,
            plan.global_batch_size,
            plan.policy,
            min_batch=plan.min_batch,
            comm=plan.comm,
        )
        setup.say(format_report(report))
        reported = [r.plan for r in report.results if r.policy == plan.policy]
        if reported and tuple(reported[0].batch_sizes) != tuple(plan.batch_sizes):
            # A resume keeps the plan in force at its checkpoint, re-planned from training's
            # own timings, while the report plans from the profiles taken before training.
            setup.say(
                f"training goes on with the checkpoint's plan, re-planned from training's "
                f"timings: batches {list(plan.batch_sizes)} of {plan.global_batch_size}, "
                f"predicted step {1e3 * plan.predicted_step_time:.2f} ms (the report above "
                "plans from the profiles)"
            )
    else:
        setup.say(
            f"plan ({plan.policy}): batches {list(plan.batch_sizes)} of {plan.global_batch_size}"
        )
        for note in plan_notes(plan):
            setup.say(note)
    if config.emulate_change:
        setup.say(
            f"emulated slowdown changes: {config.emulate_change} (from epoch: factors per rank)"
        )


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


def build_engine(
    setup: Setup, stop: StopSignal, extra: Iterable[Callback], timer: StepTimer | None
) -> Engine:
    """The model, optimizer, loader and schedule, the run's callbacks, and the engine;
    a resumed run's state put back."""
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
        timer=timer or _timer(setup),
    )
    engine.add_callbacks([*_callbacks(setup, engine), *extra])
    if setup.checkpoint is not None:
        restore(setup.checkpoint, engine, same_plan=same_plan(setup.checkpoint, setup.plan))
        setup.say(_resume_line(setup.checkpoint["path"], engine.state, config.epochs, steps))
        state = engine.state
        moved = follow_schedule(engine, config.epochs * steps, state.epoch * steps + state.step)
        if moved:
            setup.say(moved)
    else:
        setup.say(
            f"training {plural(config.epochs, 'epoch')} of {plural(steps, 'step')} on "
            f"{plural(comm.size, 'rank')}"
        )
    return engine


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


def _callbacks(setup: Setup, engine: Engine) -> list[Callback]:
    config = setup.config
    evaluator = setup.workload.get_evaluator()

    def run_eval() -> dict[str, Any]:
        return evaluate(
            engine.model,
            setup.workload.eval_set,
            evaluator,
            setup.comm,
            engine.loader.plan.weights,
            device=engine.device,
            batch_size=config.eval_batch,
            collate_fn=setup.workload.collate_fn,
        )

    def save(engine: Engine) -> Path | None:
        state = checkpoint_state(engine, setup.profiles, config, setup.workload, setup.devices)
        state.update(setup.seconds_so_far())
        return setup.on_root(
            lambda: save_checkpoint(setup.out / CHECKPOINT_DIR, state, config.keep)
        )

    callbacks: list[Callback] = [
        ProgressCallback(Progress(setup.show, config.epochs, config.log_every)),
        MetricsCallback(None),  # open_metrics gives rank 0 its writer
        EvaluateCallback(run_eval, config.eval_every, evaluator.headline, setup.say),
        CheckpointCallback(save, config.checkpoint_every),
    ]
    if config.replan == "auto":
        callbacks.append(ReplanCallback(Replanner(), setup.say))
    if config.divergence:
        callbacks.append(DivergenceGuard())
    if config.trace:
        labels = [device_label(d) for d in setup.devices]
        callbacks.append(TraceCallback(setup.out / config.trace, labels, setup.on_root))
    if config.tensorboard:
        root = setup.comm.rank == 0
        callbacks.append(TensorBoardCallback(setup.out / config.tensorboard if root else None))
    return callbacks


def _check_extras(config: TrainConfig) -> None:
    """The optional packages a setting needs are there, before any expensive work."""
    if config.tensorboard:
        from lbtrain.viz._deps import summary_writer_class

        try:
            summary_writer_class()
        except RuntimeError as exc:
            raise ValueError(f"tensorboard={config.tensorboard!r}: {exc}") from None
