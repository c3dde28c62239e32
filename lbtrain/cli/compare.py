"""`lbtrain compare`: several run folders side by side, one row per run."""

from __future__ import annotations

import argparse

from lbtrain.comm import Communicator
from lbtrain.runs import COMPARE_FORMATS, format_comparison, load_run

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Print one row per run folder of `lbtrain train`: the folder's name, the settings in which
the runs differ (from each config.toml, the workload's options first; 'default' where a run
left one unset, '-' for another workload's option; six at most, a note names the rest), the
balancing policy, the ranks and their devices, the wall time, the training throughput
(samples/s) and the final headline metrics (OA and AA in percent, kappa as a coefficient,
for the hyperspectral workload). A run that did not finish gets '-' where its summary would
say, and a note why. --format markdown gives a table to paste into a report, e.g.

  lbtrain compare runs/20261125-122914 runs/20261125-140210
  lbtrain compare runs/* --format markdown > results.md
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the `compare` verb."""
    parser = subparsers.add_parser(
        "compare",
        help="tabulate several runs: differing settings, policy, devices, time, metrics",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_folders",
        nargs="+",
        metavar="RUN",
        help="run folders written by `lbtrain train`, one row each, in this order",
    )
    parser.add_argument(
        "--format",
        choices=COMPARE_FORMATS,
        default="text",
        help="text: aligned columns; markdown: a table for a report (default: %(default)s)",
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Print the table on rank 0 (one process reads the folders)."""
    if comm.rank == 0:
        runs = [load_run(folder) for folder in args.run_folders]
        print(format_comparison(runs, args.format))
    return 0
