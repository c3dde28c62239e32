"""Run `lbtrain train` under mpiexec and print, per epoch, measured against predicted.

Two uses (issue 9):

* prediction: the measured step time next to the plan's prediction, per epoch, and the
  median relative error from epoch 2 on:

      .venv/bin/python scripts/bench_train.py predict -- --emulate-slowdown 1,2,4 --policy cost

* re-planning: the same run with `--replan off` and `--replan auto` through a slowdown that
  changes mid-run, with the idle fraction of the working ranks per epoch:

      .venv/bin/python scripts/bench_train.py replan -- --emulate-slowdown 1,4 \\
          --emulate-change 4:4,1

A benchmark, not a test: it prints figures and asserts nothing. Keep the machine otherwise
idle while it runs; every rank gets one thread.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import BenchError, Run, epochs_of, train

__all__ = ["main"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("predict", "replan"), help="what to measure")
    parser.add_argument("--ranks", type=int, default=None, help="mpiexec -n (default: 3, 2)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "lbtrain-bench-train",
        help="parent folder of the runs (default: %(default)s)",
    )
    parser.add_argument("extra", nargs="*", help="further `lbtrain train` options after --")
    return parser.parse_args(argv)


def _run(ranks: int, options: list[str], parent: Path) -> Run:
    try:
        return train(ranks, options, parent)
    except BenchError as exc:
        sys.exit(f"run failed: {exc}")


def _table(run: Run) -> None:
    summary, epochs = run.summary, epochs_of(run.out)
    print("epoch  batches           measured ms  predicted ms  error   idle  re-plan")
    for epoch in epochs:
        measured, predicted = epoch["step_seconds"], epoch["predicted_step_seconds"]
        error = (measured - predicted) / predicted if predicted else float("nan")
        replan = epoch.get("replan")
        change = f"-> {replan['new_batch_sizes']}" if replan else ""
        print(
            f"{epoch['epoch']:>5}  {str(epoch['batch_sizes']):<16}  {1e3 * measured:>11.2f}  "
            f"{1e3 * predicted:>12.2f}  {100 * error:>+5.1f}%  "
            f"{100 * epoch['idle_fraction']:>4.1f}%  {change}"
        )
    error = summary.get("prediction_error_median")
    if error is not None:
        print(f"median |error| from epoch 2 on: {100 * error:.1f}%")
    per_sample = [
        f"rank {row['rank']}: {1e6 * _compute_per_sample(row):.0f} us"
        for row in epochs[-1]["ranks"]
    ]
    print("last epoch, measured compute per sample: " + ", ".join(per_sample))


def _compute_per_sample(row: dict[str, Any]) -> float:
    """A rank's measured compute seconds per sample of its own in an epoch (0 without any)."""
    return row["compute"] / row["samples"] if row["samples"] else 0.0


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark named by the first argument."""
    args = _parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mode == "predict":
        _table(_run(args.ranks or 3, args.extra, args.out))
        return
    for replan in ("off", "auto"):
        print(f"\n--replan {replan}")
        _table(_run(args.ranks or 2, [*args.extra, "--replan", replan], args.out))


if __name__ == "__main__":
    main()
