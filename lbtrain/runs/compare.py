"""Several runs side by side: one row per run, as aligned text or a markdown table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lbtrain.runs.folder import Run
from lbtrain.text import format_metric, markdown_table, metric_title, text_table

__all__ = ["COMPARE_FORMATS", "format_comparison"]

COMPARE_FORMATS = ("text", "markdown")

# What stands in a cell the run's files do not say (a run that did not finish).
MISSING = "-"


def format_comparison(runs: Sequence[Run], fmt: str = "text") -> str:
    """What `lbtrain compare` prints: a table with one row per run, then a note per run
    that did not finish.

    Args:
        runs: the runs, in the order their rows should appear.
        fmt: "text" (aligned columns) or "markdown" (a table to paste into a report).
    """
    if fmt not in COMPARE_FORMATS:
        raise ValueError(f"fmt={fmt!r} is unknown; choose one of {', '.join(COMPARE_FORMATS)}")
    names = _names(runs)
    metrics = list(dict.fromkeys(name for run in runs for name in run.metrics))
    header = [
        "run",
        "policy",
        "ranks",
        "devices",
        "wall time (s)",
        "samples/s",
        *map(metric_title, metrics),
    ]
    rows = [_row(run, name, metrics) for run, name in zip(runs, names, strict=True)]
    render = markdown_table if fmt == "markdown" else text_table
    lines = [render(header, rows, left=4)]
    notes = [
        f"{name} did not finish: {run.unfinished}; '{MISSING}' where its summary.json would say"
        for run, name in zip(runs, names, strict=True)
        if not run.finished
    ]
    if notes:
        lines.append("")
        lines += [f"- {note}" if fmt == "markdown" else f"note: {note}" for note in notes]
    return "\n".join(lines)


def _names(runs: Sequence[Run]) -> list[str]:
    """Each run's folder name; the paths as given where two folders share a name."""
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        return [str(run.folder) for run in runs]
    return names


def _devices(labels: Sequence[str]) -> str:
    """ "cpu, cpu x2, cpu x4"; a device on several ranks once, with its count: "cuda (4)"."""
    counts = Counter(labels)
    return ", ".join(
        label if count == 1 else f"{label} ({count})" for label, count in counts.items()
    )


def _row(run: Run, name: str, metrics: Sequence[str]) -> list[str]:
    summary = run.summary or {}
    wall, rate = summary.get("wall_seconds"), summary.get("samples_per_second")
    values = run.metrics  # none for a run that did not finish: not final
    return [
        name,
        run.policy or MISSING,
        str(run.world_size) if run.world_size else MISSING,
        _devices(run.devices) or MISSING,
        f"{wall:.1f}" if isinstance(wall, int | float) else MISSING,
        f"{rate:,.0f}" if isinstance(rate, int | float) else MISSING,
        *(format_metric(m, values[m]) if m in values else MISSING for m in metrics),
    ]
