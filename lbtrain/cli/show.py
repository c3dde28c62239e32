"""`lbtrain show`: one run folder read back, its recipe, plan, epochs, final metrics, files."""

from __future__ import annotations

import argparse

from lbtrain.comm import Communicator
from lbtrain.runs import format_run, load_run

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Print what a run folder of `lbtrain train` holds: the recipe (config.toml), the plan
(plan.json: each rank's device, batch, weight and predicted compute per step), one line per
epoch (metrics.jsonl: loss, train accuracy, evaluation metrics where the epoch was
evaluated, epoch time, samples/s, re-plans), the final metrics and times (summary.json) and
the files in the folder. A run that did not finish is shown as far as it got, with why and
how to continue it. Needs no launcher, e.g.

  lbtrain show runs/20261125-122914
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the `show` verb."""
    parser = subparsers.add_parser(
        "show",
        help="print a run folder's recipe, plan, epochs, metrics and files",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_folder",
        metavar="RUN",
        help="a run folder written by `lbtrain train` (runs/<date-time>, or its --out)",
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Print the run on rank 0 (the folder is read by one process; other ranks have nothing
    to add)."""
    if comm.rank == 0:
        print(format_run(load_run(args.run_folder)))
    return 0
