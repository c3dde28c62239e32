"""`lbtrain balance-report`: what each balancing policy predicts for measured replicas."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from lbtrain.balancer import POLICIES
from lbtrain.cli.common import (
    CLIError,
    CollectiveError,
    HelpFormatter,
    add_profiling_arguments,
    agree,
    check_plot_path,
    check_writable,
    given_workload_options,
    load_profiles_collective,
    non_negative_int,
    positive_int,
    run_profiling,
    show_defaults,
    write_on_root,
)
from lbtrain.cli.flags import file_name
from lbtrain.comm import Communicator
from lbtrain.profiling import ReplicaProfile, save_profiles
from lbtrain.profiling.sync import comm_cost
from lbtrain.report import FORMATS, build_report, format_report, plot_report, require_matplotlib
from lbtrain.text import plural
from lbtrain.workloads import DEFAULT_WORKLOAD

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Plan one global batch under each policy from replica profiles and predict, per rank, the
batch, weight, compute and idle time per step, and per policy the compute, sync and whole
step time, the speedup over `equal`, and the efficiency (the ideal step, which no plan beats,
divided by the predicted step), with notes on ranks better left out. Reads --profiles FILE,
or profiles every rank first when no file is given, e.g.

  lbtrain balance-report --profiles profiles.json --global-batch 1024
  mpiexec -n 3 lbtrain balance-report --emulate-slowdown 1,2,4 --policy all
"""


