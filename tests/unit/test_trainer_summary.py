"""The run summary: the peak RSS each rank reports (issue 10, benchmark 7), the metrics' text."""

from __future__ import annotations

import dataclasses
import resource
import statistics

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


def test_an_epoch_taken_up_by_another_world_keeps_the_jobs_sums_and_measures_its_own():
    """Re-planning reads a rank's measured steps, samples and seconds: after a resume on
    another number of ranks those must be the resumed steps only, not the epoch's."""
    before = EpochRecord(
        epoch=3, steps=3, samples=120, loss_sum=60.0, metric_sum=40.0, seconds=3.0,
        compute=2.5, wait=0.2, comm=0.3, own_samples=30, predicted_seconds=2.7, lr=1e-3,
        batch_sizes=[10, 30],
    )  # fmt: skip
    taken_up = EpochRecord(**before.to_dict()).job_wide(batch_sizes=[40], slowdown=2.0)
    assert (taken_up.steps, taken_up.samples, taken_up.loss) == (3, 120, 0.5)
    assert (taken_up.seconds, taken_up.lr, taken_up.batch_sizes) == (3.0, 1e-3, [40])
    assert taken_up.measured()["steps"] == 0 and taken_up.measured()["seconds"] == 0
    # Two more steps on the new world: the epoch has 5, this rank measured 2 of them.
    taken_up.steps, taken_up.seconds, taken_up.own_samples = 5, 5.0, 80
    taken_up.compute, taken_up.wait, taken_up.comm = 1.6, 0.1, 0.3
    mine = taken_up.measured()
    assert (mine["steps"], mine["samples"], mine["seconds"]) == (2, 80, 2.0)
    assert mine["seconds_per_sample"] == pytest.approx(1.6 / 80) and mine["slowdown"] == 2.0
    # A checkpoint of the new world carries the counts, so a second stop keeps them apart.
    assert EpochRecord(**taken_up.to_dict()).measured() == mine


def test_a_resume_on_other_threads_or_hosts_says_what_moved(capsys):
    from lbtrain import SingleProcessCommunicator, plan_batches
    from lbtrain.trainer import TrainConfig
    from lbtrain.trainer.initial_plan import _resumed_plan

    device = {"device": "cpu", "host": "a", "threads": 1, "slowdown": 1.0}
    checkpoint = {
        "devices": [device],
        "plan": plan_batches([1.0], 40, "cost").to_dict(),
        "config": {},
        "profiles": None,
    }
    config = TrainConfig(workload="faulty", global_batch=40)
    now = [{**device, "threads": 2}]
    assert _resumed_plan(SingleProcessCommunicator(), config, checkpoint, now) is None
    line = capsys.readouterr().out.strip()
    assert line.startswith(
        "the checkpoint ran on 1 rank (cpu), this job on 1 (cpu); threads 1 -> 2:"
    ), line
    # Another device is named by its label, with nothing more.
    _resumed_plan(SingleProcessCommunicator(), config, checkpoint, [{**device, "slowdown": 2.0}])
    assert "this job on 1 (cpu x2): planning again" in capsys.readouterr().out
    # A change no label shows and no field names leaves no empty list behind.
    checkpoint["devices"] = [{**device, "slowdown": 2.0}]
    _resumed_plan(
        SingleProcessCommunicator(), config, checkpoint, [{**device, "slowdown": 2.0 + 1e-7}]
    )
    assert "this job on 1 (cpu x2): planning again" in capsys.readouterr().out


