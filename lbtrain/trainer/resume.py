"""Resuming: reading the checkpoint, and what a resumed run may and may not change.

A setting that would be silently ignored on resume is either applied (the plan's settings:
policy, min_batch, plan, profiles re-plan) or refused with one line naming it.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lbtrain.data.sampler import steps_per_epoch
from lbtrain.text import plural
from lbtrain.trainer.checkpoint import (
    CHECKPOINT_DIR,
    FORMAT,
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from lbtrain.trainer.config import TrainConfig
from lbtrain.trainer.data_check import same_value
from lbtrain.workloads import Workload

if TYPE_CHECKING:
    from lbtrain.trainer.engine import Engine

__all__ = [
    "AUTO",
    "check_trainable",
    "follow_schedule",
    "read_checkpoint",
    "recipe_differences",
    "resumed_from",
    "worlds_of",
]

# resume="auto": continue the run in `out` from its newest checkpoint, or start it there. The
# same command then both starts a run and continues it after a restart (an elastic agent's,
# a requeued job's), without a path to type.
AUTO = "auto"

# What makes two runs one recipe: the update sequence depends on these (the world, the
# devices and the plan do not: the global batches and the exact weighting make them the
# same on any ranks).
# The workload's own options are its signature's to judge (check_trainable): a data folder
# may move with the nodes, the data may not.
RECIPE = (
    "workload", "epochs", "global_batch", "optimizer", "lr", "momentum",
    "weight_decay", "lr_schedule", "lr_step_epochs", "lr_gamma", "seed", "weighting",
    "sync_batchnorm", "flush_denormals",
)  # fmt: skip


def read_checkpoint(resume: str | None, out: str | None = None) -> dict[str, Any] | None:
    """The checkpoint `resume` names, or with `AUTO` the newest in `out` (None: a fresh
    run); refuses another format's."""
    if not resume:
        return None
    if resume == AUTO:
        found = list_checkpoints(Path(out or ".") / CHECKPOINT_DIR)
        if not found:
            return None  # nothing to continue: the run starts in `out`
        path, state, damaged = _newest_readable(found)
        # Moved aside once the run starts (`set_aside_damaged`): a command refused before
        # then (another recipe in `out`) leaves the folder as it was.
        state["damaged"] = [str(p) for p in damaged]
    else:
        path = find_checkpoint(resume)
        state = load_checkpoint(path)
    if state.get("format") != FORMAT:
        raise ValueError(
            f"resume {str(path)!r} was written by an older lbtrain (checkpoint format "
            f"{state.get('format', 1)}, this one reads {FORMAT}) and cannot continue exactly "
            "here; start a new run"
        )
    state["path"] = str(path)
    return state


def _newest_readable(found: list[Path]) -> tuple[Path, dict[str, Any], list[Path]]:
    """The newest of a run's checkpoints that reads, for `resume=auto`: a restart goes on by
    itself past a damaged newest one (a disk's fault; the writes are atomic); and the
    damaged ones newer than it. When none reads, the newest's error."""
    first: ValueError | None = None
    for path in reversed(found):
        try:
            state = load_checkpoint(path)
        except ValueError as exc:
            first = first or exc
            continue
        return path, state, found[found.index(path) + 1 :]
    assert first is not None
    raise first


def set_aside_damaged(checkpoint: dict[str, Any] | None) -> None:
    """Move the damaged checkpoints a `resume=auto` run went past to `<name>.damaged`, with
    one warning each, so the run's list stays in order; on rank 0, as the run starts."""
    if checkpoint is None:
        return
    for name in checkpoint.get("damaged", []):
        damaged = Path(name)
        aside = damaged.with_name(damaged.name + ".damaged")
        damaged.replace(aside)
        warnings.warn(
            f"checkpoint {name!r} cannot be read; continuing from {checkpoint['path']!r} "
            f"instead (the damaged one is kept as {aside.name})",
            stacklevel=1,
        )


