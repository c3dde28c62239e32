"""The balance report: what each policy predicts for a set of replica profiles."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtrain.balancer import POLICIES, BalancePlan, plan_batches
from lbtrain.profiling.record import ReplicaProfile

__all__ = [
    "BalanceReport",
    "PolicyResult",
    "build_report",
    "format_report",
    "plot_report",
    "require_matplotlib",
]

FORMATS = ("table", "json", "markdown")


@dataclass(frozen=True)
class PolicyResult:
    """One policy's plan and its predicted figures.

    Args:
        plan: the BalancePlan.
        speedup_over_equal: equal's predicted step time / this policy's.
        efficiency: ideal step time B / sum(throughputs), divided by the predicted step time.
        of_throughput_ratio: speedup_over_equal / the report's throughput_ratio; 1.0 means
            the policy buys all the speedup the measured throughputs promise.
    """

    plan: BalancePlan
    speedup_over_equal: float
    efficiency: float
    of_throughput_ratio: float

    @property
    def policy(self) -> str:
        """The policy name."""
        return self.plan.policy

    @property
    def predicted_step_time(self) -> float:
        """Seconds per synchronous step: the slowest rank's compute time."""
        return self.plan.predicted_step_time


@dataclass(frozen=True)
class BalanceReport:
    """Per-rank and per-policy predictions for one global batch size.

    Args:
        profiles: one profile per rank.
        global_batch_size: B.
        results: one PolicyResult per policy reported, in order.
    """

    profiles: tuple[ReplicaProfile, ...]
    global_batch_size: int
    results: tuple[PolicyResult, ...]

    @property
    def sum_throughput(self) -> float:
        """Sum of the measured throughputs, samples/s."""
        return sum(p.throughput for p in self.profiles)

    @property
    def ideal_step_time(self) -> float:
        """B / sum(throughputs): a step if every replica ran at its measured speed, no idle."""
        return self.global_batch_size / self.sum_throughput

    @property
    def throughput_ratio(self) -> float:
        """sum(s) / (P * min(s)): the speedup over `equal` the measured throughputs imply.

        With step time proportional to the batch, `equal` takes (B/P) / min(s) per step and a
        perfect balance B / sum(s); their quotient is this ratio. A fixed cost per step, a
        cap or integer rounding keeps a real plan somewhat below it.
        """
        throughputs = [p.throughput for p in self.profiles]
        return sum(throughputs) / (len(throughputs) * min(throughputs))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every figure the report shows."""
        return {
            "global_batch_size": self.global_batch_size,
            "world_size": len(self.profiles),
            "sum_throughput": self.sum_throughput,
            "ideal_step_time": self.ideal_step_time,
            "throughput_ratio": self.throughput_ratio,
            "replicas": [_replica_dict(p) for p in self.profiles],
            "policies": {
                result.policy: {
                    "predicted_step_time": result.predicted_step_time,
                    "speedup_over_equal": result.speedup_over_equal,
                    "efficiency": result.efficiency,
                    "of_throughput_ratio": result.of_throughput_ratio,
                    "ranks": [
                        {
                            "rank": rank,
                            "batch_size": b,
                            "weight": w,
                            "compute_time": t,
                            "idle_time": idle,
                        }
                        for rank, (b, w, t, idle) in enumerate(_rank_rows(result.plan))
                    ],
                }
                for result in self.results
            },
        }


def _replica_dict(profile: ReplicaProfile) -> dict[str, Any]:
    return {
        "rank": profile.rank,
        "host": profile.host,
        "device": profile.device,
        "device_name": profile.device_name,
        "threads": profile.threads,
        "slowdown": profile.slowdown,
        "samples_per_second": profile.throughput,
        "throughput_batch": profile.throughput_batch,
        "alpha": profile.alpha,
        "beta": profile.beta,
        "r_squared": profile.r_squared,
        "cap": profile.cap,
    }


def _rank_rows(plan: BalancePlan) -> list[tuple[int, float, float, float]]:
    return list(
        zip(
            plan.batch_sizes,
            plan.weights,
            plan.predicted_step_times,
            plan.predicted_idle_times,
            strict=True,
        )
    )


def build_report(
    profiles: Sequence[ReplicaProfile],
    global_batch_size: int,
    policies: Sequence[str] | str = "all",
    *,
    min_batch: int = 1,
) -> BalanceReport:
    """Plan one global batch under each policy and predict what each buys.

    Args:
        profiles: one profile per rank, in rank order.
        global_batch_size: B.
        policies: "all", one policy name, or a list of them.
        min_batch: smallest batch any rank may get.

    Returns:
        The BalanceReport. `equal` is always planned, as the baseline of the speedups.
    """
    if isinstance(policies, str):
        policies = list(POLICIES) if policies == "all" else [policies]
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"--policy {policy!r} is unknown; choose one of {POLICIES} or all")
    profiles = tuple(profiles)
    if not profiles:
        raise ValueError("no profiles to report on; profile at least one rank")
    equal = plan_batches(profiles, global_batch_size, "equal", min_batch=min_batch)
    throughputs = [p.throughput for p in profiles]
    ideal = global_batch_size / sum(throughputs)
    ratio = sum(throughputs) / (len(throughputs) * min(throughputs))
    results = []
    for policy in policies:
        plan = (
            equal
            if policy == "equal"
            else plan_batches(profiles, global_batch_size, policy, min_batch=min_batch)
        )
        speedup = equal.predicted_step_time / plan.predicted_step_time
        results.append(
            PolicyResult(
                plan=plan,
                speedup_over_equal=speedup,
                efficiency=ideal / plan.predicted_step_time,
                of_throughput_ratio=speedup / ratio,
            )
        )
    return BalanceReport(profiles, global_batch_size, tuple(results))


def format_report(report: BalanceReport, fmt: str = "table") -> str:
    """Render the report as "table" (aligned text), "markdown" or "json"."""
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r} is unknown; choose one of {FORMATS}")
    render = _markdown_table if fmt == "markdown" else _text_table
    p = len(report.profiles)
    batches = sorted({profile.throughput_batch for profile in report.profiles})
    at = ", ".join(map(str, batches))
    lines = [
        f"lbtrain balance report: {p} rank{'s' if p != 1 else ''}, global batch "
        f"{report.global_batch_size}",
        f"sum of throughputs {report.sum_throughput:,.1f} samples/s (each at batch {at}); "
        f"ideal step B / sum = {_ms(report.ideal_step_time)} ms",
        f"throughput ratio sum / (P x slowest) = {report.throughput_ratio:.2f}x: the speedup "
        "over equal that the measured throughputs imply",
        "",
        render(
            ["policy", "step time (ms)", "speedup vs equal", "of ratio", "efficiency"],
            [
                [
                    r.policy,
                    _ms(r.predicted_step_time),
                    f"{r.speedup_over_equal:.2f}x",
                    f"{100 * r.of_throughput_ratio:.1f}%",
                    f"{100 * r.efficiency:.1f}%",
                ]
                for r in report.results
            ],
        ),
    ]
    header = [
        "rank",
        "host",
        "device",
        "samples/s",
        "alpha (ms)",
        "beta (us/sample)",
        "cap",
        "batch",
        "weight",
        "compute (ms)",
        "idle (ms)",
    ]
    for result in report.results:
        rows = []
        for profile, (b, w, t, idle) in zip(report.profiles, _rank_rows(result.plan), strict=True):
            device = profile.device + (f" x{profile.slowdown:g}" if profile.slowdown != 1 else "")
            rows.append(
                [
                    str(profile.rank),
                    profile.host,
                    device,
                    f"{profile.throughput:,.1f}",
                    f"{1e3 * profile.alpha:.3f}",
                    f"{1e6 * profile.beta:.2f}",
                    "-" if profile.cap is None else str(profile.cap),
                    str(b),
                    f"{w:.4f}",
                    _ms(t),
                    _ms(idle),
                ]
            )
        title = f"policy {result.policy}: predicted step {_ms(result.predicted_step_time)} ms"
        lines += ["", f"### {title}" if fmt == "markdown" else title, "", render(header, rows)]
    if any(p.slowdown != 1 for p in report.profiles):
        lines += ["", "xF after a device: emulated slowdown factor (--emulate-slowdown)."]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3f}"


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        padded = [
            cell.ljust(width) if index < 3 else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


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
    """Draw one bar per rank, compute plus idle, for each policy side by side.

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
        axis.bar(ranks, compute, color="tab:blue", label="compute")
        axis.bar(ranks, idle, bottom=compute, color="tab:red", alpha=0.35, label="idle")
        for rank, b, top in zip(ranks, result.plan.batch_sizes, compute, strict=True):
            axis.annotate(f"b={b}", (rank, top), ha="center", va="bottom", fontsize=8)
        axis.set_title(
            f"{result.policy}: {1e3 * result.predicted_step_time:.1f} ms/step\n"
            f"{result.speedup_over_equal:.2f}x vs equal, {100 * result.efficiency:.0f}% eff."
        )
        axis.set_xlabel("rank")
        axis.set_xticks(ranks)
    axes[0][0].set_ylabel("predicted time per step (ms)")
    axes[0][0].legend(loc="upper left")
    figure.suptitle(f"lbtrain balance report, global batch {report.global_batch_size}")
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
