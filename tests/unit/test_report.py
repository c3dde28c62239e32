"""The balance report's numbers on a fixed, hand-computable profile file.

tests/fixtures/profiles_3ranks.json holds three ranks with step times t_i(b) = alpha_i +
beta_i * b, read at the reference batch 100:

    rank  alpha   beta     t(100)  samples/s
    0     10 ms   0.9 ms   100 ms  1000
    1     30 ms   1.7 ms   200 ms   500
    2     40 ms   3.6 ms   400 ms   250

With B = 300: sum of throughputs 1750, ideal step 300/1750 = 171.43 ms, throughput ratio
1750 / (3 * 250) = 2.3333.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lbtrain.profiling import build_report, format_report, load_profiles, plot_report
from lbtrain.profiling.report import require_matplotlib

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles_3ranks.json"
B = 300
IDEAL = 300 / 1750
RATIO = 1750 / 750

# Expected plans, worked by hand:
# equal: 100 each; times 100, 200, 400 ms; step 400 ms.
# proportional: 300 * (1000, 500, 250) / 1750 = 171.43, 85.71, 42.86; floors 171, 85, 42
#   leave 2 samples for the largest remainders (.86 rank 2, .71 rank 1): 171, 86, 43.
#   times 10 + 0.9*171 = 163.9, 30 + 1.7*86 = 176.2, 40 + 3.6*43 = 194.8 ms.
# cost: T = (B + sum alpha/beta) / sum(1/beta) = (300 + 11.111 + 17.647 + 11.111) /
#   (1111.1 + 588.24 + 277.78) = 171.90 ms, so b = 179.9, 83.5, 36.6; floors 179, 83, 36
#   leave 2 samples, each to the rank that would finish earliest with it: rank 0 (180:
#   172.0 ms), then rank 1 (84: 172.8 ms, before rank 0's 181: 172.9 and rank 2's 37: 173.2).
#   times 172.0, 172.8, 169.6 ms.
EXPECTED = {
    "equal": ((100, 100, 100), (0.100, 0.200, 0.400)),
    "proportional": ((171, 86, 43), (0.1639, 0.1762, 0.1948)),
    "cost": ((180, 84, 36), (0.1720, 0.1728, 0.1696)),
}


@pytest.fixture
def report():
    return build_report(load_profiles(FIXTURE), B, "all")


def test_fixture_throughputs_at_the_reference_batch(report):
    assert [p.throughput for p in report.profiles] == pytest.approx([1000, 500, 250])
    assert report.sum_throughput == pytest.approx(1750)
    assert report.ideal_step_time == pytest.approx(IDEAL)
    assert report.throughput_ratio == pytest.approx(RATIO)


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
    assert data["predicted_step_time"] == pytest.approx(step)
    assert data["speedup_over_equal"] == pytest.approx(0.400 / step)
    assert data["efficiency"] == pytest.approx(IDEAL / step)
    assert data["of_throughput_ratio"] == pytest.approx(0.400 / step / RATIO)


def test_policy_figures_by_hand(report):
    figures = {r.policy: r for r in report.results}
    assert figures["proportional"].speedup_over_equal == pytest.approx(2.0534, abs=1e-4)
    assert figures["cost"].speedup_over_equal == pytest.approx(2.3148, abs=1e-4)
    assert figures["equal"].efficiency == pytest.approx(0.4286, abs=1e-4)
    assert figures["proportional"].efficiency == pytest.approx(0.8800, abs=1e-4)
    assert figures["cost"].efficiency == pytest.approx(0.9921, abs=1e-4)
    # The slow rank gets the smallest batch under both balancing policies.
    for policy in ("proportional", "cost"):
        sizes = figures[policy].plan.batch_sizes
        assert sizes[2] == min(sizes)


def test_json_format_carries_every_figure(report):
    data = json.loads(format_report(report, "json"))
    assert data["global_batch_size"] == B and data["world_size"] == 3
    assert data["throughput_ratio"] == pytest.approx(RATIO)
    assert data["ideal_step_time"] == pytest.approx(IDEAL)
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
        "2.33x",
        "171.429",
        "samples/s",
        "alpha (ms)",
        "beta (us/sample)",
        "cap",
        "weight",
        "compute (ms)",
        "idle (ms)",
        "node-b",
        "cpu x4",
        "4096",
        "194.800",
        "172.800",
        "2.31x",
        "99.2%",
    ):
        assert needle in text, needle
    assert text.count("policy ") >= 3
    if fmt == "markdown":
        assert "| rank | host |" in text and "### policy cost" in text
    else:
        assert "|" not in text


def test_unknown_policy_and_format_are_rejected(report):
    with pytest.raises(ValueError, match=r"--policy"):
        build_report(report.profiles, B, "fastest")
    with pytest.raises(ValueError, match=r"--format"):
        format_report(report, "html")


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