def recipe_differences(config: TrainConfig, saved: dict[str, Any]) -> list[str]:
    """The recipe settings in which `config` differs from a run's `saved` settings, as
    "name=theirs (here: ours)"; empty when they are one recipe."""
    differ = []
    for name in RECIPE:
        if name not in saved:  # older than the setting: not known to differ
            continue
        ours, theirs = getattr(config, name), _bool_of(saved.get(name))
        if ours != theirs:
            differ.append(f"{name}={theirs!r} (here: {ours!r})")
    return differ


def _bool_of(value: Any) -> Any:
    """A setting as saved before the switches were booleans ("on"/"off")."""
    return {"on": True, "off": False}.get(value, value) if isinstance(value, str) else value


def worlds_of(checkpoint: dict[str, Any] | None, world_size: int) -> list[dict[str, int]]:
    """The worlds a run has trained on, this one last: each with its number of ranks and the
    global step from which it trained."""
    if checkpoint is None:
        return [{"ranks": world_size, "from_step": 0}]
    worlds = [dict(w) for w in checkpoint.get("worlds") or []]
    if not worlds:  # written before worlds were kept: the checkpoint's own
        worlds = [{"ranks": len(checkpoint.get("ranks") or []) or world_size, "from_step": 0}]
    if worlds[-1]["ranks"] != world_size:
        worlds.append({"ranks": world_size, "from_step": int(checkpoint["global_step"])})
    return worlds


def resumed_from(checkpoint: dict[str, Any] | None) -> dict[str, Any] | None:
    """A resumed run's provenance for summary.json: the checkpoint and where it stood."""
    if checkpoint is None:
        return None
    return {
        "checkpoint": checkpoint["path"],
        "epoch": int(checkpoint["epoch"]),
        "step": int(checkpoint["step"]),
        "global_step": int(checkpoint["global_step"]),
    }


