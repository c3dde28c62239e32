"""How lbtrain writes figures for people: metrics, devices, tables.

Pure Python with no torch, so that reading a run folder (`lbtrain show`, lbtrain.runs) and
the trainer's own printing share one way of writing a number without loading the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "device_label",
    "format_metric",
    "markdown_table",
    "metric_title",
    "plural",
    "text_table",
    "wall_time_parts",
]


def format_metric(name: str, value: Any) -> str:
    """One headline metric as lbtrain prints it everywhere: `kappa 0.3042`, `oa 95.29 %`.

    Kappa is a coefficient in [-1, 1], shown as it is with 4 decimals, never x 100; other
    fractions in [0, 1] (accuracies) read best as percentages; anything else as it is.
    """
    real = isinstance(value, int | float) and not isinstance(value, bool)
    if "kappa" in name.lower() and real:
        return f"{float(value):.4f}"
    if isinstance(value, float) and 0.0 <= value <= 1.0:
        return f"{100 * value:.2f} %"
    return str(value)


# Metric names that are abbreviations, written as the per-class report (metrics.txt) does.
_TITLES = {"oa": "OA", "aa": "AA"}


def metric_title(name: str) -> str:
    """A metric's name as a heading: `OA`, `AA`, `kappa`, `accuracy`."""
    return _TITLES.get(name, name)


def device_label(entry: Mapping[str, Any]) -> str:
    """A rank's device as the run shows it: "cpu", or "cpu x4" under an emulated slowdown."""
    slowdown = entry.get("slowdown", 1)
    return str(entry.get("device")) + (f" x{slowdown:g}" if slowdown != 1 else "")


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 3) -> str:
    """Aligned columns: the first `left` flush left (names), the rest flush right (figures)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.ljust(width) if index < left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 3) -> str:
    """A GitHub-flavoured markdown table; `left` is accepted so it can stand in for
    :func:`text_table` (markdown renderers align the cells themselves)."""
    del left

    def line(cells: Sequence[str]) -> str:
        # A "|" inside a cell would split it in two.
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)])


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, with an s unless there is exactly one: "1 epoch", "3 epochs"."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


# The wall time's other parts, shown where they come to 0.1 s or more (older summaries lack
# the keys): what a run spends beside profiling and training steps.
_PARTS = (("eval_seconds", "evaluation"), ("predict_seconds", "predictions"),
          ("checkpoint_seconds", "checkpoints"))  # fmt: skip


def wall_time_parts(summary: Mapping[str, Any]) -> str:
    """The wall time's parts beside profiling and training (`, evaluation 9.6 s, ...`)."""
    parts = []
    for key, name in _PARTS:
        shown = f"{summary.get(key) or 0.0:.1f}"
        if shown != "0.0":
            parts.append(f", {name} {shown} s")
    return "".join(parts)