def add_parser(
    subparsers: argparse._SubParsersAction, workload: str = DEFAULT_WORKLOAD
) -> argparse.ArgumentParser:
    """Register the `balance-report` verb."""
    parser = subparsers.add_parser(
        "balance-report",
        help="predict what each balancing policy buys",
        description=DESCRIPTION,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--profiles",
        default=None,
        type=file_name,
        metavar="FILE",
        help="profiles JSON written by `lbtrain profile`; without it, profile now (the "
        "profiling options below then apply) (default: profile now)",
    )
    parser.add_argument(
        "--global-batch",
        type=positive_int,
        default=1024,
        help="global batch size B to share among the ranks",
    )
    parser.add_argument(
        "--policy",
        choices=[*POLICIES, "all"],
        default="all",
        help="policy to report; `equal` is always computed as the baseline of the speedup",
    )
    parser.add_argument(
        "--min-batch",
        type=non_negative_int,
        default=0,
        help="smallest batch any rank may get; 0 lets the cost policy leave a rank without "
        "samples when its fixed cost per step outlasts the others' whole step, 1 turns that off",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format")
    parser.add_argument(
        "--plot",
        default=None,
        type=file_name,
        metavar="PATH",
        help="also draw compute + idle bars per rank for each policy to this image (needs "
        "matplotlib: pip install 'lbtrain[plot]') (default: no plot)",
    )
    parser.add_argument(
        "--save-profiles",
        default=None,
        type=file_name,
        metavar="FILE",
        help="when profiling now, also write the profiles to this file (default: don't)",
    )
    add_profiling_arguments(parser, workload)
    show_defaults(parser)
    # How profiling now would run: with --profiles, a value other than these is refused.
    parser.set_defaults(
        run=run, profiling_defaults={d: parser.get_default(d) for d in _PROFILING_ONLY}
    )
    return parser


# Options that shape profiling now, and nothing else (--reference-batch has its own line).
_PROFILING_ONLY = (
    "devices", "threads", "emulate_slowdown", "time_budget", "batch_sizes", "max_batch",
    "repeats", "warmup", "no_memory_cap", "seed", "workload",
)  # fmt: skip


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Load or measure the profiles, then print (and optionally plot) the report on rank 0."""
    _check_outputs(args, comm)
    _refuse_flags_beside_profiles(args)
    profiles = _profiles(args, comm)
    try:
        report = agree(
            comm,
            lambda: build_report(
                profiles,
                args.global_batch,
                args.policy,
                min_batch=args.min_batch,
                comm=comm_cost(profiles),
            ),
        )
    except CollectiveError as exc:
        raise CollectiveError(_flags(str(exc))) from None
    if args.save_profiles:
        write_on_root(
            comm, "--save-profiles", args.save_profiles,
            lambda: save_profiles(args.save_profiles, profiles),
        )  # fmt: skip
    if comm.rank == 0:
        print(format_report(report, args.format))
    if args.plot:
        path = write_on_root(comm, "--plot", args.plot, lambda: plot_report(report, args.plot))
        if comm.rank == 0 and args.format != "json":
            print(f"\nplot written to {path}")
    return 0


def _check_outputs(args: argparse.Namespace, comm: Communicator) -> None:
    """The plot and the profiles to save can be written: before minutes of profiling."""
    if args.plot and args.save_profiles and _same_file(args.plot, args.save_profiles):
        raise ValueError(
            f"--plot {args.plot!r} and --save-profiles {args.save_profiles!r} name the same "
            "file, and the plot would overwrite the profiles; name two files"
        )
    # Only rank 0 writes, so a node without matplotlib elsewhere must not fail the job.
    if args.plot:
        agree(comm, lambda: comm.rank != 0 or require_matplotlib(), name_rank=False)
        agree(comm, lambda: comm.rank != 0 or check_plot_path(args.plot), name_rank=False)
    if args.save_profiles:
        agree(
            comm,
            lambda: comm.rank != 0 or check_writable(args.save_profiles, "--save-profiles"),
            name_rank=False,
        )


def _same_file(a: str, b: str) -> bool:
    """Whether two output paths are one file (the same path, or links to one file)."""
    first, second = Path(a).expanduser(), Path(b).expanduser()
    if first.exists() and second.exists():
        return first.samefile(second)
    return first.resolve() == second.resolve()


def _refuse_flags_beside_profiles(args: argparse.Namespace) -> None:
    """Flags of profiling now are refused beside --profiles, which they would not change."""
    if args.profiles and args.save_profiles:
        # Nothing is measured to save: a flag that would be silently ignored is refused.
        raise CLIError(
            f"--save-profiles {args.save_profiles!r} saves profiles measured now; with "
            f"--profiles they are already in {args.profiles!r}: drop --save-profiles"
        )
    if args.profiles and args.reference_batch is not None:
        # The file's samples/s were read off at the batch it records; a flag that would be
        # silently ignored is refused instead.
        raise CLIError(
            f"--reference-batch {args.reference_batch} applies only when profiling now; with "
            "--profiles the file's own reference batch is used: drop the flag, or re-profile "
            "with `lbtrain profile --reference-batch N`"
        )
    defaults = getattr(args, "profiling_defaults", {})
    changed = [d for d, v in defaults.items() if getattr(args, d, v) != v]
    if args.profiles and changed:
        flags = " ".join(f"--{d.replace('_', '-')}" for d in changed)
        raise CLIError(
            f"{flags} {'shapes' if len(changed) == 1 else 'shape'} profiling now; with "
            f"--profiles the file's profiles {args.profiles!r} are used as measured (their "
            f"slowdowns and timings included): drop {flags}, or profile again with them "
            "(leave --profiles out)"
        )
    options = given_workload_options(args, args.workload)
    if args.profiles and options:
        flags = " ".join(f"--{name.replace('_', '-')}" for name in options)
        raise CLIError(
            f"{flags} {'describes' if len(options) == 1 else 'describe'} the workload to "
            "profile now; with --profiles the file's "
            f"profiles {args.profiles!r} are used as measured: drop {flags}, or profile "
            "again with them (leave --profiles out)"
        )


def _profiles(args: argparse.Namespace, comm: Communicator) -> list[ReplicaProfile]:
    """The profiles of --profiles, else measured now on every rank."""
    if args.profiles:
        return load_profiles_collective(comm, args.profiles)
    # Before minutes of profiling: equal and proportional give every rank at least one
    # sample, and at least --min-batch.
    floor = max(1, args.min_batch) if args.policy != "cost" else args.min_batch
    if comm.size * floor > args.global_batch:
        raise CLIError(
            f"--min-batch {args.min_batch} on {plural(comm.size, 'rank')} needs --global-batch "
            f">= {comm.size * floor} (policy {args.policy}), not {args.global_batch}; "
            "lower --min-batch or raise --global-batch"
        )
    return run_profiling(args, comm)


# The library's parameter names in its error messages, and this verb's flags for them.
_FLAGS = {"global_batch_size": "--global-batch", "min_batch": "--min-batch"}


def _flags(message: str) -> str:
    """Name this verb's flags where a library error names its parameters (min_batch=0)."""
    for name, flag in _FLAGS.items():
        message = re.sub(rf"(?<![\w-]){name}=", f"{flag} ", message)
    return message
