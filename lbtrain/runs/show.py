"""One run folder as text: its recipe, plan, epochs, final metrics and files."""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from lbtrain.runs.folder import Run
from lbtrain.text import device_label, format_metric, metric_title, text_table, wall_time_parts

__all__ = ["format_run"]

# Widest line of the recipe's settings (they wrap there), about a terminal's width.
WIDTH = 88


def format_run(run: Run) -> str:
    """What `lbtrain show` prints: every section the folder has the file for."""
    sections = [
        _header(run),
        _recipe(run),
        _plan(run),
        _epochs(run),
        _final(run),
        _files(run),
    ]
    return "\n\n".join(section for section in sections if section)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _indent(text: str) -> str:
    return textwrap.indent(text, "  ")


def _header(run: Run) -> str:
    ranks = run.world_size
    planned = run.planned_epochs
    done = run.epochs_done
    what = [
        f"{done} of {_plural(planned, 'epoch')}"
        if planned and not run.finished
        else _plural(done, "epoch"),
        *([_plural(ranks, "rank")] if ranks else []),
        *([f"policy {run.policy}"] if run.policy else []),
    ]
    line = f"run {run.folder}: " + ("finished" if run.finished else "did not finish")
    line += f" ({', '.join(what)})"
    lines = [line]
    if run.resumes:
        lines.append("  resumed " + "; then ".join(run.resumes))
    if run.finished:
        return "\n".join(lines)
    lines.append(f"  {run.unfinished}")
    if run.diverged:
        lines.append("  start a new run with a lower --lr (a resume keeps the learning rate)")
    elif run.checkpoints and run.writer is None:
        folder = shlex.quote(str(run.folder))
        lines.append(f"  continue it with: lbtrain train --resume {folder} (launched as it was)")
    return "\n".join(lines)


def _setting(name: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list):
        text = ",".join(map(str, value))
    else:
        text = str(value)
    return f"{name}={text}"


