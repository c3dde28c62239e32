"""The balance report as text: an aligned table, markdown, or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable

from lbtrain.report.build import BalanceReport, PolicyResult, rank_rows
from lbtrain.text import markdown_table, text_table

__all__ = ["FORMATS", "format_report"]

FORMATS = ("table", "json", "markdown")

_RANK_HEADER = [
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


def format_report(report: BalanceReport, fmt: str = "table") -> str:
    """Render the report as "table" (aligned text), "markdown" or "json"."""
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is unknown; choose one of {', '.join(FORMATS)}")
    markdown = fmt == "markdown"
    render = markdown_table if markdown else text_table
    lines = _summary(report, render)
    for result in report.results:
        title = (
            f"policy {result.policy}: predicted step {_ms(result.predicted_step_time)} ms "
            f"(compute {_ms(result.compute_time)} + sync {_ms(result.comm_time)})"
        )
        lines += [
            "",
            f"### {title}" if markdown else title,
            "",
            render(_RANK_HEADER, _rank_rows(report, result)),
        ]
    batches = ", ".join(map(str, sorted({profile.throughput_batch for profile in report.profiles})))
    lines += [
        "",
        f"samples/s: measured at batch {batches}; the plans use alpha + beta x batch.",
    ]
    if any(p.slowdown != 1 for p in report.profiles):
        lines.append("xF after a device: emulated slowdown factor (--emulate-slowdown).")
    if report.notes:
        lines += ["", "### notes", ""] if markdown else [""]
        lines += [f"- {note}" if markdown else f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def _summary(report: BalanceReport, render: Callable[..., str]) -> list[str]:
    """The report's head: the ranks, the ideal step, and one table row per policy."""
    p = len(report.profiles)
    ideal = report.ideal
    if report.comm is None:
        sync = "not measured"
    else:
        ranks = report.comm.world_size
        sync = f"measured on {ranks} rank{'s' if ranks != 1 else ''}"
    return [
        f"lbtrain balance report: {p} rank{'s' if p != 1 else ''}, global batch "
        f"{report.global_batch_size}",
        f"ideal step {_ms(ideal.step)} ms = compute {_ms(ideal.compute)} (ranks with samples "
        f"finishing together) + sync {_ms(ideal.comm)} ({sync}); no plan beats it",
        "",
        render(
            ["policy", "compute (ms)", "comm (ms)", "step (ms)", "speedup vs equal", "efficiency"],
            [
                [
                    r.policy,
                    _ms(r.compute_time),
                    _ms(r.comm_time),
                    _ms(r.predicted_step_time),
                    f"{r.speedup_over_equal:.2f}x",
                    f"{100 * r.efficiency:.1f}%",
                ]
                for r in report.results
            ],
            left=1,
        ),
    ]


def _rank_rows(report: BalanceReport, result: PolicyResult) -> list[list[str]]:
    """One row per rank of a policy's plan: the rank's profile, then its share and times."""
    rows = []
    for profile, (b, w, t, idle) in zip(report.profiles, rank_rows(result.plan), strict=True):
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
    return rows


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3f}"
