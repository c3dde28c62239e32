"""The run summary: per-epoch history, per-rank time split, measured against predicted."""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

import lbtrain
from lbtrain.balancer import BalancePlan
from lbtrain.comm import Communicator
from lbtrain.text import device_label, format_metric, wall_time_parts
from lbtrain.trainer.records import Totals

__all__ = [
    "device_label",
    "build_summary",
    "format_metric",
    "format_summary",
    "peak_rss_mib",
    "prediction_error",
    "rank_totals",
]


def peak_rss_mib() -> float | None:
    """This process's peak resident set size so far in MiB, or None where it is not known."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def rank_totals(comm: Communicator, totals: Totals) -> list[dict[str, float]]:
    """Every rank's steps, compute, wait and communication seconds over the run, and its
    peak RSS (MiB, key "peak_rss_mib", left out where the platform cannot read it).

    Collective.
    """
    mine = {
        "steps": float(totals.steps),
        "seconds": totals.seconds,
        "compute": totals.compute,
        "wait": totals.wait,
        "comm": totals.comm,
    }
    rss = peak_rss_mib()
    if rss is not None:
        mine["peak_rss_mib"] = rss
    return comm.allgather(mine)


def prediction_error(totals: Totals) -> float | None:
    """Median of |measured - predicted| / predicted step time over epochs 2 and later (the
    latest ERROR_WINDOW of them); None before there are any."""
    return statistics.median(totals.errors) if totals.errors else None


def forecast_error(totals: Totals) -> float | None:
    """The same median for the prediction corrected by the epochs measured before each
    (`Totals.correction`), from the run's second epoch on; None before there are any."""
    return statistics.median(totals.forecast_errors) if totals.forecast_errors else None


def build_summary(
    *,
    plan: BalancePlan,
    devices: Sequence[Mapping[str, Any]],
    totals: Totals,
    ranks_totals: Sequence[Mapping[str, float]],
    evaluations: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, Any] | None,
    wall_seconds: float,
    profile_seconds: float,
    resumed_from: Mapping[str, Any] | None = None,
    flushing: Sequence[bool | None] | None = None,
    worlds: Sequence[Mapping[str, int]] | None = None,
    checkpoints: int = 0,
    checkpoint_seconds: float = 0.0,
    eval_seconds: float = 0.0,
    predict_seconds: float = 0.0,
) -> dict[str, Any]:
    """The JSON-ready summary.json of a run: totals, not the epochs (metrics.jsonl has them).

    `totals`: rank 0's running sums (loss, samples and steps are the job's); `ranks_totals`:
    every rank's time split (`rank_totals`); `resumed_from`: the checkpoint the run
    continued, and where (None for a fresh run). The seconds (rank 0's) and the training
    totals cover every session up to the checkpoint each continued from (on another world
    size, each rank's split covers that world's only), checkpoint writes too, but for the
    one a session resumed from; `predict_seconds` are this session's. `flushing`: whether
    each rank's threads flushed subnormal floats at the end; `worlds`: the numbers of ranks
    the run trained on, each with the global step it trained from.
    """
    ranks = _rank_rows(plan, devices, ranks_totals)
    seconds, steps = totals.seconds, totals.steps
    return {
        "versions": _versions(),
        "resumed_from": dict(resumed_from) if resumed_from else None,
        "worlds": [dict(w) for w in worlds] if worlds else None,
        "flush_denormals": list(flushing) if flushing is not None else None,
        "world_size": plan.world_size,
        "policy": plan.policy,
        "global_batch": plan.global_batch_size,
        "wall_seconds": wall_seconds,
        "profile_seconds": profile_seconds,
        "train_seconds": seconds,
        "checkpoints": checkpoints,
        "checkpoint_seconds": checkpoint_seconds,
        "eval_seconds": eval_seconds,
        "predict_seconds": predict_seconds,
        "epochs_run": totals.epochs,
        "steps": steps,
        "samples_per_second": totals.samples / seconds if seconds > 0 else None,
        "measured_step_seconds": seconds / steps if steps else None,
        **_predictions(plan, totals),
        "replans": totals.replans,
        "first_epoch_loss": totals.first_loss,
        "last_epoch": totals.last,
        "per_epoch": "metrics.jsonl",
        "evaluations": list(evaluations),
        "ranks": ranks,
        "metrics": dict(metrics) if metrics else None,
    }