def _wrapped(items: Iterable[str], width: int = WIDTH) -> list[str]:
    """Items joined by two spaces into lines no wider than `width`, never split inside one."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= width:
            lines[-1] += "  " + item
        else:
            lines.append(item)
    return lines


def _recipe(run: Run) -> str:
    if run.recipe is None:
        return "recipe: no config.toml"
    plain = {k: v for k, v in run.recipe.items() if not isinstance(v, dict)}
    lines = _wrapped(_setting(k, v) for k, v in plain.items())
    for table, values in run.recipe.items():
        if isinstance(values, dict) and values:  # [workload_options]
            lines += _wrapped([f"{table}:", *(_setting(k, v) for k, v in values.items())])
    return "recipe (config.toml)\n" + _indent("\n".join(lines))


def _ms(seconds: Any) -> str:
    return f"{1e3 * seconds:.2f}" if isinstance(seconds, int | float) else "-"


def _at(values: Any, index: int) -> Any:
    """values[index], or None where the list is missing or short (a hand-edited file)."""
    return values[index] if isinstance(values, list) and index < len(values) else None


def _plan(run: Run) -> str:
    plan = run.plan
    if plan is None:
        return "plan: no plan.json"
    rows = []
    for rank, size in enumerate(plan.get("batch_sizes") or []):
        weight = _at(plan.get("weights"), rank)
        rows.append(
            [
                str(rank),
                _at(run.devices, rank) or "-",
                str(size),
                f"{weight:.3f}" if isinstance(weight, int | float) else "-",
                _ms(_at(plan.get("predicted_step_times"), rank)),
            ]
        )
    table = text_table(["rank", "device", "batch", "weight", "compute (ms)"], rows, left=2)
    when = "in force at the end" if run.finished else "as training started"
    return (
        f"plan (plan.json, {when})\n"
        f"  policy {plan.get('policy')}, global batch {plan.get('global_batch_size')}, predicted "
        f"step {_ms(plan.get('predicted_step_time'))} ms for a full global batch (slowest rank's "
        "compute + sync)\n" + _indent(table)
    )


def _percent(value: Any) -> str:
    return f"{100 * value:.2f} %" if isinstance(value, int | float) else "-"


def _replan_cell(replan: Mapping[str, Any] | None) -> str:
    if not replan:
        return ""
    old, new = replan.get("old_batch_sizes") or [], replan.get("new_batch_sizes") or []
    return f"{','.join(map(str, old))} -> {','.join(map(str, new))}"


def _epochs(run: Run) -> str:
    if not run.epochs:
        return "epochs (metrics.jsonl): none recorded"
    evaluated = {record["epoch"]: record.get("metrics") or {} for record in run.evaluations}
    names = list(dict.fromkeys(name for metrics in evaluated.values() for name in metrics))
    accuracy = any(isinstance(r.get("accuracy"), int | float) for r in run.epochs)
    header = [
        "epoch",
        "loss",
        *(["train acc"] if accuracy else []),
        *map(metric_title, names),
        "time (s)",
        "samples/s",
        *(["re-plan"] if run.replans else []),
    ]
    rows = []
    for record in run.epochs:
        metrics = evaluated.get(record["epoch"], {})
        loss, seconds, samples = record.get("loss"), record.get("seconds"), record.get("samples")
        rows.append(
            [
                str(record["epoch"]),
                f"{loss:.4f}" if isinstance(loss, int | float) else "-",
                *([_percent(record.get("accuracy"))] if accuracy else []),
                *(format_metric(n, metrics[n]) if n in metrics else "" for n in names),
                f"{seconds:.2f}" if isinstance(seconds, int | float) else "-",
                f"{samples / seconds:,.0f}" if samples and seconds else "-",
                *([_replan_cell(record.get("replan"))] if run.replans else []),
            ]
        )
    note = (
        "" if not run.replans else "\n  re-plan: batch sizes before -> after, from the next epoch"
    )
    return "epochs (metrics.jsonl)\n" + _indent(text_table(header, rows, left=0)) + note


def _seconds(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, int | float) else "-"


def _final(run: Run) -> str:
    summary = run.summary
    if summary is None:
        return "final: no summary.json (the run did not finish)"
    lines = []
    metrics = summary.get("metrics") or {}
    if metrics:
        lines.append(
            "   ".join(f"{metric_title(k)} {format_metric(k, v)}" for k, v in metrics.items())
        )
    rate = summary.get("samples_per_second")
    lines.append(
        f"wall time {_seconds(summary.get('wall_seconds'))} (profiling "
        f"{_seconds(summary.get('profile_seconds'))}, training "
        f"{_seconds(summary.get('train_seconds'))}{wall_time_parts(summary)})"
        + (f", {rate:,.0f} samples/s" if isinstance(rate, int | float) else "")
    )
    error = summary.get("prediction_error_median")
    lines.append(
        f"step time: measured {_ms(summary.get('measured_step_seconds'))} ms, predicted "
        f"{_ms(summary.get('predicted_step_seconds'))} ms a step on average (short last steps "
        "included)"
        + (f"; median error from epoch 2 on {100 * error:.1f}%" if error is not None else "")
    )
    corrected = summary.get("forecast_error_median")
    if corrected is not None:
        lines.append(f"corrected by the epochs measured before each: median error "
                     f"{100 * corrected:.1f}%")  # fmt: skip
    versions = summary.get("versions") or {}
    counts = [
        _plural(summary.get("epochs_run", 0), "epoch"),
        _plural(summary.get("steps", 0), "step"),
        _plural(run.replan_count, "re-plan"),
    ]
    shown = [f"{name} {version}" for name, version in versions.items() if name != "platform"]
    lines.append(", ".join(counts) + ("; " + ", ".join(shown) if shown else ""))
    ranks = summary.get("ranks") or []
    if ranks:
        lines += ["", *_rank_split(ranks).splitlines()]
    return "final (summary.json)\n" + _indent("\n".join(lines))


def _rank_split(ranks: list[dict[str, Any]]) -> str:
    rows = [
        [
            str(row.get("rank")),
            device_label(row),
            str(row.get("batch_size")),
            *(_share(row.get(f"{part}_fraction")) for part in ("compute", "communication", "wait")),
            f"{rss:,.0f}" if isinstance(rss := row.get("peak_rss_mib"), int | float) else "-",
        ]
        for row in ranks
    ]
    header = ["rank", "device", "batch", "compute", "comm", "wait", "peak RSS (MiB)"]
    return text_table(header, rows, left=2) + "\n(shares of each rank's time per step; wait = idle)"


def _share(value: Any) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, int | float) else "-"


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _files(run: Run) -> str:
    files = run.files
    total = _size(sum(files.values()))
    width = max(map(len, files), default=0)
    lines = [f"{name.ljust(width)}  {_size(size):>10}" for name, size in files.items()]
    return f"files ({_plural(len(files), 'file')}, {total})\n" + _indent("\n".join(lines))
