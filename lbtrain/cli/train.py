"""`lbtrain train`: profile every rank, plan batches, train with the exact weighted sync.

Settings come in three layers: TrainConfig's defaults, then `--config run.toml`, then the
flags actually given. Flags are parsed with no defaults of their own (argparse.SUPPRESS), so
a flag left out never overrides the file. The workload's own options (a plug-in declares
them as WorkloadOptions) become flags too; `--workload` is read before the parser is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from lbtrain.balancer import POLICIES
from lbtrain.cli.common import (
    add_backend_argument,
    add_workload_options,
    non_negative_int,
    positive_float,
    positive_int,
    seed_int,
)
from lbtrain.collective import agree, root_value
from lbtrain.comm import Communicator
from lbtrain.text import plural
from lbtrain.trainer.checkpoint import find_checkpoint, load_checkpoint
from lbtrain.trainer.config import (
    CURVES_MODES,
    DIVERGENCE_MODES,
    KEYS_ARE,
    LOG_LEVELS,
    LR_SCHEDULES,
    OPTIMIZERS,
    OVERLAP_MODES,
    REPLAN_MODES,
    WEIGHTINGS,
    TrainConfig,
    load_toml,
)
from lbtrain.workloads import WorkloadPlugin, get_plugin

__all__ = ["add_parser", "run", "workload_from_argv"]

DEFAULTS = TrainConfig()
DEFAULT_TRAIN_WORKLOAD = DEFAULTS.workload

DESCRIPTION = """\
Train one model on every rank of the job: each rank takes its device, every rank profiles the
real workload, the balancer gives each a batch matched to its speed, and every step sums the
gradients weighted by each rank's share of the global batch, so the update is exactly the one
a single process would make. Then the test set is evaluated across ranks and the outputs go
to --out. Without a launcher it is a one-process run.

  mpiexec -n 3 lbtrain train --dataset indian_pines --model hybridsn --policy cost
  torchrun --nproc-per-node 3 -m lbtrain train --dataset indian_pines --policy cost
  lbtrain train --config run.toml --epochs 5        # flags override the file
  lbtrain train --resume runs/20261123-101500       # continue an interrupted run