def _versions() -> dict[str, str]:
    return {
        "lbtrain": lbtrain.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def _predictions(plan: BalancePlan, totals: Totals) -> dict[str, float | None]:
    """The summary's predictions: for the steps that ran (plans and models change when
    re-planning), to set beside the measured mean; the plan in force's for the next step;
    and the errors of the plan's and of the corrected prediction."""
    steps = totals.steps
    return {
        "predicted_step_seconds": totals.predicted_seconds / steps
        if steps
        else plan.predicted_step_time,
        "plan_predicted_step_seconds": plan.predicted_step_time,
        "prediction_error_median": prediction_error(totals),
        "forecast_error_median": forecast_error(totals),
        "forecast_step_seconds": totals.correction(list(plan.batch_sizes))
        * plan.predicted_step_time,
    }


def _rank_rows(
    plan: BalancePlan,
    devices: Sequence[Mapping[str, Any]],
    ranks_totals: Sequence[Mapping[str, float]],
) -> list[dict[str, Any]]:
    ranks = []
    for rank, (total, device) in enumerate(zip(ranks_totals, devices, strict=True)):
        step = max(total["compute"] + total["wait"] + total["comm"], 1e-12)
        ranks.append(
            {
                "rank": rank,
                **dict(device),
                "batch_size": plan.batch_sizes[rank],
                "weight": plan.weights[rank],
                "compute_seconds": total["compute"],
                "communication_seconds": total["comm"],
                "wait_seconds": total["wait"],
                "compute_fraction": total["compute"] / step,
                "communication_fraction": total["comm"] / step,
                "wait_fraction": total["wait"] / step,
                "predicted_compute_seconds_per_step": plan.predicted_step_times[rank],
                "peak_rss_mib": total.get("peak_rss_mib"),
            }
        )
    return ranks


def format_summary(
    summary: Mapping[str, Any], headline: Sequence[str], folder: str | os.PathLike[str] | None
) -> str:
    """The end-of-run text rank 0 prints; it ends with the run `folder` and how to look at it."""
    lines = ["", "run summary"]
    throughput = summary["samples_per_second"]
    lines.append(
        f"  wall time {summary['wall_seconds']:.1f} s (profiling {summary['profile_seconds']:.1f}"
        f" s, training {summary['train_seconds']:.1f} s{wall_time_parts(summary)})"
        + (f", {throughput:,.0f} samples/s" if throughput else "")
    )
    lines += _step_lines(summary)
    replans = summary.get("replans", 0)
    if replans:
        lines.append(f"  re-planned {replans} time(s); the plan in force is shown below")
    header = f"  {'rank':>4}  {'device':<10} {'batch':>6}  {'compute':>8} {'comm':>7} {'wait':>7}"
    lines += ["", header]
    for row in summary["ranks"]:
        device = device_label(row)
        lines.append(
            f"  {row['rank']:>4}  {device:<10} {row['batch_size']:>6}  "
            f"{100 * row['compute_fraction']:>7.1f}% {100 * row['communication_fraction']:>6.1f}% "
            f"{100 * row['wait_fraction']:>6.1f}%"
        )
    lines.append("  (shares of each rank's time per step; wait = idle for the slowest rank)")
    metrics = summary.get("metrics") or {}
    shown = [f"{name} {format_metric(name, metrics[name])}" for name in headline if name in metrics]
    if shown:
        lines += ["", "  " + "   ".join(shown)]
    if folder is not None:
        # The folder and the verb that reads it, not a list of its files: `lbtrain show`
        # lists them, with what is in them.
        shown = shlex.quote(os.fspath(folder))
        lines += ["", f"  run folder: {shown}  (see: lbtrain show {shown})"]
    return "\n".join(lines)


def _step_lines(summary: Mapping[str, Any]) -> list[str]:
    """The measured step against the plan's prediction, and against the corrected one."""
    lines: list[str] = []
    measured = summary["measured_step_seconds"]
    predicted = summary["predicted_step_seconds"]
    if measured:
        error = summary.get("prediction_error_median")
        lines.append(
            f"  step time: measured {1e3 * measured:.2f} ms, predicted {1e3 * predicted:.2f} ms "
            "a step on average, the short last step of each epoch included (slowest rank's "
            "compute, then the sync)"
            + (f"; median error from epoch 2 on {100 * error:.1f}%" if error is not None else "")
        )
        corrected = summary.get("forecast_error_median")
        if corrected is not None:
            lines.append(
                "  corrected by the epochs measured before each: median error "
                f"{100 * corrected:.1f}%; the next step "
                f"{1e3 * summary['forecast_step_seconds']:.2f} ms"
            )
    return lines
