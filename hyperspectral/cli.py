"""Command line: ``python -m hyperspectral train ...``."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from .datasets import DatasetError, scene_names
from .maps import MissingDependencyError
from .models import MODELS
from .splits import SPLIT_KINDS
from .train import LR_SCHEDULES

__all__ = ["build_parser", "main"]

# Problems a user can fix from the message alone: shown as one line, without a traceback.
USER_ERRORS = (DatasetError, ValueError, OSError, MissingDependencyError)


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show ``(default: ...)`` only where it informs.

    On-off flags (``--no-map``) and options whose default is ``None`` (explained in their
    help text instead) would otherwise read ``(default: True)`` or ``(default: None)``.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or action.default is None:
            return action.help
        return super()._get_help_string(action)


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Print warnings as ``warning: message`` instead of Python's two-line source dump."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        print(f"warning: {message}", file=file or sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (built on demand, never at import)."""
    parser = argparse.ArgumentParser(
        prog="python -m hyperspectral",
        description="Hyperspectral land-cover classification, one process.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = _DefaultsFormatter
    t = sub.add_parser(
        "train",
        help="train a model on one scene and evaluate it",
        formatter_class=fmt,
        description="Train, evaluate, write metrics.json, "
        "metrics.txt, split.npz and map.png into --out.",
    )
    models = "; ".join(f"{k}: {v.description}, patch {v.patch_size}" for k, v in MODELS.items())
    t.add_argument(
        "--scene",
        default="IndianPines",
        help=f"scene name: {', '.join(scene_names())}, or synthetic (a generated 48x48 scene "
        "with 32 bands and 4 classes, the same for every --seed)",
    )
    t.add_argument(
        "--data-dir",
        default=None,
        help="folder holding the scene's .mat files; default $LBTRAIN_DATA, then "
        "~/.cache/lbtrain, then tensorly's Indian Pines copy, then a download",
    )
    t.add_argument(
        "--no-download",
        dest="download",
        action="store_false",
        help="fail instead of downloading missing files (downloads are on "
        "unless this flag is given)",
    )
    t.add_argument("--model", default="hybridsn", choices=list(MODELS), help=models)
    t.add_argument(
        "--patch-size",
        type=int,
        default=None,
        help="odd patch edge in pixels; default: the model's reference size",
    )
    t.add_argument(
        "--pca",
        type=int,
        default=None,
        help="PCA components fitted on training pixels, 0 to disable; "
        "default: the model's reference (30 for hybridsn, none otherwise)",
    )
    t.add_argument(
        "--split",
        default="random",
        choices=SPLIT_KINDS,
        help="random: stratified by ratio; fixed: --train-per-class pixels per class; "
        "disjoint: spatially separated train/test regions",
    )
    t.add_argument(
        "--train-ratio",
        type=float,
        default=0.1,
        help="share of each class used for training (random, disjoint)",
    )
    t.add_argument(
        "--train-per-class", type=int, default=None, help="training pixels per class (fixed split)"
    )
    t.add_argument(
        "--split-file",
        default=None,
        help="reuse the split.npz of an earlier run (overrides --split, "
        "--train-ratio and --train-per-class), so runs are comparable",
    )
    t.add_argument("--epochs", type=int, default=60, help="training epochs")
    t.add_argument("--batch-size", type=int, default=64, help="mini-batch size")
    t.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    t.add_argument(
        "--lr-schedule",
        default="cosine",
        choices=LR_SCHEDULES,
        help="cosine: decay the rate to 0 over the run; constant: keep it",
    )
    t.add_argument("--dropout", type=float, default=0.4, help="dropout probability (0 = off)")
    t.add_argument("--seed", type=int, default=0, help="seed of split, model init and shuffling")
    t.add_argument("--out", default="/tmp/hyperspectral-run", help="output folder")
    t.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads; default: torch's choice"
    )
    t.add_argument(
        "--no-map",
        dest="draw_map",
        action="store_false",
        help="skip whole-scene prediction and map.png and evaluate test pixels "
        "only (the map is drawn unless this flag is given)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the exit status."""
    args = build_parser().parse_args(argv)
    from .train import TrainConfig, run_training

    options = {k: v for k, v in vars(args).items() if k != "command"}
    try:
        with _one_line_warnings():
            run_training(TrainConfig(**options))
    except USER_ERRORS as exc:
        # One line, whatever the underlying library put in its message.
        print("error: " + " ".join(str(exc).splitlines()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0
