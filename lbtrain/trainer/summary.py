"""The run summary: per-epoch history, per-rank time split, measured against predicted."""

from __future__ import annotations

import platform
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

import lbtrain
from lbtrain.balancer import BalancePlan
from lbtrain.comm import Communicator
from lbtrain.trainer.loop import EpochRecord

__all__ = [
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


def rank_totals(comm: Communicator, history: Sequence[EpochRecord]) -> list[dict[str, float]]:
    """Every rank's compute, wait and communication seconds over `history`, and its peak RSS.

    Collective. The peak RSS (MiB, key "peak_rss_mib") is left out where the platform has
    no way to read it.
    """
    mine = {
        "steps": float(sum(r.steps for r in history)),
        "seconds": sum(r.seconds for r in history),
        "compute": sum(r.compute for r in history),
        "wait": sum(r.wait for r in history),
        "comm": sum(r.comm for r in history),
    }
    rss = peak_rss_mib()
    if rss is not None:
        mine["peak_rss_mib"] = rss
    return comm.allgather(mine)


def prediction_error(history: Sequence[EpochRecord]) -> float | None:
    """Median of |measured - predicted| / predicted step time over epochs 2 and later.

    The first epoch pays one-off costs (allocation, caches, lazy initialisation) that no
    steady-state model predicts. Epochs without a prediction (an older checkpoint's) are
    left out.
    """
    errors = [
        abs(r.step_seconds - r.predicted_step_seconds) / r.predicted_step_seconds
        for r in history
        if r.epoch >= 1 and r.steps and r.predicted_seconds > 0
    ]
    return statistics.median(errors) if errors else None


def build_summary(
    *,
    plan: BalancePlan,
    devices: Sequence[Mapping[str, Any]],
    history: Sequence[EpochRecord],
    evaluations: Sequence[Mapping[str, Any]],
    totals: Sequence[Mapping[str, float]],
    metrics: Mapping[str, Any] | None,
    wall_seconds: float,
    profile_seconds: float,
) -> dict[str, Any]:
    """The JSON-ready summary.json of a run."""
    steps = max(1, int(totals[0]["steps"])) if totals else 1
    train_seconds = sum(r.seconds for r in history)
    samples = sum(r.samples for r in history)
    ranks = []
    for rank, (total, device) in enumerate(zip(totals, devices, strict=True)):
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
    return {
        "versions": {
            "lbtrain": lbtrain.__version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "world_size": plan.world_size,
        "policy": plan.policy,
        "global_batch": plan.global_batch_size,
        "wall_seconds": wall_seconds,
        "profile_seconds": profile_seconds,
        "train_seconds": train_seconds,
        "samples_per_second": samples / train_seconds if train_seconds > 0 else None,
        "measured_step_seconds": train_seconds / steps if history else None,
        # The prediction for the steps that ran (plans and models change when re-planning),
        # to set beside the measured mean; the plan in force predicts the next step.
        "predicted_step_seconds": _predicted_per_step(history, plan),
        "plan_predicted_step_seconds": plan.predicted_step_time,
        "prediction_error_median": prediction_error(history),
        "epochs": [
            {
                "epoch": r.epoch + 1,
                "loss": r.loss,
                "train_accuracy": r.accuracy,
                "seconds": r.seconds,
                "steps": r.steps,
                "samples": r.samples,
                "batch_sizes": r.batch_sizes,
                "measured_step_seconds": r.step_seconds,
                "predicted_step_seconds": r.predicted_step_seconds,
                "idle_fraction": r.idle_fraction,
                "ranks": r.ranks,
                "replan": r.replan,
            }
            for r in history
        ],
        "evaluations": list(evaluations),
        "ranks": ranks,
        "metrics": dict(metrics) if metrics else None,
    }


def _predicted_per_step(history: Sequence[EpochRecord], plan: BalancePlan) -> float:
    steps = sum(r.steps for r in history)
    if steps == 0:
        return plan.predicted_step_time
    return sum(r.predicted_seconds for r in history) / steps


def format_summary(
    summary: Mapping[str, Any], headline: Sequence[str], outputs: Sequence[str]
) -> str:
    """The end-of-run text rank 0 prints."""
    lines = ["", "run summary"]
    throughput = summary["samples_per_second"]
    lines.append(
        f"  wall time {summary['wall_seconds']:.1f} s (profiling {summary['profile_seconds']:.1f}"
        f" s, training {summary['train_seconds']:.1f} s)"
        + (f", {throughput:,.0f} samples/s" if throughput else "")
    )
    measured = summary["measured_step_seconds"]
    predicted = summary["predicted_step_seconds"]
    if measured:
        error = summary.get("prediction_error_median")
        lines.append(
            f"  step time: measured {1e3 * measured:.2f} ms, predicted {1e3 * predicted:.2f} ms "
            "(slowest rank's compute, then the sync)"
            + (f"; median error from epoch 2 on {100 * error:.1f}%" if error is not None else "")
        )
    replans = sum(1 for epoch in summary["epochs"] if epoch.get("replan"))
    if replans:
        lines.append(f"  re-planned {replans} time(s); the plan in force is shown below")
    header = f"  {'rank':>4}  {'device':<10} {'batch':>6}  {'compute':>8} {'comm':>7} {'wait':>7}"
    lines += ["", header]
    for row in summary["ranks"]:
        device = row["device"] + (f" x{row['slowdown']:g}" if row.get("slowdown", 1) != 1 else "")
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
    if outputs:
        lines += ["", "  outputs: " + ", ".join(outputs)]
    return "\n".join(lines)


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
