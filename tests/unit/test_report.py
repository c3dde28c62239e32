"""The balance report's numbers on fixed, hand-computable profile files.

tests/fixtures/profiles_3ranks.json holds three ranks with step times t_i(b) = alpha_i +
beta_i * b, read at the reference batch 100:

    rank  alpha   beta     t(100)  samples/s
    0     10 ms   0.9 ms   100 ms  1000
    1     30 ms   1.7 ms   200 ms   500
    2     40 ms   3.6 ms   400 ms   250

With B = 300 every rank's water-filling share is positive, so the ideal compute is
T* = (B + sum alpha/beta) / sum(1/beta) = (300 + 11.111 + 17.647 + 11.111) / (1.1111 +
0.58824 + 0.27778) = 171.901 ms.

tests/fixtures/profiles_gpu_cpu.json: a GPU (alpha 1.5 ms, beta 0.6 us) beside three CPUs
whose fixed cost (2.1, 2.4, 2.6 ms) outlasts the GPU's whole step at B = 1024 (2.1144 ms).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lbtrain.balancer import CommCost
from lbtrain.profiling import load_profiles
from lbtrain.report import build_report, format_report, plot_report, require_matplotlib

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "profiles_3ranks.json"
GPU_CPU = FIXTURES / "profiles_gpu_cpu.json"
B = 300
T_STAR = (300 + 10 / 0.9 + 30 / 1.7 + 40 / 3.6) / (1 / 0.9 + 1 / 1.7 + 1 / 3.6) * 1e-3

# Expected plans, worked by hand:
# equal: 100 each; times 100, 200, 400 ms; step 400 ms.
# proportional: 300 * (1000, 500, 250) / 1750 = 171.43, 85.71, 42.86; floors 171, 85, 42
#   leave 2 samples for the largest remainders (.86 rank 2, .71 rank 1): 171, 86, 43.
#   times 10 + 0.9*171 = 163.9, 30 + 1.7*86 = 176.2, 40 + 3.6*43 = 194.8 ms.
# cost: T* = 171.90 ms, so b = 179.9, 83.5, 36.6; floors 179, 83, 36 leave 2 samples, each
#   to the rank that would finish earliest with it: rank 0 (180: 172.0 ms), then rank 1
#   (84: 172.8 ms, before rank 0's 181: 172.9 and rank 2's 37: 173.2).
#   times 172.0, 172.8, 169.6 ms.
EXPECTED = {
    "equal": ((100, 100, 100), (0.100, 0.200, 0.400)),
    "proportional": ((171, 86, 43), (0.1639, 0.1762, 0.1948)),
    "cost": ((180, 84, 36), (0.1720, 0.1728, 0.1696)),
}

# GPU + CPU at B = 1024, by hand (ms). equal: 256 each; 1.5 + 0.0006*256 = 1.6536,
# 2.1 + 0.06*256 = 17.46, 2.4 + 0.07*256 = 20.32, 2.6 + 0.065*256 = 19.24; step 20.32.
# cost: the GPU alone, 1.5 + 0.0006*1024 = 2.1144. T* solves (T - 1.5)/0.0006 +
# (T - 2.1)/0.06 = 1024 (only rank 1's alpha lies below it): T* = 3559 / 1683.33 = 2.114257.
GPU_EQUAL = (
    1.5e-3 + 0.6e-6 * 256,
    2.1e-3 + 60e-6 * 256,
    2.4e-3 + 70e-6 * 256,
    2.6e-3 + 65e-6 * 256,
)
GPU_ALONE = 1.5e-3 + 0.6e-6 * 1024
GPU_T_STAR = (1024 + 1.5 / 0.0006 + 2.1 / 0.06) / (1 / 0.0006 + 1 / 0.06) * 1e-3
# Old figures the report must no longer show: they were read at the reference batch.
GONE = ("ratio", "sum of throughputs", "B / sum")


@pytest.fixture
def report():
    return build_report(load_profiles(FIXTURE), B, "all")


def test_fixture_throughputs_and_the_ideal_step(report):
    assert [p.throughput for p in report.profiles] == pytest.approx([1000, 500, 250])
    assert report.ideal.compute == pytest.approx(T_STAR)
    assert report.ideal.comm == 0.0
    assert report.ideal.step == pytest.approx(T_STAR)
    assert report.notes == ()
    for gone in ("sum_throughput", "ideal_step_time", "throughput_ratio"):
        assert not hasattr(report, gone), gone


@pytest.mark.parametrize("policy", ["equal", "proportional", "cost"])
def test_per_rank_batches_weights_compute_and_idle(report, policy):
    sizes, times = EXPECTED[policy]
    data = report.to_dict()["policies"][policy]
    ranks = data["ranks"]
    assert [r["batch_size"] for r in ranks] == list(sizes)
    assert [r["weight"] for r in ranks] == pytest.approx([b / B for b in sizes])
    assert [r["compute_time"] for r in ranks] == pytest.approx(times)
    step = max(times)
    assert [r["idle_time"] for r in ranks] == pytest.approx([step - t for t in times])
    assert data["compute_time"] == pytest.approx(step)
    assert data["comm_time"] == 0.0
    assert data["predicted_step_time"] == pytest.approx(step)
    assert data["speedup_over_equal"] == pytest.approx(0.400 / step)
    assert data["efficiency"] == pytest.approx(T_STAR / step)
    assert data["idle_ranks"] == []
    assert "of_throughput_ratio" not in data


def test_policy_figures_by_hand(report):
    figures = {r.policy: r for r in report.results}
    assert figures["proportional"].speedup_over_equal == pytest.approx(2.0534, abs=1e-4)
    assert figures["cost"].speedup_over_equal == pytest.approx(2.3148, abs=1e-4)
    # T* / step: 171.901 / 400, / 194.8, / 172.8.
    assert figures["equal"].efficiency == pytest.approx(0.4298, abs=1e-4)
    assert figures["proportional"].efficiency == pytest.approx(0.8825, abs=1e-4)
    assert figures["cost"].efficiency == pytest.approx(0.9948, abs=1e-4)
    for result in report.results:
        assert result.efficiency <= 1.0
    # The slow rank gets the smallest batch under both balancing policies.
    for policy in ("proportional", "cost"):
        sizes = figures[policy].plan.batch_sizes
        assert sizes[2] == min(sizes)


def test_json_format_carries_every_figure(report):
    data = json.loads(format_report(report, "json"))
    assert data["global_batch_size"] == B and data["world_size"] == 3
    assert data["min_batch"] == 0 and data["comm"] is None
    assert data["ideal"]["compute"] == pytest.approx(T_STAR)
    assert data["ideal"]["comm"] == 0.0
    assert data["ideal"]["step"] == pytest.approx(T_STAR)
    assert data["notes"] == []
    for gone in ("sum_throughput", "ideal_step_time", "throughput_ratio"):
        assert gone not in data, gone
    replicas = data["replicas"]
    assert [r["host"] for r in replicas] == ["node-a", "node-a", "node-b"]
    assert [r["samples_per_second"] for r in replicas] == pytest.approx([1000, 500, 250])
    assert [r["alpha"] for r in replicas] == pytest.approx([0.010, 0.030, 0.040])
    assert [r["beta"] for r in replicas] == pytest.approx([0.0009, 0.0017, 0.0036])
    assert [r["cap"] for r in replicas] == [None, None, 4096]
    assert [r["slowdown"] for r in replicas] == [1.0, 2.0, 4.0]
    assert list(data["policies"]) == ["equal", "proportional", "cost"]


def test_single_policy_still_measures_speedup_against_equal():
    report = build_report(load_profiles(FIXTURE), B, "cost")
    (result,) = report.results
    assert result.policy == "cost"
    assert result.speedup_over_equal == pytest.approx(0.400 / 0.1728)


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_text_formats_show_every_column_and_policy(report, fmt):
    text = format_report(report, fmt)
    for needle in (
        "global batch 300",
        "ideal step 171.901 ms",
        "samples/s",
        "alpha (ms)",
        "beta (us/sample)",
        "cap",
        "weight",
        "compute (ms)",
        "comm (ms)",
        "step (ms)",
        "idle (ms)",
        "node-b",
        "cpu x4",
        "4096",
        "194.800",
        "172.800",
        "2.31x",
        "99.5%",
        "88.2%",
        "43.0%",
    ):
        assert needle in text, needle
    for gone in GONE:
        assert gone not in text, gone
    assert "note" not in text  # no rank idles, no smaller launch helps
    assert text.count("policy ") >= 3
    if fmt == "markdown":
        assert "| rank | host |" in text and "### policy cost" in text
    else:
        assert "|" not in text


def test_sync_cost_is_added_to_every_policy_and_to_the_ideal():
    report = build_report(load_profiles(FIXTURE), B, comm=CommCost(seconds=0.004, world_size=3))
    assert report.ideal.comm == pytest.approx(0.004)
    assert report.ideal.step == pytest.approx(T_STAR + 0.004)
    for result in report.results:
        compute = max(EXPECTED[result.policy][1])
        assert result.compute_time == pytest.approx(compute)
        assert result.comm_time == pytest.approx(0.004)
        assert result.predicted_step_time == pytest.approx(compute + 0.004)
        assert result.efficiency == pytest.approx((T_STAR + 0.004) / (compute + 0.004))
    (cost,) = (r for r in report.results if r.policy == "cost")
    assert cost.speedup_over_equal == pytest.approx(0.404 / 0.1768)
    data = report.to_dict()
    assert data["comm"] == {"seconds": 0.004, "world_size": 3, "nbytes": 0}
    assert data["policies"]["cost"]["comm_time"] == pytest.approx(0.004)
    text = format_report(report)
    assert "sync 4.000 (measured on 3 ranks)" in text
    assert "176.800" in text  # cost: 172.8 ms of compute + 4 ms of sync


@pytest.fixture
def gpu_cpu():
    return build_report(load_profiles(GPU_CPU), 1024, "all")


def test_gpu_cpu_efficiency_stays_at_most_one(gpu_cpu):
    figures = {r.policy: r for r in gpu_cpu.results}
    assert gpu_cpu.ideal.compute == pytest.approx(GPU_T_STAR)
    assert figures["equal"].predicted_step_time == pytest.approx(max(GPU_EQUAL))
    assert figures["cost"].predicted_step_time == pytest.approx(GPU_ALONE)
    for result in gpu_cpu.results:
        assert result.efficiency <= 1.0
        assert result.efficiency == pytest.approx(GPU_T_STAR / result.predicted_step_time)
    # The speedup over equal as it is: 20.32 / 2.1144.
    assert figures["cost"].speedup_over_equal == pytest.approx(20.32 / 2.1144)


def test_gpu_cpu_zero_share_ranks_in_tables_json_and_notes(gpu_cpu):
    data = json.loads(format_report(gpu_cpu, "json"))
    cost = data["policies"]["cost"]
    assert [r["batch_size"] for r in cost["ranks"]] == [1024, 0, 0, 0]
    assert [r["compute_time"] for r in cost["ranks"]] == pytest.approx([GPU_ALONE, 0, 0, 0])
    assert [r["idle_time"] for r in cost["ranks"]] == pytest.approx([0] + [GPU_ALONE] * 3)
    assert cost["idle_ranks"] == [1, 2, 3]
    assert data["policies"]["equal"]["idle_ranks"] == []
    (note,) = data["notes"]
    assert note.startswith("ranks 1, 2, 3 get no samples")
    text = format_report(gpu_cpu)
    assert f"note: {note}" in text
    assert text.index("policy cost: predicted step") < text.index("note: ")
    cost_table = text[text.index("policy cost: predicted step") :]
    rows = [line.split() for line in cost_table.splitlines() if line.startswith(("1 ", "2 "))]
    assert [(row[7], row[9]) for row in rows] == [("0", "0.000"), ("0", "0.000")]
    for gone in GONE:
        assert gone not in text, gone
    markdown = format_report(gpu_cpu, "markdown")
    assert "### notes" in markdown and f"- {note}" in markdown


def test_gpu_cpu_with_min_batch_one_notes_what_zero_shares_save():
    report = build_report(load_profiles(GPU_CPU), 1024, "all", min_batch=1)
    (cost,) = (r for r in report.results if r.policy == "cost")
    assert cost.plan.batch_sizes == (1021, 1, 1, 1)
    assert cost.predicted_step_time == pytest.approx(2.6e-3 + 65e-6)
    assert cost.efficiency == pytest.approx(GPU_T_STAR / (2.6e-3 + 65e-6))
    (note,) = report.notes
    assert "min_batch=0" in note and "ranks 1, 2, 3" in note


def test_notes_follow_the_cost_plan_or_else_the_last_policy():
    profiles = load_profiles(GPU_CPU)
    # Without cost, the proportional plan gives every rank samples: no idle-rank note.
    assert build_report(profiles, 1024, "proportional").notes == ()
    # A sync that only a single rank avoids: launching rank 0 alone is the advice.
    comm = CommCost(seconds=5e-3, world_size=4)
    (note,) = build_report(profiles, 1024, "proportional", comm=comm).notes
    assert "rank 0 only" in note
    notes = build_report(profiles, 1024, "cost", comm=comm).notes
    assert any("get no samples" in n for n in notes)
    assert any("rank 0 only" in n for n in notes)


def test_unknown_policy_and_format_are_rejected_in_library_names(report):
    with pytest.raises(ValueError, match=r"^policy='fastest' is unknown"):
        build_report(report.profiles, B, "fastest")
    with pytest.raises(ValueError, match=r"^fmt='html' is unknown"):
        format_report(report, "html")
    with pytest.raises(ValueError, match=r"min_batch=-1"):
        build_report(report.profiles, B, min_batch=-1)


def test_plot_writes_a_png(report, tmp_path):
    pytest.importorskip("matplotlib")
    path = plot_report(report, tmp_path / "plots" / "report.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_get_it(report, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(RuntimeError) as info:
        require_matplotlib()
    message = str(info.value)
    assert "--plot needs matplotlib" in message and "pip install" in message
    with pytest.raises(RuntimeError, match=r"--plot needs matplotlib"):
        plot_report(report, tmp_path / "report.png")
    assert not (tmp_path / "report.png").exists()