"""

# Settings that only make sense for the run that wrote a checkpoint, not for its sequel.
_NOT_INHERITED = ("out", "overwrite", "resume", "plan", "profiles")


def workload_from_argv(argv: Sequence[str]) -> str:
    """The --workload a command line asks for (or its --config file, or the run it resumes)."""
    found: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for name in ("--workload", "--config", "--resume"):
            if arg == name and i + 1 < len(argv):
                found[name] = argv[i + 1]
            elif arg.startswith(name + "="):
                found[name] = arg.split("=", 1)[1]
    spec, resume = found.get("--workload"), found.get("--resume")
    if spec is None and "--config" in found:
        try:
            settings = load_toml(found["--config"])
            spec, resume = settings.get("workload"), resume or settings.get("resume")
        except ValueError:
            pass  # reported properly once the run starts
    if spec is None and isinstance(resume, str):
        spec = _resumed_workload(resume)
    return spec if isinstance(spec, str) else DEFAULT_TRAIN_WORKLOAD


def _resumed_workload(resume: str) -> str | None:
    """The workload of the run `resume` names, from the config.toml beside its checkpoints.

    Read before parsing, so that the flags of that workload's own options are accepted; the
    checkpoint itself is read later, on rank 0 alone.
    """
    try:
        run_folder = find_checkpoint(resume).resolve().parent.parent
        spec = load_toml(run_folder / "config.toml").get("workload")
    except (ValueError, OSError):
        return None  # a missing resume is reported properly once the run starts
    return spec if isinstance(spec, str) else None


def add_parser(
    subparsers: argparse._SubParsersAction, workload: str = DEFAULT_TRAIN_WORKLOAD
) -> argparse.ArgumentParser:
    """Register the `train` verb, with the options of `workload`."""
    parser = subparsers.add_parser(
        "train",
        help="profile, plan and train on every rank, then evaluate",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file of settings (the config.toml a run writes, for one); flags given on "
        "the command line override it (default: none)",
    )
    basics = parser.add_argument_group("run")
    _add(basics, "workload", "what to train: a workload name, an entry point of group "
         "lbtrain.workloads, or package.module:function", metavar="NAME")  # fmt: skip
    _add(basics, "epochs", "passes over the training set", type=positive_int)
    _add(basics, "global_batch", "samples per synchronous step, summed over all ranks",
         type=positive_int)  # fmt: skip
    _add(basics, "seed", "seed of the data split, the model's initialisation and the shuffling",
         type=seed_int)  # fmt: skip
    _add(basics, "out", "output folder (default: a new runs/<date-time>)", metavar="DIR")
    _add(basics, "overwrite", "write into a --out that is not empty: an earlier run's files "
         "there are removed once the plan stands, other files are left (default: refuse a "
         "folder that is not empty)", action="store_true")  # fmt: skip
    _add(basics, "resume", "continue from a checkpoint file or a run folder; its settings are the "
         "defaults, flags override them (default: start afresh)", metavar="PATH")  # fmt: skip
    _add(basics, "quiet", "print only the final summary; --no-quiet undoes a resumed run's "
         "(default: progress and report too)", action=argparse.BooleanOptionalAction)  # fmt: skip
    _add(basics, "log_level", "the library's diagnostic lines on stderr: info (rank 0), debug "
         "(every rank, tagged: the re-planner's reasoning, the profiling phases) or "
         "warning", choices=LOG_LEVELS)  # fmt: skip
    _add(basics, "log_every", "also print a line every N steps when output is not a terminal "
         "(0: one line per epoch)", type=non_negative_int)  # fmt: skip
    plan = parser.add_argument_group("balance")
    _add(plan, "policy", "how to share the global batch: equal (the unbalanced baseline), "
         "proportional (to throughput) or cost (alpha-beta model, fixed cost per step "
         "included)", choices=POLICIES)  # fmt: skip
    _add(
        plan,
        "min_batch",
        "smallest batch any rank may get; with 0 the cost policy gives no samples to a rank "
        "whose fixed cost per step outlasts the others' step (it then only joins the sync); "
        "1 gives every rank a share",
        type=non_negative_int,
    )
    _add(plan, "profiles", "reuse a profiles JSON from `lbtrain profile` instead of profiling "
         "(default: profile now)", metavar="FILE")  # fmt: skip
    _add(plan, "plan", "reuse a plan.json from an earlier run: no profiling, no planning "
         "(default: plan now)", metavar="FILE")  # fmt: skip
    _add(plan, "devices", "device per rank: auto (cuda:<local rank> where the node has a GPU "
         "for the rank, else cpu), one entry for all, or one per rank: cpu,cuda:0")  # fmt: skip
    add_backend_argument(plan, default=argparse.SUPPRESS)
    _add(plan, "threads", "torch CPU threads per rank (default: the rank's cores divided by "
         "the ranks of its node that share them; OMP_NUM_THREADS is not read)",
         type=positive_int)  # fmt: skip
    _add(plan, "flush_denormals", "on: flush subnormal floats to zero on every CPU thread "
         "that computes (a converged model's CPU step stays as fast as a fresh one's; values "
         "below 1.2e-38 become 0); off: leave them, and the slow path that meets them",
         choices=OVERLAP_MODES)  # fmt: skip
    _add(plan, "emulate_slowdown", "testing aid: rank i sleeps (F_i - 1) x each step's compute, "
         "like a device F_i times slower; one factor >= 1 per rank (default: none)",
         metavar="F0,F1,...")  # fmt: skip
    _add(plan, "emulate_change", "testing aid: change the emulated slowdowns mid-run; "
         "EPOCH:F0,F1,... sets the factors from that epoch (counted from 1) on, e.g. 3:4,1; "
         "several entries separated by ';' (default: none)", metavar="E:F0,F1")  # fmt: skip
    _add(plan, "replan", "auto: at each epoch's end, compare what each rank measured with its "
         "speed model and switch every rank to a better plan once the evidence holds: two "
         "epochs or more, and a gain above 2%% even with each rank's rate pulled 3 standard "
         "errors toward the others' (exact either way); off: keep the first plan and its "
         "profiled prediction", choices=REPLAN_MODES)  # fmt: skip
    _add(plan, "time_budget", "seconds each rank spends profiling, about, re-timing at the "
         "plan's batches included", type=positive_float)  # fmt: skip
    optim = parser.add_argument_group("optimisation")
    _add(optim, "optimizer", "optimizer", choices=OPTIMIZERS)
    _add(optim, "lr", "initial learning rate", type=positive_float)
    _add(optim, "momentum", "SGD momentum", type=float)
    _add(optim, "weight_decay", "L2 weight decay", type=float)
    _add(optim, "lr_schedule", "cosine: decay to 0 over the run; constant; step: x "
         "--lr-gamma every --lr-step-epochs epochs", choices=LR_SCHEDULES)  # fmt: skip
    _add(optim, "lr_step_epochs", "period of the step schedule, in epochs", type=positive_int)
    _add(optim, "lr_gamma", "factor of the step schedule", type=positive_float)
    _add(optim, "weighting", "gradient weights: share (b_i/B, exact) or uniform (1/P, as DDP "
         "and Horovod; not exact with unequal batches, for comparison only)",
         choices=WEIGHTINGS)  # fmt: skip
    _add(optim, "overlap", "on: start each gradient bucket's allreduce during backward, as "
         "soon as its gradients are in; off: reduce them all after backward (the same "
         "result; for comparison)", choices=OVERLAP_MODES)  # fmt: skip
    _add(optim, "sync_batchnorm", "on: BatchNorm layers normalise over the global batch, "
         "exact as one process (two small allreduces per layer and step); off: over each "
         "rank's own share, as DDP without SyncBatchNorm (not exact; for comparison)",
         choices=OVERLAP_MODES)  # fmt: skip
    evaluation = parser.add_argument_group("evaluation and checkpoints")
    _add(evaluation, "eval_every", "evaluate every N epochs (0: only at the end)",
         type=non_negative_int)  # fmt: skip
    _add(evaluation, "eval_batch", "samples per forward pass when evaluating", type=positive_int)
    _add(evaluation, "checkpoint_every", "write a checkpoint every N epochs (0: only at the "
         "end)", type=non_negative_int)  # fmt: skip
    _add(evaluation, "keep", "checkpoints kept, newest first", type=positive_int)
    _add(evaluation, "divergence", "on: stop with exit 1 when the loss runs away (a step's loss "
         "above 1000 x the first step's, or 8 epochs of growth above the first epoch's); "
         "off: train on whatever happens", choices=DIVERGENCE_MODES)  # fmt: skip
    _add(evaluation, "curves", "on: draw curves.png (loss, accuracy, measured and predicted "
         "step, idle per rank) in the run folder at the end; off: leave it out, for many short "
         "runs (metrics.jsonl has the same figures)", choices=CURVES_MODES)  # fmt: skip
    _add(evaluation, "trace", "write a Chrome/Perfetto trace of every rank's steps (compute, "
         "gradient sync, waiting for the slowest) to FILE in the run folder; open it at "
         "ui.perfetto.dev (default: none)", metavar="FILE")  # fmt: skip
    _add(evaluation, "tensorboard", "also log the per-epoch metrics to TensorBoard in DIR "
         "(needs the tensorboard package: pip install 'lbtrain[tensorboard]') (default: "
         "none)", metavar="DIR")  # fmt: skip
    add_workload_options(parser, workload)
    parser.set_defaults(run=run)
    return parser


def _add(group: Any, name: str, text: str, **kwargs: Any) -> None:
    default = getattr(DEFAULTS, name)
    if "(default" not in text:
        text += f" (default: {default})"
    group.add_argument("--" + name.replace("_", "-"), dest=name, help=text, **kwargs)


def build_config(
    given: dict[str, Any],
    plugin: WorkloadPlugin | None,
    base: dict[str, Any] | None = None,
    file: dict[str, Any] | None = None,
) -> TrainConfig:
    """Layer base (a checkpoint's settings), the --config file and the given flags.

    `file` is the --config file's contents when the caller has read it already.
    """
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    option_names = {o.name for o in plugin.options} if plugin else set()
    layers: list[dict[str, Any]] = [dict(base or {})]
    if file is None and "config" in given:
        file = load_toml(given["config"])
    layers.append(dict(file or {}))
    # --backend shaped the communicator before the run began: a launch property, not saved.
    layers.append({k: v for k, v in given.items() if k not in ("config", "run", "backend")})
    merged: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for layer in layers:
        options.update(layer.pop("workload_options", {}) or {})
        for key, value in layer.items():
            if key in option_names and key not in fields:
                options[key] = value
            else:
                merged[key] = value
    if plugin is not None:
        by_name = {o.name: o for o in plugin.options}
        for key, value in list(options.items()):
            option = by_name.get(key)
            if option is None:
                continue  # resolve_options names it with the valid ones
            if value is not None and option.type is not bool and not isinstance(value, bool):
                options[key] = option.type(value)
    merged["workload_options"] = options
    return TrainConfig.from_dict(merged, source=given.get("config", "settings")).validate()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_FIELD_NAMES = sorted((f.name for f in dataclasses.fields(TrainConfig)), key=len, reverse=True)


def translate(message: str) -> str:
    """Turn the library's parameter names in an error message into flag names; a list of a
    config file's keys (after `KEYS_ARE`) stays as the file spells them."""
    message, keys, listed = message.partition(KEYS_ARE)
    message = message.replace("overwrite=True", "--overwrite")
    for name in _FIELD_NAMES:
        message = re.sub(rf"(?<![\w-]){name}=", _flag(name) + " ", message)
        message = re.sub(rf"(?<![\w-]){name} (?=['\"])", _flag(name) + " ", message)
        if "_" in name:  # no English word has an underscore: a bare global_batch is the flag
            message = re.sub(rf"(?<![\w-]){name}\b", _flag(name), message)
    message = message.replace("global_batch_size=", "--global-batch ")
    return message + keys + listed


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Build the config, then train on every rank."""
    from lbtrain.collective import CollectiveError
    from lbtrain.trainer import train

    given = vars(args)
    try:
        file = root_value(comm, lambda: load_toml(given["config"])) if "config" in given else {}
        resume = given.get("resume", file.get("resume"))
        # The resumed run's settings are the defaults; rank 0 alone reads the checkpoint.
        base = root_value(comm, lambda: _checkpoint_settings(resume)) if resume else None
        spec = given.get("workload") or file.get("workload") or (base or {}).get("workload")
        plugin = agree(comm, lambda: get_plugin(spec or DEFAULT_TRAIN_WORKLOAD))
        config = agree(comm, lambda: build_config(given, plugin, base, file))
        if base:
            agree(comm, lambda: _check_inherited_emulation(base, {**file, **given}, comm.size))
        result = train(config, comm)
    except CollectiveError as exc:
        raise type(exc)(translate(str(exc))) from None
    return result.exit_code


def _check_inherited_emulation(
    base: dict[str, Any], chosen: dict[str, Any], world_size: int
) -> None:
    """A checkpoint's emulated slowdowns that do not fit this job's ranks: one line naming
    them as the checkpoint's (the user never typed them) and the two ways on."""
    from lbtrain.emulation import parse_slowdown_changes, parse_slowdowns

    for name, parse in (
        ("emulate_slowdown", parse_slowdowns),
        ("emulate_change", parse_slowdown_changes),
    ):
        value = base.get(name)
        if not value or name in chosen:
            continue
        try:
            parse(value, world_size)
        except ValueError:
            flag = _flag(name)
            each = " an entry" if name == "emulate_change" else ""
            raise ValueError(
                f"{flag} {value} comes from the checkpoint and does not fit this job of "
                f"{plural(world_size, 'rank')}; give {flag} with "
                f"{plural(world_size, 'factor')}{each}, or {flag} '' to train without it"
            ) from None


def _checkpoint_settings(path: str) -> dict[str, Any]:
    settings = dict(load_checkpoint(find_checkpoint(path))["config"])
    for name in _NOT_INHERITED:
        settings.pop(name, None)
    return settings
