"""The run summary: the peak RSS each rank reports (issue 10, benchmark 7), the metrics' text."""

from __future__ import annotations

import resource

import pytest

from lbtrain import SingleProcessCommunicator, plan_batches
from lbtrain.trainer.records import EpochRecord, Totals
from lbtrain.trainer.summary import (
    build_summary,
    format_metric,
    format_summary,
    peak_rss_mib,
    rank_totals,
)


def test_rank_totals_carry_this_process_peak_rss_in_mib():
    mine = Totals()
    mine.add(EpochRecord(epoch=0, steps=3, seconds=1.5, compute=1.0, wait=0.3, comm=0.2))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    (totals,) = rank_totals(SingleProcessCommunicator(), mine)
    after = peak_rss_mib()
    assert totals["steps"] == 3.0 and totals["compute"] == pytest.approx(1.0)
    # A peak only grows, and a Python process with torch loaded holds tens of MiB at least.
    assert 10 < before <= totals["peak_rss_mib"] <= after


def test_summary_writes_each_rank_peak_rss():
    plan = plan_batches([1.0, 1.0], 8, "equal")
    devices = [{"device": "cpu", "host": "h", "threads": 1, "slowdown": 1.0}] * 2
    totals = [
        {"steps": 2.0, "seconds": 1.0, "compute": 0.8, "wait": 0.1, "comm": 0.1, "peak_rss_mib": m}
        for m in (512.0, 640.5)
    ]
    summary = build_summary(
        plan=plan, devices=devices, totals=Totals(), evaluations=[], ranks_totals=totals,
        metrics=None,
        wall_seconds=2.0, profile_seconds=0.5,
    )  # fmt: skip
    assert [row["peak_rss_mib"] for row in summary["ranks"]] == [512.0, 640.5]
    # Totals from a platform without getrusage have no peak: the summary says null.
    for total in totals:
        del total["peak_rss_mib"]
    summary = build_summary(
        plan=plan, devices=devices, totals=Totals(), evaluations=[], ranks_totals=totals,
        metrics=None,
        wall_seconds=2.0, profile_seconds=0.5,
    )  # fmt: skip
    assert [row["peak_rss_mib"] for row in summary["ranks"]] == [None, None]


def test_kappa_reads_as_a_coefficient_and_accuracies_as_percentages():
    assert format_metric("kappa", 0.30421) == "0.3042"
    assert format_metric("kappa", -0.05) == "-0.0500"  # worse than chance: still a coefficient
    assert format_metric("kappa", 1) == "1.0000"
    assert format_metric("oa", 0.9529) == "95.29 %"
    assert format_metric("loss", 2.5) == "2.5"
    plan = plan_batches([1.0], 8, "equal")
    devices = [{"device": "cpu", "host": "h", "threads": 1, "slowdown": 1.0}]
    totals = [{"steps": 2.0, "seconds": 1.0, "compute": 0.8, "wait": 0.1, "comm": 0.1}]
    metrics = {"oa": 0.9529, "aa": 0.8775, "kappa": 0.94631}
    summary = build_summary(
        plan=plan, devices=devices, totals=Totals(), ranks_totals=totals, evaluations=[],
        metrics=metrics, wall_seconds=2.0, profile_seconds=0.5,
    )  # fmt: skip
    text = format_summary(summary, ("oa", "aa", "kappa"), None)
    assert "  oa 95.29 %   aa 87.75 %   kappa 0.9463" in text.splitlines()
    assert "x 100" not in text and "94.63" not in text and "run folder" not in text
    # The run's last line: its folder, quoted where a shell would split it, and the verb.
    text = format_summary(summary, ("oa",), "runs/my run")
    assert text.splitlines()[-1] == "  run folder: 'runs/my run'  (see: lbtrain show 'runs/my run')"


@pytest.mark.parametrize("resumed", [False, True])
def test_a_resume_on_a_re_planned_plan_says_which_plan_trains(resumed):
    # The report plans from the profiles taken before training; a resume goes on with the
    # plan in force at its checkpoint, and once printed only the report's, a plan unused.
    from types import SimpleNamespace

    from lbtrain.profiling import load_profiles
    from lbtrain.trainer.setup import _describe_plan

    profiles = load_profiles("tests/fixtures/profiles_3ranks.json")
    planned = plan_batches(profiles, 64, "cost")
    plan = plan_batches([1.0, 1.0, 1.0], 64, "cost") if resumed else planned
    assert plan.batch_sizes != planned.batch_sizes or not resumed
    said: list[str] = []
    setup = SimpleNamespace(
        plan=plan, profiles=profiles, config=SimpleNamespace(emulate_change=None), say=said.append
    )
    _describe_plan(setup)
    note = [line for line in said if line.startswith("training goes on with the checkpoint's")]
    assert bool(note) == resumed, said
    if resumed:
        assert f"batches {list(plan.batch_sizes)} of 64" in note[0], note
