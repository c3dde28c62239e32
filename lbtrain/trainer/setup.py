"""Before any training: check, choose the folder, place the rank, build the workload, plan.

`set_up` returns the frozen `Setup` that the rest of the run stands on (lbtrain/trainer/
build.py builds the engine from it). Every function here is collective. What can be checked
is checked before the expensive work (profiling), and bad input stops every rank with one
line.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtrain.balancer import BalancePlan
from lbtrain.collective import agree, root_value, write_on_root
from lbtrain.comm import Communicator
from lbtrain.emulation import Slowdown, slowdown_schedule
from lbtrain.logs import configure as configure_logging
from lbtrain.logs import set_rank
from lbtrain.profiling import ReplicaProfile
from lbtrain.report import build_report, format_report
from lbtrain.session import Replica, build_workload, setup_replica
from lbtrain.trainer.config import TrainConfig
from lbtrain.trainer.data_check import check_same_data, data_identity
from lbtrain.trainer.initial_plan import check_plan_files, make_plan, plan_notes
from lbtrain.trainer.optim import build_optimizer
from lbtrain.trainer.resume import check_trainable, read_checkpoint, worlds_of
from lbtrain.trainer.run_folder import check_named_outputs, prepare_out
from lbtrain.trainer.signals import held_signals
from lbtrain.workloads import Workload

__all__ = ["Setup", "set_up"]


@dataclass(frozen=True)
class Setup:
    """What the run stands on once the plan is made; built once, by :func:`set_up`."""

    config: TrainConfig
    comm: Communicator
    out: Path
    given: str  # the folder as the user named it, for messages
    clear: bool  # remove an earlier run's files from `out` when the run starts there
    checkpoint: dict[str, Any] | None
    replica: Replica
    workload: Workload
    plan: BalancePlan
    profiles: list[ReplicaProfile] | None
    devices: list[dict[str, Any]]
    slowdown_at: Callable[[int], Slowdown]
    profile_seconds: float
    started: float  # this session's start on the perf_counter clock
    # The worlds the run trained on, this one last: {"ranks", "from_step"} each.
    worlds: list[dict[str, int]]

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
    def prints(self) -> bool:
        """Whether this rank prints progress (rank 0, not quiet)."""
        return self.comm.rank == 0 and not self.config.quiet

    def say(self, text: str) -> None:
        """Print one line on rank 0 unless quiet."""
        if self.prints:
            print(text, flush=True)

    def on_root(self, write: Callable[[], Any]) -> Any:
        """Run `write` on rank 0; an OSError there stops every rank naming --out."""
        return write_on_root(self.comm, "out", self.config.out or str(self.out), write)


def _check_same_settings(recipes: list[dict[str, Any]]) -> None:
    """Every rank's settings are rank 0's (a node that read another --config file, or an
    MPMD launch), but for the workload's options, whose built workloads are compared by
    their signatures (a data folder may differ between nodes)."""
    first = recipes[0]
    for rank, recipe in enumerate(recipes[1:], start=1):
        for name in sorted(set(first) | set(recipe)):
            if name != "workload_options" and first.get(name) != recipe.get(name):
                raise ValueError(
                    f"the ranks' settings differ: {name}={first.get(name)!r} on rank 0, "
                    f"{name}={recipe.get(name)!r} on rank {rank}; give every rank the same "
                    "settings (the same command and --config file)"
                )


def set_up(config: TrainConfig, comm: Communicator) -> Setup:
    """Check the settings, pick the folder, place the rank, build the workload, plan."""
    started = time.perf_counter()
    agree(comm, config.validate)
    recipes = comm.allgather(config.recipe())
    agree(comm, lambda: _check_same_settings(recipes), name_rank=False)
    configure_logging(config.log_level)
    set_rank(comm.rank, thread=threading.current_thread() is not threading.main_thread())
    agree(comm, lambda: _check_extras(config))
    checkpoint = root_value(comm, lambda: read_checkpoint(config.resume, config.out))
    folder, clear = root_value(comm, lambda: prepare_out(config, checkpoint))
    check_plan_files(comm, config)
    replica, slowdown_at = _place(config, comm)
    workload, devices = _build_workload(config, comm, replica, checkpoint)
    if comm.rank == 0 and not config.quiet:  # before profiling, which may take a while
        print(f"{workload.name}: {workload.description}" if workload.description
              else workload.name, flush=True)  # fmt: skip
    started += _import_what_torch_imports_late()  # start-up, as torch's own import: off the clock
    began = time.perf_counter()
    make_optimizer = functools.partial(
        build_optimizer,
        name=config.optimizer,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    plan, profiles = make_plan(comm, config, replica, workload, make_optimizer, checkpoint, devices)
    setup = Setup(
        config=config,
        comm=comm,
        out=Path(folder),
        given=config.out or folder,
        clear=clear,
        checkpoint=checkpoint,
        replica=replica,
        workload=workload,
        plan=plan,
        profiles=profiles,
        devices=devices,
        slowdown_at=slowdown_at,
        profile_seconds=time.perf_counter() - began,
        started=started,
        worlds=worlds_of(checkpoint, comm.size),
    )
    _describe_plan(setup)
    return setup


def _import_what_torch_imports_late() -> float:
    """Import torch._dynamo now, after the checks of the settings and before profiling; the
    seconds it took.

    torch.optim imports it when an optimizer is built (only to mark some methods as not to
    be compiled): about 1 s of CPU. Inside profiling, summary.json's profile_seconds would
    count an import as profiling; before the checks, a mistyped setting would wait for it.
    """
    began = time.perf_counter()
    with held_signals():  # a Ctrl-C inside this import came out as a RuntimeError
        import torch._dynamo  # noqa: F401

    return time.perf_counter() - began


def _place(config: TrainConfig, comm: Communicator) -> tuple[Replica, Callable[[int], Slowdown]]:
    """This rank's device, threads and emulated slowdown, and the slowdown of each epoch."""
    flush = config.flush_denormals
    replica = setup_replica(comm, config.devices, config.threads, config.emulate_slowdown, flush)
    slowdown_at = agree(
        comm,
        lambda: slowdown_schedule(
            config.emulate_change, replica.slowdown, comm.rank, comm.size, config.epochs
        ),
    )
    return replica, slowdown_at


def _build_workload(
    config: TrainConfig,
    comm: Communicator,
    replica: Replica,
    checkpoint: dict[str, Any] | None,
) -> tuple[Workload, list[dict[str, Any]]]:
    """The workload, checked to be trainable as asked and the same on every rank; and every
    rank's device, host, threads and slowdown."""
    workload = build_workload(comm, config.workload, config.seed, config.workload_options)
    agree(comm, lambda: check_trainable(workload, config, comm.size, checkpoint))
    agree(comm, lambda: check_named_outputs(config, workload.outputs))
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
    return workload, devices


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


def _check_extras(config: TrainConfig) -> None:
    """The optional packages a setting needs are there, before any expensive work."""
    if config.tensorboard:
        from lbtrain.viz._deps import summary_writer_class

        try:
            summary_writer_class()
        except RuntimeError as exc:
            raise ValueError(f"tensorboard={config.tensorboard!r}: {exc}") from None
