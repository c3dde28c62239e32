"""A run's training curves from its metrics records: loss, accuracy, step time and idle time.

Four panels share the epoch axis. On each, a re-plan is a dashed line between the epoch after
which it took effect and the next, with the new batch sizes written beside it; a resume is a
dotted line there too, and a stopped attempt (signal, divergence) a dash-dotted one.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from lbtrain.viz._deps import pyplot, save_figure
from lbtrain.viz.records import (
    epoch_records,
    eval_records,
    replan_epochs,
    resume_epochs,
    world_changes,
)

__all__ = ["draw_curves", "eval_series", "plot_curves"]

_REPLAN_STYLE = {"color": "tab:purple", "linestyle": "--", "linewidth": 1.0, "alpha": 0.8}
_RESUME_STYLE = {"color": "black", "linestyle": ":", "linewidth": 1.0, "alpha": 0.7}
_STOP_STYLE = {"color": "tab:red", "linestyle": "-.", "linewidth": 1.0, "alpha": 0.8}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def eval_series(records: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """Each eval metric that can be drawn in %, as (epochs, values x 100).

    A metric is drawn when every value of it lies in [0, 1]: fractions (OA, AA) become
    percentages; a coefficient (a name containing "kappa") is drawn x 100 and named so.
    Metrics with a value outside [0, 1] (a loss) are left out.
    """
    values: dict[str, list[tuple[int, float]]] = {}
    for record in eval_records(records):
        for name, value in (record.get("metrics") or {}).items():
            if _number(value):
                values.setdefault(name, []).append((record["epoch"], float(value)))
    series = {}
    for name, points in values.items():
        if all(0.0 <= v <= 1.0 for _, v in points):
            label = f"eval {name} (x100)" if "kappa" in name.lower() else f"eval {name} (%)"
            series[label] = ([e for e, _ in points], [100 * v for _, v in points])
    return series


def _series(epochs: list[dict[str, Any]], key: str, scale: float = 1.0) -> tuple[list, list]:
    points = [(r["epoch"], scale * r[key]) for r in epochs if _number(r.get(key))]
    return [e for e, _ in points], [v for _, v in points]


def _sizes_label(sizes: list[int]) -> str:
    return "b=" + ",".join(str(b) for b in sizes)


# A label's width as a share of a panel's, per character (8-point text, a panel ~4.5 in).
_CHAR_SHARE = 0.016
_LABEL_ROWS = 4


def _label_rows(replans: list[tuple[int, list[int]]], last_epoch: int) -> list[int]:
    """A row for each re-plan's label, the first one free where it starts (greedy)."""
    ends = [-math.inf] * _LABEL_ROWS  # where each row's last label ends, in epochs
    rows = []
    for epoch, sizes in replans:
        width = len(_sizes_label(sizes)) * _CHAR_SHARE * max(last_epoch, 1)
        row = next((k for k, end in enumerate(ends) if end < epoch), len(rows) % _LABEL_ROWS)
        ends[row] = epoch + width
        rows.append(row)
    return rows


