"""A step trace drawn with matplotlib: one row per rank, one coloured bar per phase.

The picture shows what Perfetto shows, for documents and for machines without a browser;
:func:`compare_timelines` stacks two runs (say ``equal`` over ``cost``) on one time scale.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lbtrain.viz._deps import pyplot, save_figure
from lbtrain.viz.trace import load_trace

__all__ = ["PHASE_COLOURS", "compare_timelines", "render_timeline", "step_window"]

# Work in strong colours, idle in a light red that reads as "lost" at a glance.
PHASE_COLOURS = {
    "compute": "tab:blue",
    "optimizer": "tab:green",
    "sync": "dimgray",
    "wait": "#f4a3a3",
}
_OTHER_COLOURS = ("tab:purple", "tab:olive", "tab:cyan", "tab:brown")


def _tracks(trace: dict) -> tuple[dict[int, str], dict[int, list[dict[str, Any]]]]:
    """Track names and complete events by tid (a lbtrain trace has one process)."""
    names: dict[int, str] = {}
    slices: dict[int, list[dict[str, Any]]] = {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            names[event["tid"]] = event["args"]["name"]
        elif event.get("ph") == "X":
            slices.setdefault(event["tid"], []).append(event)
    for tid in slices:
        names.setdefault(tid, f"rank {tid}")
    return names, slices


def step_window(
    trace: dict | str | os.PathLike[str], epoch: int, first: int, last: int
) -> tuple[float, float]:
    """The time span (ms) from the start of step `first` to the end of step `last` of `epoch`.

    Raises:
        ValueError: the trace has no slice of those steps.
    """
    events = [
        e
        for e in load_trace(trace)["traceEvents"]
        if e.get("ph") == "X"
        and e.get("args", {}).get("epoch") == epoch
        and first <= e.get("args", {}).get("step", -1) <= last
    ]
    if not events:
        raise ValueError(f"the trace has no slice of epoch {epoch}, steps {first}..{last}")
    return min(e["ts"] for e in events) / 1e3, max(e["ts"] + e["dur"] for e in events) / 1e3


def _draw(axis: Any, trace: dict, window: tuple[float, float] | None) -> dict[str, float]:
    """Draw the trace on `axis`, x from the window's start in ms; return ms per phase drawn."""
    names, slices = _tracks(trace)
    tids = sorted(names)
    if window is None:
        starts = [e["ts"] for s in slices.values() for e in s]
        ends = [e["ts"] + e["dur"] for s in slices.values() for e in s]
        window = (min(starts, default=0) / 1e3, max(ends, default=0) / 1e3)
    low, high = window
    totals: dict[str, float] = {}
    colours = dict(PHASE_COLOURS)
    for row, tid in enumerate(tids):
        bars: dict[str, list[tuple[float, float]]] = {}
        for event in slices.get(tid, []):
            start = max(event["ts"] / 1e3, low)
            end = min((event["ts"] + event["dur"]) / 1e3, high)
            if end <= start:
                continue
            bars.setdefault(event["name"], []).append((start - low, end - start))
            totals[event["name"]] = totals.get(event["name"], 0.0) + end - start
        for phase, spans in bars.items():
            if phase not in colours:
                colours[phase] = _OTHER_COLOURS[(len(colours) - 4) % len(_OTHER_COLOURS)]
            # A hairline of white between slices keeps consecutive steps apart.
            axis.broken_barh(
                spans,
                (row - 0.38, 0.76),
                facecolors=colours[phase],
                edgecolor="white",
                linewidth=0.4,
                label=phase,
            )
    if not tids:
        axis.text(
            0.5,
            0.5,
            "no slices in the trace",
            transform=axis.transAxes,
            ha="center",
            va="center",
            color="gray",
        )
        return totals
    axis.set_yticks(range(len(tids)), [names[t] for t in tids])
    axis.set_ylim(len(tids) - 0.5, -0.5)  # rank 0 on top, as in Perfetto
    axis.set_xlim(0, max(high - low, 1e-6))
    axis.grid(axis="x", alpha=0.3)
    return totals


