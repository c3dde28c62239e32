"""One validated `TrainConfig`: defaults, then a TOML file, then explicit values.

The config speaks the library's parameter names (``global_batch``, ``emulate_slowdown``);
the CLI maps flags onto them and turns the names back into flags in error messages. The
effective config is written into the run folder as ``config.toml``, and ``--config`` reads
such a file back, so a run can be repeated exactly.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from lbtrain.balancer import POLICIES
from lbtrain.workloads import DEFAULT_WORKLOAD

__all__ = [
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "WEIGHTINGS",
    "TrainConfig",
    "load_toml",
    "save_toml",
]

OPTIMIZERS = ("adam", "sgd")
LR_SCHEDULES = ("cosine", "constant", "step")
# "share" is lbtrain's exact b_i / B; "uniform" is DDP's and Horovod's 1 / P, kept only to
# compare against (it over-weights the ranks with small batches).
WEIGHTINGS = ("share", "uniform")
REPLAN_MODES = ("auto", "off")
OVERLAP_MODES = ("on", "off")
DIVERGENCE_MODES = ("on", "off")
CURVES_MODES = ("on", "off")
LOG_LEVELS = ("debug", "info", "warning")


@dataclass
class TrainConfig:
    """Everything one training run needs, in the library's own parameter names.

    Args:
        workload: workload name, entry point or "module:function".
        workload_options: values of the workload's own options.
        epochs: passes over the training set.
        global_batch: B, samples per synchronous step summed over all ranks.
        policy: "equal", "proportional" or "cost".
        min_batch: smallest batch a rank may be given; 0 (the default) lets the cost policy
            leave out a rank whose fixed cost per step outlasts the others' step.
        optimizer: "adam" or "sgd".
        lr: initial learning rate.
        momentum: SGD momentum.
        weight_decay: L2 penalty of the optimizer.
        lr_schedule: "cosine" (decay to 0 over the run), "constant" or "step".
        lr_step_epochs: with "step", multiply the rate by lr_gamma every this many epochs.
        lr_gamma: the step schedule's factor.
        seed: seed of the data split, the model's initialisation and the shuffling.
        devices: "auto", one device for all ranks, or one per rank.
        threads: CPU threads per rank (None: the rank's cores over the node's ranks sharing
            them).
        flush_denormals: "on" flushes subnormal floats to zero on every CPU thread that
            computes (lbtrain.flush_denormals); "off" leaves them.
        emulate_slowdown: testing aid, one factor per rank ("1,2,4") or None.
        emulate_change: testing aid, slowdowns that change mid-run: "EPOCH:F0,F1,..."
            entries separated by ";" (from that epoch, counted from 1), or None.
        replan: "auto" switches every rank to the plan the measured compute times imply,
            once the evidence holds (lbtrain.trainer.replanner.Replanner: two epochs or more,
            and a gain above 2% even with each rate pulled 3 standard errors toward the
            others'); "off" keeps the plan.
        time_budget: seconds of profiling per rank, re-timing at the plan's batches
            included (the ladder takes 75% of it); short by default (2 s), since the
            re-planner then refines the first plan from what training measures.
        profiles: reuse a profiles file instead of profiling.
        plan: reuse a plan file instead of profiling and planning.
        eval_every: evaluate every this many epochs (0: only at the end).
        eval_batch: samples per forward pass when evaluating.
        checkpoint_every: write a checkpoint every this many epochs (0: only at the end).
        keep: checkpoints kept (the newest).
        out: output folder (None: a fresh runs/<date-time>). A folder that is not empty
            is refused unless `overwrite`.
        overwrite: write into a non-empty `out`; an earlier run's files there are removed
            once the plan stands (other files are left).
        resume: a checkpoint file or a run folder to continue.
        weighting: "share" (exact) or "uniform" (DDP's 1/P, to compare).
        overlap: "on" starts each gradient bucket's allreduce during backward, once its
            gradients are in; "off" reduces them all after backward (same result).
        sync_batchnorm: "on" normalises BatchNorm layers over the global batch
            (lbtrain.SyncBatchNorm: exact, two small allreduces per layer and step); "off"
            over each rank's own share (not exact; for comparison).
        quiet: print only the final summary.
        log_every: also print a line every this many steps (0: one per epoch).
        divergence: "on" stops the run (exit 1) when the loss runs away: a step's loss
            above 1000 x the first step's, or 8 epochs of growth to above the first epoch's.
        curves: "on" draws curves.png in the run folder at the end (needs matplotlib);
            "off" leaves it out (metrics.jsonl holds the same figures).
        trace: write a Chrome/Perfetto trace of each rank's steps to this file (None: no).
        tensorboard: also log the metrics to TensorBoard in this folder (None: no).
        log_level: the library's diagnostic lines: "info" (rank 0), "debug" (every rank,
            the re-planner's reasoning and the profiling phases) or "warning".
    """

    workload: str = DEFAULT_WORKLOAD
    workload_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 60
    global_batch: int = 64
    policy: str = "cost"
    min_batch: int = 0
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: str = "cosine"
    lr_step_epochs: int = 30
    lr_gamma: float = 0.1
    seed: int = 0
    devices: str = "auto"
    threads: int | None = None
    flush_denormals: str = "on"
    emulate_slowdown: str | None = None
    emulate_change: str | None = None
    replan: str = "auto"
    time_budget: float = 2.0
    profiles: str | None = None
    plan: str | None = None
    eval_every: int = 0
    eval_batch: int = 256
    checkpoint_every: int = 1
    keep: int = 2
    out: str | None = None
    overwrite: bool = False
    resume: str | None = None
    weighting: str = "share"
    overlap: str = "on"
    sync_batchnorm: str = "on"
    quiet: bool = False
    log_every: int = 0
    divergence: str = "on"
    curves: str = "on"
    trace: str | None = None
    tensorboard: str | None = None
    log_level: str = "info"

    def validate(self) -> TrainConfig:
        """Check every value; raise one ValueError naming the parameter, value and fix."""
        _whole(self, "epochs", 1)
        _whole(self, "global_batch", 1)
        _whole(self, "min_batch", 0)
        _whole(self, "lr_step_epochs", 1)
        _whole(self, "eval_every", 0)
        _whole(self, "eval_batch", 1)
        _whole(self, "checkpoint_every", 0)
        _whole(self, "keep", 1)
        _whole(self, "log_every", 0)
        # Any whole seed, as before: a run resumed from a checkpoint keeps its seed (the
        # command line takes 0 to 2^32 - 1 for a new one, what every workload here accepts).
        _whole(self, "seed", None)
        if self.threads is not None:
            _whole(self, "threads", 1)
        _choice(self, "policy", POLICIES)
        _choice(self, "optimizer", OPTIMIZERS)
        _choice(self, "lr_schedule", LR_SCHEDULES)
        _choice(self, "weighting", WEIGHTINGS)
        _choice(self, "replan", REPLAN_MODES)
        _choice(self, "overlap", OVERLAP_MODES)
        _choice(self, "sync_batchnorm", OVERLAP_MODES)
        _choice(self, "flush_denormals", OVERLAP_MODES)
        _choice(self, "divergence", DIVERGENCE_MODES)
        _choice(self, "curves", CURVES_MODES)
        _choice(self, "log_level", LOG_LEVELS)
        _number(self, "lr", low=0.0, open_low=True)
        _number(self, "momentum", low=0.0, high=1.0, open_high=True)
        _number(self, "weight_decay", low=0.0)
        _number(self, "lr_gamma", low=0.0, high=1.0, open_low=True)
        _number(self, "time_budget", low=0.0, open_low=True)
        if not isinstance(self.workload_options, dict):
            raise ValueError(
                f"workload_options={self.workload_options!r} must be a table of option values"
            )
        if self.out is not None and not (isinstance(self.out, str) and self.out.strip()):
            raise ValueError(
                f"out={self.out!r} is not a folder name; name one, or drop it for a "
                "new runs/<date-time>"
            )
        for name in ("overwrite", "quiet"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        _inside_run("trace", self.trace, ".json")
        _inside_run("tensorboard", self.tensorboard, "")
        if self.profiles and self.plan:
            raise ValueError(
                f"profiles={self.profiles!r} and plan={self.plan!r} are both given; a plan "
                "already fixes the batches: drop the profiles file"
            )
        # A plan's own policy and smallest batch are checked against it once it is read
        # (lbtrain.trainer.initial_plan); a time budget beside it is harmless: nothing is profiled.
        return self

    def to_dict(self) -> dict[str, Any]:
        """The config as plain values (None entries left out, as TOML has no null)."""
        data = dataclasses.asdict(self)
        data["workload_options"] = {k: v for k, v in self.workload_options.items() if v is not None}
        return {k: v for k, v in data.items() if v is not None}

    def recipe(self) -> dict[str, Any]:
        """The settings that make the run from scratch: `to_dict` less where it was written
        and what it continued (a run folder's summary.json records those), so that a
        `--config` of a resumed run starts afresh in a new folder instead of resuming."""
        data = self.to_dict()
        for name in RUN_ONLY:
            data.pop(name, None)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "config") -> TrainConfig:
        """Build from a mapping; an unknown key is a ValueError naming `source` and the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown setting(s) {', '.join(unknown)}; {KEYS_ARE}"
                f"{', '.join(sorted(known - {'workload_options'}))} and a [workload_options] table"
            )
        return cls(**dict(data))


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a run's TOML config into a plain dict; one-line errors name the file."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ValueError(f"config file {str(path)!r} does not exist; check the path") from None
    except IsADirectoryError:
        raise ValueError(f"config file {str(path)!r} is a folder; name a .toml file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


# Introduces a list of the settings as a file names them (the CLI leaves what follows it in
# snake case, where it turns the library's names elsewhere in a message into flags).
KEYS_ARE = "a config file takes the keys "

# Settings of one launch, not of the recipe: the output folder and what it continued.
RUN_ONLY = ("out", "overwrite", "resume")


def save_toml(path: str | Path, config: TrainConfig) -> Path:
    """Write the run's recipe as TOML (atomically, as every output of a run)."""
    from lbtrain.outputs import atomic_write_bytes

    return atomic_write_bytes(path, (_TOML_HEADER + tomli_w.dumps(config.recipe())).encode())


# Said in the file itself, since a user who edits it would expect `--resume` to read it.
_TOML_HEADER = (
    "# The settings of this run, as lbtrain train wrote them: a record, not read back by\n"
    "# --resume (which continues the checkpoint's settings; change those with flags, such\n"
    "# as --epochs N). Start a new run from this file with --config FILE.\n"
)


def _inside_run(name: str, value: Any, suffix: str) -> None:
    """A file or folder named relative to the run folder, inside it."""
    if value is None:
        return
    path = Path(str(value))
    if not isinstance(value, str) or not value.strip() or path.is_absolute() or ".." in path.parts:
        raise ValueError(
            f"{name}={value!r} must name a path inside the run folder (out=...), relative to "
            f"it, such as {'trace.json' if suffix else 'tensorboard'}"
        )
    if suffix and path.suffix != suffix:
        raise ValueError(f"{name}={value!r} must end in {suffix} (a Chrome/Perfetto JSON trace)")


def _whole(config: TrainConfig, name: str, minimum: int | None) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be a whole number")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")


def _choice(config: TrainConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is unknown; choose one of {', '.join(choices)}")


def _number(
    config: TrainConfig,
    name: str,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if low is not None and (value < low or (open_low and value == low)):
        bound = ">" if open_low else ">="
        raise ValueError(f"{name}={value} must be {bound} {low:g}")
    if high is not None and (value > high or (open_high and value == high)):
        bound = "<" if open_high else "<="
        raise ValueError(f"{name}={value} must be {bound} {high:g}")