def _marks(axes: list[Any], records: list[dict[str, Any]]) -> int:
    """Draw the re-plan, resume and stop lines on every panel; return the number of re-plans."""
    replans = replan_epochs(records)
    resumes = resume_epochs(records)
    stops = [r for r in records if r["type"] == "stop" and isinstance(r.get("epoch"), int)]
    rows = _label_rows(replans, max((r["epoch"] for r in epoch_records(records)), default=1))
    for axis in axes:
        for index, (epoch, sizes) in enumerate(replans):
            axis.axvline(epoch + 0.5, label="re-plan" if index == 0 else None, **_REPLAN_STYLE)
            # The new sizes at the top of the panel, right of the line they start after; a
            # label that would overprint the one before goes a row lower.
            axis.annotate(
                _sizes_label(sizes),
                (epoch + 0.5, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -3 - 10 * rows[index]),
                textcoords="offset points",
                ha="left",
                va="top",
                fontsize=8,
                color=_REPLAN_STYLE["color"],
            )
        for index, epoch in enumerate(resumes):
            axis.axvline(epoch + 0.5, label="resumed" if index == 0 else None, **_RESUME_STYLE)
        for epoch, before, now in world_changes(records):  # at the bottom, clear of re-plans
            axis.annotate(f"{before} -> {now} ranks", (epoch + 0.5, 0.0),
                          xycoords=("data", "axes fraction"), xytext=(3, 3),
                          textcoords="offset points", ha="left", va="bottom", fontsize=8,
                          color=_RESUME_STYLE["color"])  # fmt: skip
        for index, stop in enumerate(stops):
            # A stop happens inside its (1-based) epoch, so the line sits on the epoch itself.
            axis.axvline(stop["epoch"], label="stopped" if index == 0 else None, **_STOP_STYLE)
    return len(replans)


def _no_data(axis: Any, text: str) -> None:
    axis.text(0.5, 0.5, text, transform=axis.transAxes, ha="center", va="center", color="gray")
    axis.set_yticks([])


def _top_room(axis: Any, values: list[float]) -> None:
    # From zero, with room above the highest point (and the re-plan labels at the top).
    axis.set_ylim(0, 1.15 * max(values) if values and max(values) > 0 else 1)


def _loss_panel(axis: Any, epochs: list[dict[str, Any]]) -> None:
    axis.set_title("training loss")
    axis.set_ylabel("loss (mean per sample)")
    x, loss = _series(epochs, "loss")
    if not loss:
        _no_data(axis, "no loss recorded")
        return
    axis.plot(x, loss, marker="o", markersize=3, label="training loss")
    positive = [v for v in loss if v > 0]
    if positive and max(positive) / min(positive) > 100:  # spans more than two decades
        axis.set_yscale("log")
    # A null loss was not finite (written as null): mark where, on the panel's floor.
    lost = [r["epoch"] for r in epochs if "loss" in r and not _number(r["loss"])]
    if lost:
        axis.plot(
            lost,
            [0.02] * len(lost),
            "x",
            color="tab:red",
            markersize=8,
            transform=axis.get_xaxis_transform(),
            label="loss not finite",
        )


def _accuracy_panel(axis: Any, epochs: list[dict[str, Any]], records: list[dict]) -> None:
    axis.set_title("accuracy")
    x, accuracy = _series(epochs, "accuracy", 100.0)
    series = eval_series(records)
    if accuracy:
        axis.plot(x, accuracy, marker="o", markersize=3, label="train accuracy (%)")
    for (label, (ex, ev)), marker in zip(series.items(), "sD^vP*X", strict=False):
        axis.plot(ex, ev, linestyle="none", marker=marker, markersize=6, label=label)
    if not accuracy and not series:
        _no_data(axis, "no accuracy or eval recorded")
        return
    coefficient = any("kappa" in label for label in series)
    axis.set_ylabel("accuracy (%), kappa x100" if coefficient else "accuracy (%)")


def _time_panel(axis: Any, epochs: list[dict[str, Any]]) -> None:
    axis.set_title("time per step")
    axis.set_ylabel("ms per step")
    x, measured = _series(epochs, "step_seconds", 1e3)
    px, predicted = _series(epochs, "predicted_step_seconds", 1e3)
    if not measured and not predicted:
        _no_data(axis, "no step time recorded")
        return
    if measured:
        axis.plot(x, measured, marker="o", markersize=3, label="measured step")
    if predicted:
        # A plan holds for whole epochs: a step line, with a mark for a lone epoch.
        axis.plot(
            px,
            predicted,
            linestyle="--",
            drawstyle="steps-mid",
            marker="_",
            markersize=10,
            label="predicted step",
        )
    # The prediction corrected by the epochs measured before each (from the second epoch;
    # the first is the plan's own), where the run recorded one.
    later = [r for r in epochs if r.get("epoch", 0) > 1]
    cx, corrected = _series(later, "forecast_step_seconds", 1e3)
    if corrected:
        axis.plot(cx, corrected, linestyle=":", marker=".", markersize=4,
                  label="corrected prediction")  # fmt: skip
    _top_room(axis, measured + predicted + corrected)