def _legend(figure: Any, axes: Sequence[Any], top: float = 1.0) -> None:
    handles: dict[str, Any] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    known = [p for p in PHASE_COLOURS if p in handles]
    order = known + [p for p in handles if p not in PHASE_COLOURS]
    if not order:
        return
    figure.legend(
        [handles[p] for p in order],
        order,
        loc="upper right",
        bbox_to_anchor=(1.0, top),
        ncol=len(order),
        fontsize=9,
        frameon=False,
    )


def _wait_share(totals: dict[str, float]) -> float:
    busy = sum(totals.values())
    return totals.get("wait", 0.0) / busy if busy > 0 else 0.0


def render_timeline(
    trace: dict | str | os.PathLike[str],
    png_path: str | os.PathLike[str],
    title: str = "",
    window: tuple[float, float] | None = None,
) -> Path:
    """Draw a trace (dict or JSON file) as one row per rank; return the image path.

    Args:
        trace: a :func:`~lbtrain.viz.trace.chrome_trace` dict or a file it was written to.
        png_path: the image to write (format from the extension).
        title: the figure's title.
        window: (start, end) in ms of trace time to draw; None draws everything.
    """
    plt = pyplot()
    trace = load_trace(trace)
    ranks = len(_tracks(trace)[0])
    figure, axis = plt.subplots(figsize=(11, 1.2 + 0.55 * max(ranks, 1)))
    totals = _draw(axis, trace, window)
    axis.set_xlabel("time from the first slice shown (ms)")
    waiting = f"waiting {100 * _wait_share(totals):.0f}% of rank time"
    axis.set_title(f"{title}: {waiting}" if title else waiting)
    _legend(figure, [axis])
    figure.tight_layout(rect=(0, 0, 1, 0.93))
    return save_figure(figure, plt, png_path)


def compare_timelines(
    traces: Sequence[dict | str | os.PathLike[str]],
    names: Sequence[str],
    png_path: str | os.PathLike[str],
    epoch: int | None = None,
    steps: tuple[int, int] = (5, 14),
    title: str = "",
) -> Path:
    """Stack traces (one panel each) on one time scale, each over the same steps.

    Each panel draws steps `steps[0]..steps[1]` of `epoch` of its trace, from the first
    step's start, so equal numbers of steps are compared and a faster plan ends earlier.

    Args:
        traces: the traces (dicts or files), e.g. a run under ``equal`` and one under ``cost``.
        names: a name per trace, shown in its panel's title.
        png_path: the image to write.
        epoch: the epoch to show; None picks the second epoch the first trace recorded
            (the first one includes warm-up), or its only one.
        steps: the first and last step (inclusive) to show.
        title: the figure's title.
    """
    if len(traces) != len(names) or not traces:
        raise ValueError(f"{len(traces)} traces but {len(names)} names")
    plt = pyplot()
    loaded = [load_trace(t) for t in traces]
    if epoch is None:
        events = loaded[0]["traceEvents"]
        seen = sorted(
            {e.get("args", {}).get("epoch") for e in events if e.get("ph") == "X"} - {None}
        )
        if not seen:
            raise ValueError("the first trace has no slices")
        epoch = seen[1] if len(seen) > 1 else seen[0]
    windows = [step_window(t, epoch, *steps) for t in loaded]
    width = max(high - low for low, high in windows)
    rows = [len(_tracks(t)[0]) for t in loaded]
    height = 1.0 + sum(0.55 * r + 0.8 for r in rows)
    figure, axes = plt.subplots(
        len(loaded), 1, figsize=(11, height), height_ratios=rows, squeeze=False
    )
    axes = axes[:, 0]
    for axis, trace, name, (low, high) in zip(axes, loaded, names, windows, strict=True):
        totals = _draw(axis, trace, (low, high))
        axis.set_xlim(0, width)
        axis.set_title(
            f"{name}: steps {steps[0]}-{steps[1]} of epoch {epoch} in {high - low:.0f} ms, "
            f"waiting {100 * _wait_share(totals):.0f}% of rank time",
            loc="left",
            fontsize=10,
        )
    axes[-1].set_xlabel("time from the first step shown (ms)")
    if title:
        figure.suptitle(title, x=0.01, y=0.995, ha="left")
    # Below the title's line when there is one, so the two never overlap.
    _legend(figure, list(axes), top=0.955 if title else 1.0)
    figure.tight_layout(rect=(0, 0, 1, 0.91 if title else 0.95))
    return save_figure(figure, plt, png_path)
