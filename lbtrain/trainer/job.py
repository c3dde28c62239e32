"""`train`: one whole run, on every rank — place, build, profile, plan, fit, evaluate, write.

Collective: every rank of the job calls `train` with the same config. Rank 0 alone reads
checkpoints and writes outputs; everything the other ranks need from those files reaches
them by broadcast, so no shared file system is assumed.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lbtrain.comm import Communicator
from lbtrain.data import balanced_loader
from lbtrain.emulation import slowdown_schedule
from lbtrain.evaluation import evaluate, predict
from lbtrain.outputs import atomic_write_text
from lbtrain.profiling.record import profiles_to_dict
from lbtrain.report import build_report, format_report
from lbtrain.session import agree, build_workload, root_value, setup_replica, write_on_root
from lbtrain.trainer.checkpoint import (
    CHECKPOINT_DIR,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from lbtrain.trainer.config import TrainConfig, save_toml
from lbtrain.trainer.loop import EpochRecord, FitResult, StopSignal, fit
from lbtrain.trainer.optim import build_optimizer, build_scheduler
from lbtrain.trainer.planning import make_plan, plan_notes
from lbtrain.trainer.progress import Progress
from lbtrain.trainer.run_folder import prepare_out, start_run_folder
from lbtrain.trainer.state import checkpoint_state, restore
from lbtrain.trainer.summary import build_summary, format_summary, rank_totals
from lbtrain.workloads import ArtifactContext, Workload

__all__ = ["TrainResult", "train"]

# Ranks that are threads of one process (lbtrain.comm.LocalWorld) share torch's global
# generator: seeding and initialising under one lock keeps rank 0's weights the seed's.
_GLOBAL_RNG = threading.Lock()


@dataclass
class TrainResult:
    """What a run produced: metrics (None if stopped early), where, and its exit status."""

    out_dir: Path
    metrics: dict[str, Any] | None
    summary: dict[str, Any] | None
    exit_code: int = 0
    checkpoint: Path | None = None


def train(config: TrainConfig, comm: Communicator) -> TrainResult:
    """Run one training job as `config` says; collective.

    Raises:
        CollectiveError: bad input found on any rank, before the expensive work where it can
            be checked then; TrainingDiverged when the loss stops being finite.
    """
    started = time.perf_counter()
    agree(comm, config.validate)
    show = comm.rank == 0 and not config.quiet

    def say(text: str) -> None:
        if show:
            print(text, flush=True)

    checkpoint = root_value(comm, lambda: _read_checkpoint(config.resume))
    folder, clear = root_value(comm, lambda: prepare_out(config, checkpoint))
    out = Path(folder)
    given = config.out or folder  # what the user named, for messages

    def on_root(write: Callable[[], Any]) -> Any:
        return write_on_root(comm, "out", given, write)  # the CLI says --out

    replica = setup_replica(comm, config.devices, config.threads, config.emulate_slowdown)
    slowdown_at = agree(comm, lambda: slowdown_schedule(
        config.emulate_change, replica.slowdown, comm.rank, comm.size))  # fmt: skip
    workload = build_workload(comm, config.workload, config.seed, config.workload_options)
    agree(comm, lambda: _check_trainable(workload, config, comm.size, checkpoint))
    say(f"{workload.name}: {workload.description}" if workload.description else workload.name)
    make_optimizer = functools.partial(
        build_optimizer,
        name=config.optimizer,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    devices = comm.allgather(
        {"device": replica.assignment.device, "host": replica.assignment.host,
         "threads": replica.assignment.threads, "slowdown": replica.slowdown.factor}
    )  # fmt: skip
    profile_started = time.perf_counter()
    plan, profiles = make_plan(comm, config, replica, workload, make_optimizer, checkpoint, devices)
    profile_seconds = time.perf_counter() - profile_started
    if profiles is not None:
        say(format_report(build_report(profiles, plan.global_batch_size, plan.policy,
                                       min_batch=plan.min_batch, comm=plan.comm)))  # fmt: skip
    else:
        say(f"plan ({plan.policy}): batches {list(plan.batch_sizes)} of {plan.global_batch_size}")
        for note in plan_notes(plan):
            say(note)
    if config.emulate_change:
        say(f"emulated slowdown changes: {config.emulate_change} (from epoch: factors per rank)")

    device = replica.device
    with _GLOBAL_RNG:
        torch.manual_seed(config.seed)  # the workload's model initialisation
        model = workload.build_model()
    _broadcast_state(model, comm)  # rank 0's weights everywhere, however each rank seeded
    model.to(device)
    torch.manual_seed(config.seed + 1 + comm.rank)  # dropout masks differ between ranks
    optimizer = make_optimizer(model.parameters())
    loader = balanced_loader(
        plan, workload.train_set, rank=comm.rank, seed=config.seed,
        collate_fn=workload.collate_fn,
    )  # fmt: skip
    steps_per_epoch = len(loader)
    scheduler = build_scheduler(
        optimizer, config.lr_schedule, config.epochs * steps_per_epoch, steps_per_epoch,
        config.lr_step_epochs, config.lr_gamma,
    )  # fmt: skip
    position = (0, 0, 0)
    history: list[EpochRecord] = []
    evaluations: list[dict[str, Any]] = []
    if checkpoint is not None:
        position, history = restore(checkpoint, model, optimizer, scheduler, comm, device)
        evaluations = list(checkpoint.get("evaluations", []))
        say(f"resumed from {checkpoint['path']} at epoch {position[0] + 1}, step {position[1]}")

    def start_outputs() -> None:
        start_run_folder(out, given, clear, workload.outputs)
        save_toml(out / "config.toml", config)
        atomic_write_text(out / "plan.json", plan.to_json() + "\n")
        if profiles is not None:
            atomic_write_text(
                out / "profiles.json", json.dumps(profiles_to_dict(profiles), indent=2) + "\n"
            )

    on_root(start_outputs)

    evaluator = workload.get_evaluator()

    def run_eval() -> dict[str, Any]:
        return evaluate(
            model, workload.eval_set, evaluator, comm, loader.plan.weights, device=device,
            batch_size=config.eval_batch, collate_fn=workload.collate_fn,
        )  # fmt: skip

    last: dict[str, Any] = {"step": None, "path": None}  # the newest checkpoint of this run

    def snapshot(epoch: int, step: int, global_step: int) -> Path | None:
        state = checkpoint_state(
            model, optimizer, scheduler, comm, device, epoch, step, global_step, loader.plan,
            profiles, config, workload, devices, history, evaluations,
        )  # fmt: skip
        last["step"] = global_step
        last["path"] = on_root(lambda: save_checkpoint(out / CHECKPOINT_DIR, state, config.keep))
        return last["path"]

    def after_epoch(record: EpochRecord, global_step: int) -> None:
        history.append(record)
        epoch = record.epoch + 1
        if config.eval_every and epoch % config.eval_every == 0 and epoch < config.epochs:
            metrics = run_eval()
            evaluations.append({"epoch": epoch, **_headline(metrics, evaluator.headline)})
            say("  eval: " + _format_headline(metrics, evaluator.headline))
        if config.checkpoint_every and epoch % config.checkpoint_every == 0:
            snapshot(epoch, 0, global_step)

    progress = Progress(show, config.epochs, config.log_every)
    say(f"training {config.epochs} epochs of {steps_per_epoch} steps on {comm.size} rank(s)")
    stop = StopSignal()
    with stop.installed():
        result: FitResult = fit(
            model, optimizer, scheduler, loader, comm,
            loss_fn=workload.loss_fn, device=device, epochs=config.epochs,
            slowdown=replica.slowdown, start_epoch=position[0], start_step=position[1],
            global_step=position[2], weighting=config.weighting, progress=progress,
            stop=stop, after_epoch=after_epoch, replan=config.replan == "auto",
            overlap=config.overlap == "on",
            slowdown_at=slowdown_at,
        )  # fmt: skip
    plan = loader.plan  # re-planning may have switched it
    if result.stop_code:
        history.append(result.history[-1])  # the interrupted epoch never reached after_epoch
        saved = snapshot(result.epoch, result.step, result.global_step)
        saved = comm.bcast(str(saved) if saved else None, root=0)
        if comm.rank == 0:
            where = (
                f"in epoch {result.epoch + 1} after step {result.step}"
                if result.step
                else f"after epoch {result.epoch}"
            )
            print(
                f"stopped by a signal {where}; checkpoint {saved}; continue with --resume {out}",
                flush=True,
            )
        comm.barrier()
        return TrainResult(out, None, None, result.stop_code, Path(saved) if saved else None)

    metrics = run_eval()
    evaluations.append({"epoch": config.epochs, **_headline(metrics, evaluator.headline)})
    predictions = None
    if workload.predict_set is not None and workload.artifacts is not None:
        predictions = predict(
            model, workload.predict_set, comm, plan.weights, device=device,
            unit=workload.predict_unit, batch_size=config.eval_batch,
            collate_fn=workload.collate_fn,
        )  # fmt: skip
    # last["step"] is the same on every rank, so all take the collective snapshot or none.
    if last["step"] != result.global_step:
        snapshot(config.epochs, 0, result.global_step)
    final_path = last["path"]
    totals = rank_totals(comm, history)
    summary = build_summary(
        plan=plan, devices=devices, history=history, evaluations=evaluations, totals=totals,
        metrics=_headline(metrics, evaluator.headline),
        wall_seconds=time.perf_counter() - started, profile_seconds=profile_seconds,
    )  # fmt: skip

    def finish_outputs() -> list[Path]:
        atomic_write_text(out / "plan.json", plan.to_json() + "\n")  # the plan in force now
        written = [out / "metrics.json", out / "summary.json"]
        atomic_write_text(written[0], json.dumps(metrics, indent=2) + "\n")
        atomic_write_text(written[1], json.dumps(summary, indent=2) + "\n")
        if workload.artifacts is not None:
            title = f"{workload.name}, {comm.size} rank(s), policy {plan.policy}"
            written += workload.artifacts(ArtifactContext(out, metrics, predictions, title))
        return written

    written = on_root(finish_outputs)
    if comm.rank == 0:
        shown = [str(path) for path in written] + [str(final_path), str(out / "config.toml")]
        print(format_summary(summary, evaluator.headline, shown), flush=True)
    comm.barrier()
    return TrainResult(out, metrics, summary, 0, final_path)


def _read_checkpoint(resume: str | None) -> dict[str, Any] | None:
    if not resume:
        return None
    path = find_checkpoint(resume)
    state = load_checkpoint(path)
    state["path"] = str(path)
    return state


def _check_trainable(
    workload: Workload, config: TrainConfig, world_size: int, checkpoint: dict[str, Any] | None
) -> None:
    if workload.train_set is None or workload.eval_set is None:
        raise ValueError(
            f"workload {config.workload!r} has no training or evaluation data, so it can be "
            "profiled but not trained; give its Workload a train_set and an eval_set"
        )
    # `equal`, the report's baseline, gives every rank at least one sample.
    least = max(1, config.min_batch)
    if config.global_batch < world_size * least:
        raise ValueError(
            f"global_batch={config.global_batch} is smaller than {world_size} ranks x "
            f"{least} sample(s) (min_batch={config.min_batch}, and equal gives each rank at "
            f"least 1); raise global_batch to at least {world_size * least} or launch fewer "
            "ranks"
        )
    if len(workload.train_set) < world_size:  # type: ignore[arg-type]
        raise ValueError(
            f"the training set has {len(workload.train_set)} samples, fewer than the "  # type: ignore[arg-type]
            f"{world_size} ranks; use more training data or fewer ranks"
        )
    samples = len(workload.train_set)  # type: ignore[arg-type]
    if config.global_batch > samples:
        # Every step would hold the whole set, short of the batch the plan and the profiling
        # are sized for (and a huge batch would be allocated to time it).
        raise ValueError(
            f"global_batch={config.global_batch} is more than the {samples} training samples; "
            f"use at most {samples} (an epoch is then one step)"
        )
    if len(workload.eval_set) == 0:  # type: ignore[arg-type]
        raise ValueError("the evaluation set is empty; the workload's split left no test data")
    if checkpoint is not None:
        _check_resumable(config, checkpoint)
        theirs, ours = dict(checkpoint.get("signature", {})), dict(workload.signature)
        if theirs != ours:
            diff = ", ".join(
                f"{k} {theirs.get(k)!r} (this run: {ours.get(k)!r})"
                for k in sorted(set(theirs) | set(ours))
                if theirs.get(k) != ours.get(k)
            )
            raise ValueError(
                f"resume {checkpoint['path']!r} was trained on another model or data: {diff}; "
                "resume with the same workload options, or start a new run"
            )


def _broadcast_state(model: nn.Module, comm: Communicator) -> None:
    for tensor in model.state_dict().values():
        if tensor.is_contiguous():
            comm.broadcast_(tensor, root=0)
        else:
            copy = tensor.contiguous()
            comm.broadcast_(copy, root=0)
            tensor.copy_(copy)


# Settings a resumed run must keep: its optimizer state, schedule, data order and split were
# made under them, so a change would silently not apply or train on test pixels.
_KEPT_ON_RESUME = (
    "optimizer", "lr", "momentum", "weight_decay", "lr_schedule", "lr_step_epochs", "lr_gamma",
    "seed", "weighting",
)  # fmt: skip


def _check_resumable(config: TrainConfig, checkpoint: dict[str, Any]) -> None:
    theirs = dict(checkpoint.get("config", {}))
    for name in _KEPT_ON_RESUME:
        if name in theirs and theirs[name] != getattr(config, name):
            raise ValueError(
                f"resume {checkpoint['path']!r} was trained with {name}={theirs[name]!r}, this "
                f"run asks for {name}={getattr(config, name)!r}; leave it out to continue, or "
                "start a new run"
            )
    if int(checkpoint["epoch"]) > config.epochs:
        raise ValueError(
            f"resume {checkpoint['path']!r} is already at epoch {checkpoint['epoch']}, beyond "
            f"epochs={config.epochs}; give epochs of at least {checkpoint['epoch']}"
        )
    saved_batch = int(checkpoint["plan"]["global_batch_size"])
    if int(checkpoint["step"]) and saved_batch != config.global_batch:
        raise ValueError(
            f"resume {checkpoint['path']!r} stopped mid-epoch with global_batch={saved_batch}; "
            f"continue with that global_batch (asked: {config.global_batch}), or resume from "
            "a checkpoint taken at the end of an epoch"
        )


def _headline(metrics: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: metrics[name] for name in names if name in metrics}


def _format_headline(metrics: dict[str, Any], names: tuple[str, ...]) -> str:
    return "  ".join(f"{name} {metrics[name]:.4f}" for name in names if name in metrics)
