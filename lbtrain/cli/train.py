"""`lbtrain train`: profile every rank, plan batches, train with the exact weighted sync.

Settings come in three layers: TrainConfig's defaults, then `--config run.toml`, then the
flags actually given. Flags are parsed with no defaults of their own (argparse.SUPPRESS), so
a flag left out never overrides the file. The workload's own options (a plug-in declares
them as WorkloadOptions) become flags too; `--workload` is read before the parser is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

from lbtrain.cli.common import add_backend_argument, add_workload_options
from lbtrain.cli.flags import SEED_LIMIT, HelpFormatter, add_settings, flag, translate
from lbtrain.collective import agree, root_value
from lbtrain.comm import Communicator
from lbtrain.comm.launchers import shared_store_hazard
from lbtrain.text import plural
from lbtrain.trainer.checkpoint import find_checkpoint, load_checkpoint
from lbtrain.trainer.config import TrainConfig, load_toml
from lbtrain.trainer.resume import AUTO
from lbtrain.workloads import WorkloadPlugin, get_plugin

__all__ = ["add_parser", "build_config", "run", "translate", "workload_from_argv"]

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
    if spec is None and isinstance(resume, str) and resume != AUTO:
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
    """Register the `train` verb: a flag per TrainConfig setting, and `workload`'s options."""
    parser = subparsers.add_parser(
        "train",
        help="profile, plan and train on every rank, then evaluate",
        description=DESCRIPTION,
        formatter_class=HelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file of settings (the config.toml a run writes, for one); flags given on "
        "the command line override it (default: none)",
    )
    groups = add_settings(parser)
    add_backend_argument(groups["balance"], default=argparse.SUPPRESS)
    add_workload_options(parser, workload)
    parser.set_defaults(run=run)
    return parser


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
    _check_file_seed(file or {}, given.get("config", "the settings file"))
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


def _check_file_seed(file: dict[str, Any], source: str) -> None:
    """A file's seed within what --seed takes (the library keeps a resumed run's any seed;
    numpy's generators, which the workloads seed, take 0 to 2^32 - 1)."""
    seed = file.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_LIMIT:
        raise ValueError(
            f"seed = {seed!r} in {source} must be a whole number from 0 to {SEED_LIMIT} "
            "(2^32 - 1), as --seed takes"
        )


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Build the config, then train on every rank."""
    from lbtrain.collective import CollectiveError
    from lbtrain.trainer import train

    given = vars(args)
    hazard = shared_store_hazard()
    if hazard is not None and comm.rank == 0:
        warnings.warn(hazard, stacklevel=1)
    try:
        file = root_value(comm, lambda: load_toml(given["config"])) if "config" in given else {}
        resume = given.get("resume", file.get("resume"))
        # The resumed run's settings are the defaults; rank 0 alone reads the checkpoint.
        # With resume=auto the command line is the whole recipe, checked against the run's.
        auto = resume == AUTO
        base = (
            root_value(comm, lambda: _checkpoint_settings(resume)) if resume and not auto else None
        )
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
            option = flag(name)
            each = " an entry" if name == "emulate_change" else ""
            raise ValueError(
                f"{option} {value} comes from the checkpoint and does not fit this job of "
                f"{plural(world_size, 'rank')}; give {option} with "
                f"{plural(world_size, 'factor')}{each}, or {option} '' to train without it"
            ) from None


def _checkpoint_settings(path: str) -> dict[str, Any]:
    settings = dict(load_checkpoint(find_checkpoint(path))["config"])
    for name in _NOT_INHERITED:
        settings.pop(name, None)
    return settings
