"""One validated `TrainConfig`: defaults, then a TOML file, then explicit values.

The config speaks the library's parameter names (``global_batch``, ``emulate_slowdown``);
the CLI maps flags onto them and turns the names back into flags in help and in error
messages. Each setting is described once, in its field's metadata (lbtrain.trainer.settings),
which `lbtrain train --help` and docs/cli.md are generated from. The
effective config is written into the run folder as ``config.toml``, and ``--config`` reads
such a file back, so a run can be repeated exactly.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import torch

from lbtrain.balancer import POLICIES

# The help of the settings quotes these: read from the code, never typed again. (Importing
# them costs nothing more: the package lbtrain.trainer imports all its modules anyway.)
from lbtrain.profiling.measured_plan import LADDER_SHARE
from lbtrain.trainer.callbacks import (
    CHECKPOINT_SHARE,
    DIVERGENCE_FACTOR,
    DIVERGENCE_PATIENCE,
)
from lbtrain.trainer.replanner import MIN_EPOCHS, REPLAN_GAIN, SIGMAS
from lbtrain.trainer.settings import (
    GROUPS,
    check_setting,
    describe,
    read_on_off,
    setting,
    settings_of,
)
from lbtrain.workloads import DEFAULT_WORKLOAD

__all__ = [
    "LOG_LEVELS",
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "REPLAN_MODES",
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
LOG_LEVELS = ("debug", "info", "warning")

RUN, BALANCE, OPTIM, EVAL = GROUPS
# The smallest normal float32: below it, a CPU takes the slow path unless it flushes.
_TINY = torch.finfo(torch.float32).tiny


@dataclass
class TrainConfig:
    """Everything one training run needs, in the library's own parameter names.

    Each field's help, default and bounds are written once, in its metadata
    (`lbtrain.trainer.settings.setting`): `validate` checks them, and `lbtrain train --help`
    and docs/cli.md are generated from them (`help(TrainConfig)` lists them below).
    """

    workload: str = setting(
        DEFAULT_WORKLOAD, "what to train: a workload name, an entry point of group "
        "lbtrain.workloads, or package.module:function", RUN, metavar="NAME")  # fmt: skip
    workload_options: dict[str, Any] = setting(
        {}, "values of the workload's own options: a [workload_options] table in a config "
        "file, flags of their own on the command line", None)  # fmt: skip
    epochs: int = setting(60, "passes over the training set", RUN, low=1)
    global_batch: int = setting(
        64, "B, samples per synchronous step, summed over all ranks", RUN, low=1)  # fmt: skip
    policy: str = setting(
        "cost", "how to share the global batch: equal (the unbalanced baseline), proportional "
        "(to throughput) or cost (alpha-beta model, fixed cost per step included)", BALANCE,
        choices=POLICIES)  # fmt: skip
    min_batch: int = setting(
        0, "smallest batch any rank may get; with 0 the cost policy gives no samples to a rank "
        "whose fixed cost per step outlasts the others' step (it then only joins the sync); "
        "1 gives every rank a share", BALANCE, low=0)  # fmt: skip
    optimizer: str = setting("adam", "the optimizer", OPTIM, choices=OPTIMIZERS)
    lr: float = setting(1e-3, "initial learning rate", OPTIM, low=0.0, open_low=True)
    momentum: float = setting(0.9, "SGD momentum", OPTIM, low=0.0, high=1.0, open_high=True)
    weight_decay: float = setting(0.0, "L2 weight decay of the optimizer", OPTIM, low=0.0)
    lr_schedule: str = setting(
        "cosine", "cosine: decay to 0 over the run; constant; step: multiply the rate by "
        "lr_gamma every lr_step_epochs epochs", OPTIM, choices=LR_SCHEDULES)  # fmt: skip
    lr_step_epochs: int = setting(30, "period of the step schedule, in epochs", OPTIM, low=1)
    lr_gamma: float = setting(
        0.1, "factor of the step schedule", OPTIM, low=0.0, high=1.0, open_low=True)  # fmt: skip
    # Any whole seed: a run resumed from a checkpoint keeps its seed (the command line takes
    # 0 to 2^32 - 1 for a new one, what every workload here accepts).
    seed: int = setting(
        0, "seed of the data split, the model's initialisation and the shuffling, from 0 "
        "to 2^32 - 1", RUN, low=None)  # fmt: skip
    devices: str = setting(
        "auto", "device per rank: auto (cuda:<local rank> where the node has a GPU for the "
        "rank, else cpu), one entry for all ranks (cpu, cuda, cuda:K), or one per rank such "
        "as cpu,cpu,cuda:0", BALANCE, metavar="DEVICES")  # fmt: skip
    threads: int | None = setting(
        None, "torch CPU threads per rank; a launcher that binds each rank to its own cores "
        "(srun -c 8) leaves each all of them; OMP_NUM_THREADS is not read (torchrun sets it "
        "to 1 for every job of more than one rank per node)", BALANCE, kind="int", low=1,
        default_text="the rank's cores divided by the ranks of its node that share them, "
        "at least 1")  # fmt: skip
    flush_denormals: bool = setting(
        True, "on: flush subnormal floats to zero on every CPU thread that computes, the "
        f"rank's and torch's workers (values below {_TINY:.2g} become 0), so a converging "
        "model's CPU step keeps its speed and its plan; off: leave them, and the slow path "
        "that meets them; profile with what training will use", BALANCE, on_off=True)  # fmt: skip
    emulate_slowdown: str | None = setting(
        None, "testing aid: rank i sleeps (F_i - 1) x each step's compute, like a device F_i "
        "times slower; one factor from 1 to 1000 per rank, or one for all", BALANCE,
        metavar="F0,F1,...")  # fmt: skip
    emulate_change: str | None = setting(
        None, "testing aid: change the emulated slowdowns mid-run; EPOCH:F0,F1,... sets the "
        "factors from that epoch (counted from 1) on, e.g. 3:4,1; several entries separated "
        "by ';'", BALANCE, metavar="E:F0,F1")  # fmt: skip
    replan: str = setting(
        "auto", "auto: at each epoch's end, compare what each rank measured with its speed "
        "model and switch every rank to a better plan once the evidence holds: "
        f"{MIN_EPOCHS} epochs or more, and a gain above {REPLAN_GAIN:.0%} even with each "
        f"rank's rate pulled {SIGMAS:g} standard errors toward the others' (exact either "
        "way); off: keep the first plan and its profiled prediction", BALANCE,
        choices=REPLAN_MODES)  # fmt: skip
    time_budget: float = setting(
        2.0, "seconds each rank spends profiling, about, re-timing at the plan's batches "
        f"included (the ladder of batch sizes takes {LADDER_SHARE:.0%} of it); short, since "
        "the re-planner refines the first plan from what training measures", BALANCE,
        low=0.0, open_low=True, metavar="SECONDS")  # fmt: skip
    profiles: str | None = setting(
        None, "reuse a profiles JSON from `lbtrain profile` instead of profiling", BALANCE,
        metavar="FILE", default_text="profile now")  # fmt: skip
    plan: str | None = setting(
        None, "reuse a plan.json from an earlier run: no profiling, no planning; its "
        "re-plans keep its policy and smallest batch, so another policy, or a min_batch it "
        "does not meet, is refused beside it", BALANCE, metavar="FILE",
        default_text="plan now")  # fmt: skip
    eval_every: int = setting(0, "evaluate every N epochs (0: only at the end)", EVAL, low=0)
    eval_batch: int = setting(256, "samples per forward pass when evaluating", EVAL, low=1)
    # 0 by default: by time (checkpoint_seconds) and at the end. A checkpoint after every
    # epoch cost a 60-epoch HybridSN run on a GPU 27% of its time (61 MB after 0.4-s epochs).
    checkpoint_every: int = setting(
        0, "also write a checkpoint every N epochs (0: not by epochs; those by "
        "checkpoint_seconds and the last one are written either way)", EVAL, low=0)  # fmt: skip
    checkpoint_seconds: float = setting(
        60.0, "also write a checkpoint every S seconds of training, mid-epoch too, so a lost "
        "rank costs at most about that much work; longer where writing one would otherwise "
        f"take more than {CHECKPOINT_SHARE:.0%} of the training time (0: none by time; the last "
        "one, and those of checkpoint_every)",
        EVAL, low=0.0, metavar="S")  # fmt: skip
    keep: int = setting(2, "checkpoints kept, the newest", EVAL, low=1)
    out: str | None = setting(
        None, "output folder; one that is not empty is refused unless overwrite=True", RUN,
        metavar="DIR", default_text="a new runs/<date-time>")  # fmt: skip
    overwrite: bool = setting(
        False, "write into an output folder that is not empty: an earlier run's files there "
        "are removed once the plan stands, other files are left", RUN, negatable=False,
        default_text="refuse a folder that is not empty")  # fmt: skip
    resume: str | None = setting(
        None, "continue from a checkpoint file or a run folder; its settings are the "
        "defaults, the settings given override them; auto: continue the run in out from "
        "its newest checkpoint that reads (a damaged one is moved aside, with a warning), "
        "or start it there when it has none (the same command "
        "starts a run and continues it after a restart; a folder holding another "
        "recipe is refused)", RUN, metavar="PATH|auto", default_text="start afresh")  # fmt: skip
    weighting: str = setting(
        "share", "gradient weights: share (b_i/B, exact) or uniform (1/P, as DDP and Horovod; "
        "not exact with unequal batches, for comparison only)", OPTIM,
        choices=WEIGHTINGS)  # fmt: skip
    overlap: bool = setting(
        True, "on: start each gradient bucket's allreduce during backward, as soon as its "
        "gradients are in; off: reduce them all after backward (the same result; for "
        "comparison)", OPTIM, on_off=True)  # fmt: skip
    sync_batchnorm: bool = setting(
        True, "on: BatchNorm layers normalise over the global batch, exact as one process "
        "(two small allreduces per layer and step, counted in the plan's sync time); off: "
        "over each rank's own share, as DDP without SyncBatchNorm (not exact; for "
        "comparison)", OPTIM, on_off=True)  # fmt: skip
    quiet: bool = setting(
        False, "on: print only the final summary; off: progress and report too, also where "
        "the run resumed was quiet", RUN)  # fmt: skip
    log_every: int = setting(
        0, "also print a line every N steps when output is not a terminal (0: one line per "
        "epoch)", RUN, low=0)  # fmt: skip
    divergence: bool = setting(
        True, "on: stop with exit 1 when the loss runs away (a step's loss above "
        f"{DIVERGENCE_FACTOR:g} x the first step's, or {DIVERGENCE_PATIENCE} epochs of growth "
        "to above the first epoch's); off: train on whatever happens (a NaN or infinite loss "
        "stops the run either way)", EVAL, on_off=True)  # fmt: skip
    curves: bool = setting(
        True, "on: draw curves.png (loss, accuracy, measured and predicted step, idle per "
        "rank) in the run folder at the end (needs matplotlib); off: leave it out, for many "
        "short runs (metrics.jsonl has the same figures)", EVAL, on_off=True)  # fmt: skip
    trace: str | None = setting(
        None, "write a Chrome/Perfetto trace of every rank's steps (compute, gradient sync, "
        "waiting for the slowest) to FILE in the run folder; open it at ui.perfetto.dev",
        EVAL, metavar="FILE")  # fmt: skip
    tensorboard: str | None = setting(
        None, "also log the per-epoch metrics to TensorBoard in DIR, in the run folder "
        "(needs the tensorboard package: pip install 'lbtrain[tensorboard]')", EVAL,
        metavar="DIR")  # fmt: skip
    log_level: str = setting(
        "info", "the library's diagnostic lines on stderr: info (rank 0), debug (every rank, "
        "tagged: the re-planner's reasoning, the profiling phases) or warning", RUN,
        choices=LOG_LEVELS)  # fmt: skip

    def validate(self) -> TrainConfig:
        """Check every value; raise one ValueError naming the parameter, value and fix."""
        if self.out is not None and not (isinstance(self.out, str) and self.out.strip()):
            raise ValueError(
                f"out={self.out!r} is not a folder name; name one, or drop it for a "
                "new runs/<date-time>"
            )
        for entry in settings_of(TrainConfig):
            check_setting(entry, getattr(self, entry.name))
        if not isinstance(self.workload_options, dict):
            raise ValueError(
                f"workload_options={self.workload_options!r} must be a table of option values"
            )
        if self.resume == "auto" and not self.out:
            raise ValueError(
                "resume='auto' continues the run in the folder that out=DIR names, and none "
                "is given: name the run's folder"
            )
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
        """Build from a mapping; an unknown key is a ValueError naming `source` and the key.

        The old "on"/"off" of the boolean settings (a config file or a checkpoint written
        before they were booleans) are read as True/False, for one release.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown setting(s) {', '.join(unknown)}; {KEYS_ARE}"
                f"{', '.join(sorted(known - {'workload_options'}))} and a [workload_options] table"
            )
        return cls(**read_on_off(cls, data))


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
    if (
        not isinstance(value, str)
        or not path.parts  # "." or "./": the run folder itself
        or path.is_absolute()
        or ".." in path.parts
    ):
        raise ValueError(
            f"{name}={value!r} must name a path inside the run folder (out=...), relative to "
            f"it, such as {'trace.json' if suffix else 'tensorboard'}"
        )
    if suffix and path.suffix != suffix:
        raise ValueError(f"{name}={value!r} must end in {suffix} (a Chrome/Perfetto JSON trace)")


# help(TrainConfig) shows every setting, from the one description each field carries.
TrainConfig.__doc__ = (
    f"{(TrainConfig.__doc__ or '').rstrip()}\n\n    Settings:\n\n{describe(TrainConfig)}\n"
)