def check_trainable(
    workload: Workload, config: TrainConfig, world_size: int, checkpoint: dict[str, Any] | None
) -> None:
    if workload.train_set is None or workload.eval_set is None:
        raise ValueError(
            f"workload {config.workload!r} has no training or evaluation data, so it can be "
            "profiled but not trained; give its Workload a train_set and an eval_set"
        )
    # `equal`, the baseline the balance report sets every plan beside, gives each rank a
    # sample, whatever the policy that trains.
    least = max(1, config.min_batch)
    if config.global_batch < world_size * least:
        why = (
            f"{world_size} ranks x min_batch={config.min_batch}"
            if config.min_batch > 1
            else f"the {world_size} ranks (the balance report sets the plan beside equal "
            "shares, which give every rank a sample)"
        )
        raise ValueError(
            f"global_batch={config.global_batch} is smaller than {why}; raise global_batch "
            f"to at least {world_size * least} or launch fewer ranks"
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
        _check_mid_epoch_step(config, checkpoint, samples)
        # A key an older checkpoint lacks stands for the value it trained with.
        defaults = dict(workload.signature_defaults)
        theirs = {**defaults, **checkpoint.get("signature", {})}
        ours = {**defaults, **workload.signature}
        # By value, as the ranks' copies are compared: NaN, floats, arrays (data_check.py).
        differ = [
            k for k in sorted(set(theirs) | set(ours)) if not same_value(theirs.get(k), ours.get(k))
        ]
        if differ:
            diff = ", ".join(
                f"{k} {_signed(theirs, k)} (this run: {_signed(ours, k)})" for k in differ
            )
            raise ValueError(
                f"resume {checkpoint['path']!r} was trained on another model or data: {diff}; "
                "resume with the same workload options, or start a new run"
            )


def _signed(signature: dict[str, Any], key: str) -> str:
    """A signature's value for the refusal (a key neither it nor the workload's
    signature_defaults hold: a workload that left it out)."""
    return repr(signature[key]) if key in signature else "not set"


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
    done, step = int(checkpoint["epoch"]), int(checkpoint["step"])
    # A checkpoint taken mid-epoch holds steps of epoch done + 1: the run needs that many.
    needed = done + 1 if step else done
    if needed > config.epochs:
        where = f"{plural(step, 'step')} into epoch {done + 1}" if step else f"at epoch {done}"
        raise ValueError(
            f"resume {checkpoint['path']!r} is already {where}, beyond epochs={config.epochs}; "
            f"give epochs of at least {needed}"
        )
    if int(checkpoint["epoch"]) == config.epochs and not int(checkpoint["step"]):
        _check_nothing_left_changes(config, checkpoint, theirs)
    saved_batch = int(checkpoint["plan"]["global_batch_size"])
    if int(checkpoint["step"]) and saved_batch != config.global_batch:
        raise ValueError(
            f"resume {checkpoint['path']!r} stopped mid-epoch with global_batch={saved_batch}; "
            f"continue with that global_batch (asked: {config.global_batch}), or resume from "
            "a checkpoint taken at the end of an epoch (--checkpoint-every 1 writes them)"
        )


def _check_mid_epoch_step(config: TrainConfig, checkpoint: dict[str, Any], samples: int) -> None:
    """A mid-epoch checkpoint past the epoch's steps: one from before lbtrain took the same
    steps on every world, at a one-sample tail that now joins the step before (done)."""
    step = int(checkpoint["step"])
    steps = steps_per_epoch(samples, config.global_batch)
    if step and step >= steps:
        raise ValueError(
            f"resume {checkpoint['path']!r} stopped after {plural(step, 'step')} of epoch "
            f"{int(checkpoint['epoch']) + 1}, which now has only {steps} (a one-sample tail "
            "joins the step before it); resume from a checkpoint taken at the "
            "end of an epoch (--checkpoint-every 1 writes them)"
        )


# What shapes training but not evaluation: on a run with no epoch left, a change would be
# recorded in config.toml as if it had trained.
_TRAINING_ONLY = ("global_batch", "policy", "min_batch", "time_budget", "plan", "profiles")


def _check_nothing_left_changes(
    config: TrainConfig, checkpoint: dict[str, Any], theirs: dict[str, Any]
) -> None:
    for name in _TRAINING_ONLY:
        asked = getattr(config, name)
        if asked is not None and not _same_setting(asked, theirs.get(name)):
            raise ValueError(
                f"resume {checkpoint['path']!r} has all {config.epochs} epochs done, so "
                f"{name}={asked!r} would train nothing (it ran with {theirs.get(name)!r}); "
                f"leave it out to evaluate again, or raise epochs above {config.epochs} to train "
                "on with it"
            )


def _same_setting(asked: Any, saved: Any) -> bool:
    """Equal, or two names of one file (a plan or profiles given as ./plan.json, then plan.json)."""
    if asked == saved:
        return True
    if isinstance(asked, str) and isinstance(saved, str):
        try:
            return os.path.samefile(asked, saved)
        except OSError:
            return False
    return False


def follow_schedule(engine: Engine, total_steps: int, position: int | None = None) -> str | None:
    """Put the learning rate where this run's schedule has it at the resumed step; a line
    saying so when that is not where the checkpoint's left it (a cosine schedule spans the
    whole run, so more epochs move it; another batch changes the steps per epoch, which
    moves the cosine and step schedules alike).

    `position` is the step of this run's schedule the run stands at (epochs done x this
    run's steps per epoch, plus the steps of the interrupted epoch); by default the optimizer
    steps the checkpoint counted, which is it only while the steps per epoch are unchanged.
    """
    scheduler = engine.scheduler
    if position is not None:
        # Counted in the checkpoint's steps, the decay would land mid-epoch and the schedule
        # end early or run past its end (another batch).
        scheduler.last_epoch = position
    step = scheduler.last_epoch
    groups = engine.optimizer.param_groups
    was = [group["lr"] for group in groups]
    now = [
        base * factor(step)
        for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    if all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(was, now, strict=True)):
        return None
    for group, lr in zip(groups, now, strict=True):
        group["lr"] = lr
    scheduler._last_lr = list(now)  # what get_last_lr() reports until the next step
    return (
        f"the learning rate goes on at {now[0]:.3g} (the checkpoint left it at {was[0]:.3g}): "
        f"this run's schedule of {plural(total_steps, 'step')} puts step {step} there, so the "
        "run differs from an uninterrupted one"
    )
