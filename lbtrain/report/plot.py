"""The balance report as a picture: compute, idle and sync per rank, one panel per policy."""

from __future__ import annotations

import os
from pathlib import Path

from lbtrain.report.build import BalanceReport
from lbtrain.viz._deps import save_figure

__all__ = ["plot_report", "require_matplotlib"]


def require_matplotlib() -> None:
    """Raise a clear error when matplotlib, needed by --plot, cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            f"--plot needs matplotlib, which cannot be imported ({exc}); install it with "
            "`pip install 'lbtrain[plot]'` (or `pip install matplotlib`), or drop --plot"
        ) from None


def plot_report(report: BalanceReport, path: str | os.PathLike[str]) -> Path:
    """Draw one bar per rank, compute plus idle plus sync, for each policy side by side.

    A dashed line marks the ideal step's compute, which no plan's slowest rank beats.

    Args:
        report: the report to draw.
        path: image file to write (format from the extension, e.g. .png or .svg).

    Returns:
        The path written.
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    count = len(report.results)
    figure, axes = plt.subplots(1, count, figsize=(4 * count + 1, 4), sharey=True, squeeze=False)
    ranks = [p.rank for p in report.profiles]
    for axis, result in zip(axes[0], report.results, strict=True):
        compute = [1e3 * t for t in result.plan.predicted_step_times]
        idle = [1e3 * t for t in result.plan.predicted_idle_times]
        waited = [c + i for c, i in zip(compute, idle, strict=True)]
        axis.bar(ranks, compute, color="tab:blue", label="compute")
        axis.bar(ranks, idle, bottom=compute, color="tab:red", alpha=0.35, label="idle")
        if result.comm_time > 0:
            # Every rank, idle or not, takes part in the sync after the slowest compute.
            sync = [1e3 * result.comm_time] * len(ranks)
            axis.bar(ranks, sync, bottom=waited, color="tab:gray", alpha=0.6, label="sync")
        axis.axhline(
            1e3 * report.ideal.compute,
            color="black",
            linestyle="--",
            linewidth=1,
            label="ideal compute",
        )
        axis.set_title(
            f"{result.policy}: {1e3 * result.predicted_step_time:.1f} ms/step\n"
            f"{result.speedup_over_equal:.2f}x vs equal, {100 * result.efficiency:.0f}% eff."
        )
        axis.set_xlabel("rank (its batch)")
        # Under the axis, where no bar top, idle part or ideal line can cover the batch.
        labels = [f"{r}\nb={b}" for r, b in zip(ranks, result.plan.batch_sizes, strict=True)]
        axis.set_xticks(ranks, labels)
    axes[0][0].set_ylabel("predicted time per step (ms)")
    # The last panel is usually the best-balanced one, with room above its low bars.
    axes[0][-1].legend(loc="upper right")
    figure.suptitle(f"lbtrain balance report, global batch {report.global_batch_size}")
    figure.tight_layout()
    return save_figure(figure, plt, path)
