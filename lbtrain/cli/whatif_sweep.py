"""`lbtrain what-if --sweep`: the table and the picture of one axis swept."""

from __future__ import annotations

import argparse
from pathlib import Path

from lbtrain.viz._deps import pyplot, save_figure
from lbtrain.whatif.sweep import Sweep, SweepPoint, parse_sweep

__all__ = ["format_sweep", "plot_sweep", "sweep_type"]

_WHAT = {
    "batch": "global batch",
    "devices": "devices",
    "link": "link between nodes",
    "flops": "peak FLOP/s, x the table's",
    "memory-bandwidth": "peak memory bandwidth, x the table's",
}


def sweep_type(text: str) -> Sweep:
    """argparse type of --sweep: the parsed sweep, or its one-line error."""
    try:
        return parse_sweep(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_sweep(axis: str, points: list[SweepPoint]) -> str:
    """One row per value: batch, step and its split, the sync's share, throughput, efficiency."""
    # The batch axis is its own batch column (once it was printed twice).
    batch = axis != "batch"
    lines = [
        "",
        f"sweep of the {_WHAT[axis]} (everything else as above):",
        f"{axis:>18}" + (f"{'batch':>10}" if batch else "")
        + f"{'step ms':>12}{'compute ms':>12}{'sync ms':>10}{'sync %':>8}{'samples/s':>14}"
        f"{'of ideal':>10}",
    ]  # fmt: skip
    for point in points:
        p = point.prediction
        lines.append(
            (f"{point.label:>18}{p.global_batch:>10,}" if batch else f"{p.global_batch:>18,}")
            + f"{1e3 * p.step:>12.3f}{1e3 * p.compute:>12.3f}{1e3 * p.sync:>10.3f}"
            f"{p.sync / p.step:>8.1%}{p.throughput:>14,.0f}{p.efficiency:>10.1%}"
        )
    return "\n".join(lines)


def plot_sweep(axis: str, points: list[SweepPoint], path: str) -> Path:
    """Left: the step split into compute and sync; right: throughput; both against the axis."""
    plt = pyplot()
    # In the axis' order, whatever order the values were given in: a line drawn in the
    # given order doubles back, and the stacked areas overlap.
    points = sorted(points, key=lambda point: point.value)
    values = [point.value for point in points]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    compute = [1e3 * point.prediction.compute for point in points]
    sync = [1e3 * point.prediction.sync for point in points]
    left.stackplot(values, compute, sync, labels=["compute", "sync"], alpha=0.8)
    left.set(xlabel=_WHAT[axis], ylabel="step (ms)", title="where a step goes")
    left.legend(loc="best")
    right.plot(values, [point.prediction.throughput for point in points], marker="o")
    right.set(xlabel=_WHAT[axis], ylabel="samples/s", title="throughput")
    for axes in (left, right):
        axes.set_xscale("log")
        axes.set_xticks(values, [point.label for point in points], rotation=30)
        axes.minorticks_off()
        axes.grid(alpha=0.3)
    figure.suptitle(f"what-if: sweep of the {_WHAT[axis]}")
    figure.tight_layout()
    return save_figure(figure, plt, path)
