"""What the CLI verbs share: user errors, collective checks, and the profiling options."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from lbtrain.cli.flags import (
    HelpFormatter,
    add_setting,
    non_negative_int,
    positive_float,
    positive_int,
    seed_int,
)
from lbtrain.collective import USER_ERRORS, CollectiveError, agree, write_on_root
from lbtrain.comm import BACKENDS, Communicator
from lbtrain.outputs import writing
from lbtrain.profiling import ProfileConfig, ReplicaProfile
from lbtrain.session import (
    build_workload,
    load_profiles_collective,
    profile_workload,
    setup_replica,
)
from lbtrain.workloads import DEFAULT_WORKLOAD, WorkloadOption, available_workloads, get_plugin

__all__ = [
    "USER_ERRORS",
    "CLIError",
    "CollectiveError",
    "HelpFormatter",
    "add_backend_argument",
    "add_profiling_arguments",
    "add_workload_options",
    "agree",
    "check_plot_path",
    "check_writable",
    "given_workload_options",
    "load_profiles_collective",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "run_profiling",
    "seed_int",
    "show_defaults",
    "write_on_root",
]


class CLIError(Exception):
    """A user error on this rank: printed as one line, then the job is aborted."""


def check_writable(path: str, option: str) -> None:
    """Fail now, before minutes of profiling, if the output file could not be written later.

    Args:
        path: the file rank 0 will write.
        option: the flag that named it, for the message.
    """
    if not path.strip():
        raise ValueError(f"{option} {path!r} is empty; name a file")
    with writing(option, path):  # a name too long, a loop of links: one line naming it
        if Path(path).expanduser().is_dir():
            raise ValueError(f"{option} {path!r} is a folder; name a file inside it instead")
        folder = Path(path).expanduser().resolve().parent
        found = folder.exists()
    if found and not folder.is_dir():
        raise ValueError(
            f"{option} {path!r}: {str(folder)!r} is a file, not a folder; name a file in a folder"
        )
    if not found:
        raise ValueError(
            f"{option} {path!r}: folder {str(folder)!r} does not exist; create it first"
        )
    if not os.access(folder, os.W_OK):
        raise ValueError(
            f"{option} {path!r}: folder {str(folder)!r} is not writable; choose another"
        )
    # Permission bits do not tell everything (a read-only mount, /sys, root's access()): a
    # file of our own is made and taken away in that folder, so the write fails now, not
    # after the work. (Not the target's name: it may be a link, or another's to create.)
    with writing(option, path):
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".lbtrain-probe-"):
                pass
        except OSError as exc:  # named by its folder: the probe's name means nothing to a user
            raise OSError(exc.errno, exc.strerror, str(folder)) from None


# Image formats matplotlib writes (its savefig picks the format from the file's extension).
PLOT_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp", "gif")


def check_plot_path(path: str, option: str = "--plot") -> None:
    """Fail now if `path` cannot become the image file the user named: before any work.

    The format comes from the extension, so a folder, a missing extension or an unknown one
    would otherwise fail (or land somewhere else) only after the report is computed.
    """
    target = Path(path).expanduser()
    with writing(option, path):
        folder = target.is_dir()
    if folder:
        raise ValueError(
            f"{option} {path!r} is a folder; name an image file in it, e.g. "
            f"{str(target / 'report.png')!r}"
        )
    suffix = target.suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        found = f"extension .{suffix}" if suffix else "no extension"
        raise ValueError(
            f"{option} {path!r} has {found}; the format comes from it: end the name with one "
            f"of {', '.join('.' + f for f in PLOT_FORMATS)}"
        )
    check_writable(path, option)


def batch_size_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated increasing batch sizes."""
    try:
        sizes = tuple(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of whole numbers, e.g. 16,32,64"
        ) from None
    if any(b < 1 for b in sizes) or list(sizes) != sorted(set(sizes)):
        raise argparse.ArgumentTypeError(f"{text!r} must be distinct increasing sizes >= 1")
    return sizes