def _idle_panel(axis: Any, epochs: list[dict[str, Any]]) -> None:
    axis.set_title("idle time (waiting for the slowest rank)")
    axis.set_ylabel("% of epoch time")
    x, idle = _series(epochs, "idle_fraction", 100.0)
    waits: dict[int, list[tuple[int, float]]] = {}
    for record in epochs:
        for rank in record.get("ranks") or []:
            if _number(rank.get("wait")) and _number(rank.get("seconds")) and rank["seconds"] > 0:
                share = 100 * rank["wait"] / rank["seconds"]
                waits.setdefault(rank["rank"], []).append((record["epoch"], share))
    if not idle and not waits:
        _no_data(axis, "no idle time recorded")
        return
    if idle:
        # A rank with no samples is idled by the plan on purpose: its own line shows it.
        label = "idle (ranks with samples)"
        axis.plot(x, idle, marker="o", markersize=3, color="tab:red", label=label)
    for rank, points in sorted(waits.items()):
        axis.plot(
            [e for e, _ in points],
            [v for _, v in points],
            linewidth=0.9,
            alpha=0.7,
            marker=".",
            markersize=2,
            label=f"rank {rank} waiting",
        )
    _top_room(axis, idle + [v for points in waits.values() for _, v in points])


def draw_curves(records: list[dict[str, Any]], title: str = "") -> tuple[Any, int]:
    """Draw the four panels; return the matplotlib figure and the number of re-plans marked.

    The caller owns the figure (close it with matplotlib.pyplot.close).
    """
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    epochs = epoch_records(records)
    figure, grid = plt.subplots(2, 2, figsize=(12, 7.5), sharex=True)
    axes = list(grid.flat)
    _loss_panel(axes[0], epochs)
    _accuracy_panel(axes[1], epochs, records)
    _time_panel(axes[2], epochs)
    _idle_panel(axes[3], epochs)
    # A stop inside an epoch that never ended sits one past the last epoch record: in range.
    stops = [r["epoch"] for r in records if r["type"] == "stop" and isinstance(r.get("epoch"), int)]
    numbers = [r["epoch"] for r in epochs] + [r["epoch"] for r in eval_records(records)] + stops
    low, high = (min(numbers), max(numbers)) if numbers else (1, 1)
    for axis in axes:
        axis.set_xlim(low - 0.5, high + 0.5)
        if high - low < 10:  # a few epochs: one tick each, never a fraction of an epoch
            axis.set_xticks(range(low, high + 1))
        else:
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    for axis in axes[2:]:
        axis.set_xlabel("epoch")
    replans = _marks(axes, records)
    for axis in axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8, loc="best")
    figure.suptitle(title or _default_title(records))
    figure.tight_layout()
    return figure, replans


def _default_title(records: list[dict[str, Any]]) -> str:
    start = next((r for r in records if r["type"] == "start"), None)
    if start is None:
        return "lbtrain training curves"
    return (
        f"lbtrain: {start.get('world_size', '?')} ranks, policy {start.get('policy', '?')}, "
        f"global batch {start.get('global_batch', '?')}"
    )


def plot_curves(
    records: list[dict[str, Any]], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Write the training curves of a run's metrics records to `path` (e.g. curves.png).

    Args:
        records: what :func:`~lbtrain.viz.records.read_metrics` returned.
        path: the image file (format from the extension).
        title: the figure's title; by default the run's ranks, policy and global batch.

    Returns:
        The path written.
    """
    plt = pyplot()
    figure, _ = draw_curves(records, title)
    return save_figure(figure, plt, path)
