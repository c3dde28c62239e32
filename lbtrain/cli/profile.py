"""`lbtrain profile`: measure every rank under mpiexec and write the gathered profiles."""

from __future__ import annotations

import argparse

from lbtrain.cli.common import (
    HelpFormatter,
    add_profiling_arguments,
    agree,
    check_writable,
    run_profiling,
    show_defaults,
    write_on_root,
)
from lbtrain.comm import Communicator
from lbtrain.profiling import ReplicaProfile, save_profiles
from lbtrain.workloads import DEFAULT_WORKLOAD

__all__ = ["add_parser", "format_profiles", "run"]

DESCRIPTION = """\
Time real training steps of the workload on every rank (forward, backward, optimizer step on
synthetic batches), fit t(b) = alpha + beta*b per rank, find memory caps, and write all ranks'
profiles to one JSON file. Launch it the way training will run, e.g.

  mpiexec -n 3 lbtrain profile --output profiles.json --emulate-slowdown 1,2,4
"""


def add_parser(
    subparsers: argparse._SubParsersAction, workload: str = DEFAULT_WORKLOAD
) -> argparse.ArgumentParser:
    """Register the `profile` verb."""
    parser = subparsers.add_parser(
        "profile",
        help="profile every rank and write the profiles JSON",
        description=DESCRIPTION,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--output",
        "-o",
        default="profiles.json",
        help="profiles file to write (rank 0 writes it) (default: %(default)s)",
    )
    add_profiling_arguments(parser, workload)
    show_defaults(parser)
    parser.set_defaults(run=run)
    return parser


def format_profiles(profiles: list[ReplicaProfile]) -> str:
    """A short aligned summary of the profiles, one line per rank."""
    header = (
        f"{'rank':>4}  {'host':<16} {'device':<8} {'thr':>3} {'slow':>4} {'samples/s':>11} "
        f"{'alpha ms':>9} {'beta us':>8} {'R^2':>6} {'cap':>9}"
    )
    lines = [header]
    for p in profiles:
        r2 = "-" if p.r_squared is None else f"{p.r_squared:.3f}"
        cap = "-" if p.cap is None else str(p.cap)
        lines.append(
            f"{p.rank:>4}  {p.host[:16]:<16} {p.device:<8} {p.threads:>3} {p.slowdown:>4g} "
            f"{p.throughput:>11,.1f} {1e3 * p.alpha:>9.3f} {1e6 * p.beta:>8.2f} {r2:>6} {cap:>9}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Profile all ranks and write the file on rank 0."""
    agree(comm, lambda: comm.rank != 0 or check_writable(args.output, "--output"), name_rank=False)
    profiles = run_profiling(args, comm)
    path = write_on_root(
        comm, "--output", args.output, lambda: save_profiles(args.output, profiles)
    )
    if comm.rank == 0:
        print(format_profiles(profiles))
        print(f"wrote {len(profiles)} profiles to {path}")
    return 0