def add_backend_argument(group: Any, default: str = "auto") -> None:
    """Add `--backend`: torch.distributed's transport of CUDA buffers under torchrun.

    The communicator is built from it before the run starts (lbtrain.cli.entry), so it is a
    property of the launch, like the rank count, not a run setting saved in config.toml.
    """
    group.add_argument(
        "--backend",
        choices=BACKENDS,
        default=default,
        help="under torchrun, how CUDA buffers travel: auto (NCCL where every rank is on a "
        "GPU, else gloo), gloo, or nccl (every rank must be on a GPU); objects and CPU "
        "buffers always go through gloo, and mpiexec jobs through MPI (default: auto)",
    )


def add_workload_options(parser: argparse.ArgumentParser, spec: str) -> tuple[str, ...]:
    """Add the workload's own options (a plug-in's `WorkloadOption`s) as one group of flags.

    `train`, `profile` and `balance-report` share it, so that a profile times the model and
    samples that training will use. A flag left out is absent from the parsed namespace
    (the workload's default, or a --config file's value, then applies).

    Returns:
        The names of the options added (a verb's own flag of the same name wins).
    """
    try:
        plugin = get_plugin(spec)
    except ValueError as exc:
        # The run reports the bad --workload with its fix; --help says why no options show.
        parser.add_argument_group(
            f"workload {spec!r}", f"not loaded, so its options are not listed: {exc}"
        )
        return ()
    if not plugin.options:
        return ()
    added = []
    title = f"workload {spec!r}" + (f": {plugin.description}" if plugin.description else "")
    group = parser.add_argument_group(title)
    taken = parser._option_string_actions  # argparse keeps no public index of its flags
    for option in plugin.options:
        if option.flag in taken or f"--no-{option.flag[2:]}" in taken:
            # The verb's own flag of that name wins (profile's --warmup times steps): the
            # workload's option keeps its default there (docs/workloads.md lists the names).
            continue
        added.append(option.name)
        shown = "the workload's choice" if option.default is None else option.default
        if option.type is bool:
            shown = "on" if option.default else "off"
        text = f"{option.help} (default: {shown})"
        kwargs: dict[str, Any] = {"dest": option.name, "help": text, "default": argparse.SUPPRESS}
        if option.type is bool:
            group.add_argument(option.flag, action=argparse.BooleanOptionalAction, **kwargs)
        else:
            group.add_argument(
                option.flag,
                type=_argparse_type(option),
                choices=option.choices,
                metavar=None if option.choices else option.name.upper(),
                **kwargs,
            )
    return tuple(added)


def given_workload_options(args: argparse.Namespace, spec: str) -> dict[str, Any]:
    """The workload options given on the command line, by the library's names.

    Only those the verb took as the workload's (`workload_flags`): an option shadowed by the
    verb's own flag of that name (profile's --warmup) holds the verb's value, not its own.
    """
    try:
        plugin = get_plugin(spec)
    except ValueError:
        return {}  # building the workload reports it
    names = getattr(args, "workload_flags", None)
    taken = {o.name for o in plugin.options} if names is None else set(names)
    return {name: getattr(args, name) for name in sorted(taken) if hasattr(args, name)}


def _argparse_type(option: WorkloadOption) -> Any:
    def convert(text: str) -> Any:
        try:
            return option.type(text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(option.type, "__name__", option.name)
    return convert


def add_profiling_arguments(
    parser: argparse.ArgumentParser, workload: str = DEFAULT_WORKLOAD
) -> None:
    """Add the options that control how each replica is profiled, and the workload's own.

    The options that are settings of training too (--devices, --threads, --flush-denormals,
    --emulate-slowdown) are `lbtrain train`'s flags, from TrainConfig's description of them.

    Args:
        parser: the verb's parser (its formatter_class `HelpFormatter`, for the on/off flags).
        workload: the --workload the command line names (read ahead), whose options to add.
    """
    group = parser.add_argument_group("profiling")
    group.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        help="what to profile, as `lbtrain train --workload` names it: a registered name "
        f"({', '.join(available_workloads())}), an entry point of group lbtrain.workloads, "
        "or package.module:function returning an lbtrain.workloads.Workload; the default is "
        "train's, so that the profile times the model training uses; patch-cnn is a small "
        "CNN whose steps take milliseconds, toy an MLP too fast to time reliably",
    )
    add_setting(group, "devices", default="auto")
    add_backend_argument(group)
    add_setting(group, "threads", default=None)
    add_setting(group, "flush_denormals", default=True)
    add_setting(group, "emulate_slowdown", default=None)
    group.add_argument(
        "--time-budget",
        type=positive_float,
        default=10.0,
        help="seconds each replica spends profiling, about",
    )
    _add_ladder_arguments(group)
    group.add_argument("--seed", type=seed_int, default=0, help="seed of the synthetic batches")
    parser.set_defaults(workload_flags=add_workload_options(parser, workload))


