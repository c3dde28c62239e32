"""`lbtrain balance-report`: what each balancing policy predicts for measured replicas."""

from __future__ import annotations

import argparse

from lbtrain.balancer import POLICIES
from lbtrain.cli.common import (
    add_profiling_arguments,
    agree,
    check_writable,
    load_profiles_collective,
    positive_int,
    run_profiling,
    show_defaults,
)
from lbtrain.comm import Communicator
from lbtrain.profiling import build_report, format_report, plot_report, save_profiles
from lbtrain.profiling.report import FORMATS, require_matplotlib

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Plan one global batch under each policy from replica profiles and predict, per rank, the
batch, weight, compute and idle time per step, and per policy the step time, the speedup
over `equal`, and the efficiency (ideal step B / sum of throughputs, divided by the predicted
step). Reads --profiles FILE, or profiles every rank first when no file is given, e.g.

  lbtrain balance-report --profiles profiles.json --global-batch 1024
  mpiexec -n 3 lbtrain balance-report --emulate-slowdown 1,2,4 --policy all
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the `balance-report` verb."""
    parser = subparsers.add_parser(
        "balance-report",
        help="predict what each balancing policy buys",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profiles",
        default=None,
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
        "--min-batch", type=positive_int, default=1, help="smallest batch any rank may get"
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format")
    parser.add_argument(
        "--plot",
        default=None,
        metavar="PATH",
        help="also draw compute + idle bars per rank for each policy to this image (needs "
        "matplotlib: pip install 'lbtrain[plot]') (default: no plot)",
    )
    parser.add_argument(
        "--save-profiles",
        default=None,
        metavar="FILE",
        help="when profiling now, also write the profiles to this file (default: don't)",
    )
    add_profiling_arguments(parser)
    show_defaults(parser)
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Load or measure the profiles, then print (and optionally plot) the report on rank 0."""
    # Only rank 0 writes, so a node without matplotlib elsewhere must not fail the job.
    if args.plot:
        agree(comm, lambda: comm.rank != 0 or require_matplotlib(), name_rank=False)
        agree(comm, lambda: comm.rank != 0 or check_writable(args.plot, "--plot"), name_rank=False)
    if args.save_profiles and not args.profiles:
        agree(
            comm,
            lambda: comm.rank != 0 or check_writable(args.save_profiles, "--save-profiles"),
            name_rank=False,
        )
    if args.profiles:
        profiles = load_profiles_collective(comm, args.profiles)
    else:
        profiles = run_profiling(args, comm)
    report = agree(
        comm,
        lambda: build_report(profiles, args.global_batch, args.policy, min_batch=args.min_batch),
    )
    if comm.rank == 0:
        if args.save_profiles and not args.profiles:
            save_profiles(args.save_profiles, profiles)
        print(format_report(report, args.format))
        if args.plot:
            path = plot_report(report, args.plot)
            if args.format != "json":
                print(f"\nplot written to {path}")
    return 0