def test_the_prediction_is_corrected_by_the_epochs_measured_before_each():
    """A plan that predicts 100 ms where steps take 120: from the run's second epoch, each
    epoch's prediction is the plan's times measured / predicted over the epochs before it
    (the first, which pays one-off costs, only until a later one is measured), so its error
    falls where the plan's stays at 20%."""
    totals = Totals()
    seconds = [1.3, 1.2, 1.2, 1.26, 1.14]  # 10 steps an epoch, predicted 1.0 s each
    expected = [1.0, 1.3] + [sum(seconds[1:e]) / (e - 1) for e in range(2, len(seconds))]
    for epoch, measured in enumerate(seconds):
        record = EpochRecord(epoch=epoch, steps=10, seconds=measured, predicted_seconds=1.0,
                             correction=totals.correction())  # fmt: skip
        assert record.forecast_step_seconds == pytest.approx(0.1 * expected[epoch])
        totals.add(record)
    assert list(totals.errors) == pytest.approx([0.2, 0.2, 0.26, 0.14])
    assert list(totals.forecast_errors) == pytest.approx(
        [abs(m / c - 1) for m, c in zip(seconds[1:], expected[1:], strict=True)]
    )
    assert statistics.median(totals.forecast_errors) < 0.06
    # It travels in checkpoints, and not to another world size.
    again = Totals.from_state(totals.state_dict())
    assert again.correction() == totals.correction() == pytest.approx(4.8 / 4)
    assert list(again.forecast_errors) == list(totals.forecast_errors)
    assert again.first_calibration == totals.first_calibration == (1.3, 1.0)
    assert totals.job_wide().correction() == 1.0
    # A re-planned plan's model was rescaled to the measured epochs already: no second
    # correction on top, and its own epochs correct it from then on.
    assert totals.correction([30, 34]) == 1.0
    totals.add(EpochRecord(epoch=5, steps=10, seconds=1.5, predicted_seconds=1.0,
                           batch_sizes=[30, 34], correction=1.0))  # fmt: skip
    assert totals.correction([30, 34]) == pytest.approx(1.5)
    assert totals.correction([40, 24]) == 1.0
    # An epoch taken up by another world size: its prediction uncorrected, and its figures
    # (partly the other world's) correct nothing.
    carried = EpochRecord(
        epoch=6, steps=10, seconds=3.0, predicted_seconds=1.0, batch_sizes=[30, 34], correction=1.5
    ).job_wide([20, 20, 24], 1.0)
    assert carried.correction == 1.0
    totals.add(dataclasses.replace(carried, steps=20, seconds=4.0, predicted_seconds=2.0))
    assert totals.correction([20, 20, 24]) == 1.0 and totals.correction([30, 34]) == 1.5


def test_the_summary_says_the_corrected_prediction_beside_the_plans():
    plan = plan_batches([1.0], 8, "equal")
    totals = Totals()
    for epoch in range(3):
        totals.add(EpochRecord(epoch=epoch, steps=4, seconds=0.6, predicted_seconds=0.4,
                               batch_sizes=[8], correction=totals.correction([8])))  # fmt: skip
    devices = [{"device": "cpu", "host": "h", "threads": 1, "slowdown": 1.0}]
    ranks = [{"steps": 12.0, "seconds": 1.8, "compute": 1.8, "wait": 0.0, "comm": 0.0}]
    summary = build_summary(
        plan=plan, devices=devices, totals=totals, evaluations=[], ranks_totals=ranks,
        metrics=None, wall_seconds=2.0, profile_seconds=0.1,
    )  # fmt: skip
    assert summary["prediction_error_median"] == pytest.approx(0.5)
    assert summary["forecast_error_median"] == pytest.approx(0.0)
    assert summary["forecast_step_seconds"] == pytest.approx(1.5 * plan.predicted_step_time)
    text = format_summary(summary, (), None)
    assert "corrected by the epochs measured before each: median error 0.0%" in text


def test_the_wall_time_shows_evaluations_predictions_and_checkpoints_where_they_show():
    plan = plan_batches([1.0], 8, "equal")
    devices = [{"device": "cpu", "host": "h", "threads": 1, "slowdown": 1.0}]
    totals = [{"steps": 2.0, "seconds": 1.0, "compute": 0.8, "wait": 0.1, "comm": 0.1}]

    def wall_line(**checkpoints) -> str:
        summary = build_summary(
            plan=plan, devices=devices, totals=Totals(), ranks_totals=totals, evaluations=[],
            metrics=None, wall_seconds=9.0, profile_seconds=0.5, **checkpoints,
        )  # fmt: skip
        return format_summary(summary, (), None).splitlines()[2]

    line = wall_line(checkpoints=3, checkpoint_seconds=1.25)
    assert line.startswith("  wall time 9.0 s (profiling 0.5 s, training 0.0 s, checkpoints 1.2")
    assert "checkpoints" not in wall_line(checkpoints=3, checkpoint_seconds=0.01)
    assert wall_line().startswith("  wall time 9.0 s (profiling 0.5 s, training 0.0 s)")
    line = wall_line(eval_seconds=2.04, predict_seconds=3.96, checkpoint_seconds=0.3)
    assert line.startswith(
        "  wall time 9.0 s (profiling 0.5 s, training 0.0 s, evaluation 2.0 s, predictions "
        "4.0 s, checkpoints 0.3 s)"
    )
    assert "evaluation" not in wall_line(eval_seconds=0.04, predict_seconds=1.0)