def _add_ladder_arguments(group: Any) -> None:
    """The batch sizes timed, and how often each."""
    group.add_argument(
        "--batch-sizes",
        type=batch_size_list,
        default=None,
        help="comma-separated ladder of batch sizes to time (default: 16, 32, 64, ... up to "
        "--max-batch, while the time budget lasts)",
    )
    group.add_argument(
        "--max-batch",
        type=positive_int,
        default=1024,
        help="largest batch size of the default ladder",
    )
    group.add_argument(
        "--reference-batch",
        type=positive_int,
        default=None,
        help="batch size at which each rank's samples/s is read off its fitted line, so all "
        "ranks are compared at one size (default: the largest batch every rank measured; "
        "balance-report without --profiles: the global batch divided by the ranks)",
    )
    group.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timed steps wanted per batch size (the median is kept; fast steps are "
        "repeated more, up to 50, while the budget allows, and a slow rung is cut to 3 "
        "when --time-budget runs short)",
    )
    group.add_argument(
        "--warmup",
        type=non_negative_int,
        default=2,
        help="untimed warm-up steps before timing, at most 100",
    )
    group.add_argument(
        "--no-memory-cap",
        action="store_true",
        help="skip the memory cap (CUDA out-of-memory probe, CPU RAM estimate) (default: "
        "find the cap)",
    )


def _profile_config(args: argparse.Namespace, world_size: int) -> ProfileConfig:
    if args.batch_sizes is not None and len(args.batch_sizes) == 1:
        # One rung fits no line: the fixed cost a step would read 0 and the cost policy
        # would plan as proportional does, silently.
        raise ValueError(
            f"--batch-sizes {args.batch_sizes[0]} is one size; a profile fits a line through "
            "two or more (the fixed cost a step and the cost a sample), e.g. "
            f"--batch-sizes {args.batch_sizes[0]},{2 * args.batch_sizes[0]}"
        )
    min_repeats = min(3, args.repeats)
    reference = args.reference_batch
    if reference is None and getattr(args, "global_batch", None) is not None:
        # The equal share is the batch the report's baseline runs at, and near where the
        # balanced shares fall, so the throughputs it compares are the ones that matter.
        reference = max(1, args.global_batch // world_size)
    return ProfileConfig(
        batch_sizes=args.batch_sizes,
        min_batch=min(ProfileConfig.min_batch, args.max_batch),
        max_batch=args.max_batch,
        warmup=args.warmup,
        repeats=args.repeats,
        max_repeats=max(50, args.repeats),
        min_repeats=min_repeats,
        time_budget=args.time_budget,
        memory_cap=not args.no_memory_cap,
        seed=args.seed,
        reference_batch=reference,
    )


def run_profiling(args: argparse.Namespace, comm: Communicator) -> list[ReplicaProfile]:
    """Profile every rank as the options say and return all profiles; collective."""
    config = agree(comm, lambda: _profile_config(args, comm.size))
    replica = setup_replica(
        comm, args.devices, args.threads, args.emulate_slowdown, args.flush_denormals
    )
    options = given_workload_options(args, args.workload)
    workload = build_workload(comm, args.workload, seed=args.seed, options=options)
    return profile_workload(comm, replica, workload, config)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default: X)" to every option's help that does not state its default yet.

    Used instead of ArgumentDefaultsHelpFormatter so the description keeps its layout.
    """
    for action in parser._actions:
        if not action.help or "(default" in action.help:
            continue
        if action.default is None or action.default is False:
            continue
        if action.default == argparse.SUPPRESS:
            continue
        action.help += " (default: %(default)s)"
