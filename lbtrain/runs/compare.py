"""Several runs side by side: one row per run, as aligned text or a markdown table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

from lbtrain.runs.folder import Run
from lbtrain.text import format_metric, markdown_table, metric_title, plural, text_table

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
    recipes = _recipes(runs)
    settings, more = _differing(recipes)
    header = [
        "run",
        *settings,
        "policy",
        "ranks",
        "devices",
        "wall time (s)",
        "samples/s",
        *map(metric_title, metrics),
    ]
    rows = [
        [name, *(_setting(recipes, i, key) for key in settings), *_row(run, metrics)]
        for i, (run, name) in enumerate(zip(runs, names, strict=True))
    ]
    render = markdown_table if fmt == "markdown" else text_table
    lines = [render(header, rows, left=4 + len(settings))]
    notes = []
    if more:
        notes.append(
            f"{plural(len(more), 'more setting')} differ{'s' if len(more) == 1 else ''}: "
            f"{', '.join(more)} (lbtrain show RUN prints a run's recipe)"
        )
    notes += [
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


# Recipe settings that change neither what a run trains nor how fast: never a column.
_NOT_COMPARED = frozenset(
    ("out", "resume", "overwrite", "quiet", "log_every", "log_level", "curves", "keep",
     "checkpoint_every", "checkpoint_seconds", "eval_batch", "config", "trace",
     "tensorboard")
)  # fmt: skip
# The most settings shown as columns; the rest are named in a note.
MAX_SETTINGS = 6
# A cell for a setting a run's config.toml leaves out: the default applied.
DEFAULT = "default"


class _Recipe(NamedTuple):
    """One run's config.toml, flat: its workload options first (what tells recipes apart
    most often: model, patch, ...), then the trainer's settings; None without the file."""

    items: dict[str, Any] | None
    workload: Any
    options: frozenset[str]  # which of the items are the workload's options


def _recipes(runs: Sequence[Run]) -> list[_Recipe]:
    """Every run's recipe, flattened once. An option named like a trainer setting in any of
    the runs' files is ``workload.NAME``, so the two never share a column."""
    settings = {k for run in runs for k, v in (run.recipe or {}).items() if not isinstance(v, dict)}
    recipes = []
    for run in runs:
        if run.recipe is None:
            recipes.append(_Recipe(None, None, frozenset()))
            continue
        flat: dict[str, Any] = {}
        for table in (v for v in run.recipe.values() if isinstance(v, dict)):
            flat.update({(f"workload.{k}" if k in settings else k): v for k, v in table.items()})
        plain = {k: v for k, v in run.recipe.items() if not isinstance(v, dict)}
        recipes.append(_Recipe({**flat, **plain}, run.recipe.get("workload"), frozenset(flat)))
    return recipes


def _options(recipes: Sequence[_Recipe]) -> frozenset[str]:
    """The keys that are a workload's option in any of the runs."""
    return frozenset().union(*(r.options for r in recipes))


def _differing(recipes: Sequence[_Recipe]) -> tuple[list[str], list[str]]:
    """The recipe settings whose values differ between the runs, options first: the first
    MAX_SETTINGS to show as columns, and the others."""
    known = [r.items for r in recipes if r.items is not None]
    keys = list(dict.fromkeys(key for items in known for key in items))
    options = _options(recipes)
    keys = [k for k in keys if k in options] + [k for k in keys if k not in options]
    differing = [
        key
        for key in keys
        if key not in _NOT_COMPARED and len({repr(items.get(key, DEFAULT)) for items in known}) > 1
    ]
    return differing[:MAX_SETTINGS], differing[MAX_SETTINGS:]


def _setting(recipes: Sequence[_Recipe], index: int, key: str) -> str:
    recipe = recipes[index]
    if recipe.items is None:
        return MISSING  # no config.toml: the run's settings are not known
    if key not in recipe.items:
        # "default" for a setting, or an option a run of the same workload sets; "-" for
        # an option of another workload.
        same = [r for r in recipes if r.items is not None and r.workload == recipe.workload]
        if key in _options(recipes) and not any(key in r.items for r in same):
            return MISSING
        return DEFAULT
    value = recipe.items[key]
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _row(run: Run, metrics: Sequence[str]) -> list[str]:
    summary = run.summary or {}
    wall, rate = summary.get("wall_seconds"), summary.get("samples_per_second")
    values = run.metrics  # none for a run that did not finish: not final
    return [
        run.policy or MISSING,
        str(run.world_size) if run.world_size else MISSING,
        _devices(run.devices) or MISSING,
        f"{wall:.1f}" if isinstance(wall, int | float) else MISSING,
        f"{rate:,.0f}" if isinstance(rate, int | float) else MISSING,
        *(format_metric(m, values[m]) if m in values else MISSING for m in metrics),
    ]
