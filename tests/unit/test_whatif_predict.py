"""lbtrain.whatif.predict and `lbtrain what-if`: hand computations, monotonicity, bad input."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest

from lbtrain.balancer import ideal_step, plan_batches
from lbtrain.cli.entry import main
from lbtrain.comm import SingleProcessCommunicator
from lbtrain.whatif.cluster import parse_cluster, parse_network
from lbtrain.whatif.devices import BUILTIN_DEVICES
from lbtrain.whatif.predict import (
    UNCALIBRATED_EFFICIENCY,
    Roofline,
    SpeedModel,
    predict,
    profile_matches,
    scaling,
    speed_models,
)

FIXTURE = "tests/fixtures/profiles_gpu_cpu.json"
SPEEDS = {"h100": SpeedModel(1e-3, 1e-4, "test"), "cpu-core": SpeedModel(2e-3, 1e-3, "test")}
FLAT = parse_network("intra=1GB/s,0us")


def test_prediction_equals_a_hand_computation_for_two_kinds():
    # T = 1 ms + 0.1 ms x b_gpu = 2 ms + 1 ms x b_cpu with 2 b_gpu + 2 b_cpu = 240:
    # b_cpu = 10, b_gpu = 110, T = 12 ms. Sync of 1 MB over 2 nodes of 2 ranks at 1 GB/s and
    # no latency: 1 ms inside each node + 1 ms between the nodes + 1 ms broadcast = 3 ms.
    cluster = parse_cluster("2x h100, 2x cpu-core@4")
    result = predict(cluster, FLAT, SPEEDS, 240, "cost", gradient_bytes=10**6)
    assert [(g.batch_min, g.batch_max, g.zero) for g in result.groups] == [(110, 110, 0)] * 1 + [
        (10, 10, 0)
    ]
    assert result.compute == pytest.approx(12e-3)
    assert result.sync == pytest.approx(3e-3)
    assert result.step == pytest.approx(15e-3)
    assert result.throughput == pytest.approx(240 / 15e-3)
    assert result.ideal_step == pytest.approx(15e-3)
    assert result.efficiency == pytest.approx(1.0)
    assert [g.idle for g in result.groups] == pytest.approx([0.0, 0.0])


def test_the_grouped_ideal_equals_the_balancers_per_rank_ideal():
    cluster = parse_cluster("3x h100, 5x cpu-core@4")
    result = predict(cluster, FLAT, SPEEDS, 1001, "equal", gradient_bytes=10**6)
    replicas = [1.0] * 0
    for group in cluster.groups:
        s = SPEEDS[group.device.name]
        replicas += [{"throughput": 1 / s.beta, "alpha": s.alpha, "beta": s.beta}] * group.count
    plan = plan_batches(replicas, 1001, "equal")
    assert result.compute == pytest.approx(plan.predicted_compute_time)
    assert result.ideal_compute == pytest.approx(ideal_step(plan).compute, rel=1e-6)
    assert result.efficiency < 0.5  # equal shares leave the GPUs waiting for the CPU cores


def test_more_devices_never_slow_the_step_beyond_the_added_sync():
    before = None
    for cores in range(0, 40, 3):
        spec = "2x h100" + (f", {cores}x cpu-core@8" if cores else "")
        result = predict(parse_cluster(spec), FLAT, SPEEDS, 500, "cost", 10**6)
        if before is not None:
            assert result.compute <= before.compute + 1e-12
            assert result.step <= before.compute + result.sync + 1e-12
        before = result


@pytest.mark.parametrize("weak", [False, True])
def test_scaling_speedup_is_at_most_the_devices_and_efficiency_at_most_one(weak):
    network = parse_network("intra=900GB/s,5us; inter=100Gb/s,2us")
    counts = [1, 2, 3, 4, 8, 16, 64]
    rows = scaling(BUILTIN_DEVICES["h100"], counts, network, SPEEDS, 256, weak, 10**8)
    assert [r.devices for r in rows] == counts
    assert rows[0].speedup == pytest.approx(1.0)
    for row in rows:
        assert row.speedup <= row.devices + 1e-9
        assert 0 < row.efficiency <= 1 + 1e-9
    if weak:
        assert [r.global_batch for r in rows] == [256 * n for n in counts]


@pytest.mark.parametrize("policy", ["equal", "proportional", "cost"])
def test_efficiency_is_at_most_one(policy):
    for gpus, cores in itertools.product([1, 3], [1, 7, 20]):
        cluster = parse_cluster(f"{gpus}x h100, {cores}x cpu-core@4")
        result = predict(cluster, FLAT, SPEEDS, 997, policy, 10**5)
        assert 0 < result.efficiency <= 1 + 1e-12
        assert sum(g.count for g in result.groups) == gpus + cores


def _profile(kind, name, alpha, beta, threads=1):
    return SimpleNamespace(device_kind=kind, device_name=name, alpha=alpha, beta=beta,
                           threads=threads)  # fmt: skip


def test_profiles_match_by_name_for_gpus_and_by_kind_for_cores():
    h100, t4, core = (BUILTIN_DEVICES[n] for n in ("h100", "t4", "cpu-core"))
    gpu = _profile("cuda", "NVIDIA H100 80GB HBM3", 1e-3, 1e-5)
    cpu = _profile("cpu", "AMD EPYC", 2e-3, 1e-3, threads=4)
    assert profile_matches(h100, gpu) and not profile_matches(t4, gpu)
    assert profile_matches(core, cpu) and not profile_matches(core, gpu)
    assert profile_matches(t4, gpu, key="cuda") and profile_matches(t4, gpu, key="h100")
    models = speed_models([h100, core], [gpu, cpu])
    assert (models["h100"].alpha, models["h100"].beta) == (1e-3, 1e-5)
    # A profile of 4 threads stands for 4 cores: one core takes 4 times as long per sample.
    assert (models["cpu-core"].alpha, models["cpu-core"].beta) == (2e-3, 4e-3)


def test_the_roofline_is_calibrated_by_a_profile_of_the_kind():
    h100, t4 = BUILTIN_DEVICES["h100"], BUILTIN_DEVICES["t4"]
    roofline = Roofline(flops_per_sample=67e12 * 1e-5 * 0.25)  # 25% of the H100's peak
    gpu = _profile("cuda", "NVIDIA H100", 1e-3, 1e-5)
    models = speed_models([h100, t4], [gpu], roofline)
    assert models["t4"].beta == pytest.approx(roofline.flops_per_sample / t4.flops / 0.25)
    assert models["t4"].alpha == 1e-3
    bare = speed_models([t4], [], roofline)["t4"]
    assert bare.beta == pytest.approx(roofline.beta(t4) / UNCALIBRATED_EFFICIENCY)
    assert bare.alpha == 0.0 and "uncalibrated" in bare.source
    # The memory roof binds when the bytes dominate.
    memory = Roofline(flops_per_sample=1.0, bytes_per_sample=1e6)
    assert memory.beta(t4) == pytest.approx(1e6 / t4.memory_bandwidth)


def test_a_device_with_neither_profile_nor_roofline_is_named():
    with pytest.raises(ValueError, match="device 't4' has no matching profile"):
        speed_models([BUILTIN_DEVICES["t4"]], [_profile("cuda", "NVIDIA H100", 1e-3, 1e-5)])


def _cli(capsys, *argv):
    code = main(["what-if", *argv], comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_prints_the_groups_and_totals(capsys):
    code, out, err = _cli(
        capsys, "--cluster", "4x h100, 2x t4, 64x cpu-core@16", "--profiles", FIXTURE,
        "--global-batch", "4096", "--gradient-bytes", "100e6", "--flops-per-sample", "1e7",
    )  # fmt: skip
    assert code == 0, err
    assert "70 devices on 6 nodes" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["h100"][1] == "4" and rows["t4"][1] == "2" and rows["cpu-core"][1] == "64"
    assert "median of 1 profile(s)" in " ".join(rows["h100"])
    assert "calibrated" in " ".join(rows["t4"])
    step = float(rows["step"][1])
    assert step == pytest.approx(float(rows["sync"][1]) + float(rows["step"][4]), abs=2e-3)
    assert math.isclose(float(rows["throughput"][1].replace(",", "")), 4096 / step * 1e3,
                        rel_tol=1e-3)  # fmt: skip


def test_the_cli_prints_a_scaling_table_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "scaling.png"
    code, out, err = _cli(
        capsys, "--cluster", "8x v100", "--flops-per-sample", "1e9", "--gradient-bytes",
        "1e6", "--scaling", "weak", "--batch-per-device", "32", "--max-devices", "12",
        "--plot", str(plot),
    )  # fmt: skip
    assert code == 0, err
    table = out.split("weak scaling of v100")[1].splitlines()[2:]
    assert [int(line.split()[0]) for line in table if line.strip()[:1].isdigit()] == [
        1, 2, 4, 8, 12,
    ]  # fmt: skip
    assert plot.stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cluster", "4x h1000"], "unknown device 'h1000'"),
        (["--cluster", "0x h100"], "has no devices"),
        (["--cluster", "4x h100", "--network", "inter=0GB/s,1us"], "must be > 0"),
        (["--cluster", "2x t4", "--profiles", FIXTURE], "device 't4' has no matching"),
        (["--cluster", "4x h100", "--profiles", FIXTURE, "--workload", "other"],
         "profiles of workload 'patch-cnn'"),
        (["--cluster", "4x h100", "--profiles", FIXTURE], "--gradient-bytes is required"),
        (["--cluster", "65x h100", "--policy", "equal"], "smaller than 65 devices"),
        (["--cluster", "4x h100", "--flops-per-sample", "1e9", "--gradient-bytes", "0",
          "--scaling", "weak"], "--scaling weak needs --batch-per-device"),
        (["--cluster", "4x h100", "--profiles", FIXTURE, "--profile-map", "x1=cuda"],
         "unknown device 'x1'"),
        (["--cluster", "4x a100", "--profiles", FIXTURE, "--profile-map", "h100=cpu",
          "--flops-per-sample", "1e8"], "--profile-map h100=cpu gives the gpu device 'h100'"),
        (["--cluster", "4x h100", "--profiles", "missing.json"],
         "or leave --profiles out to predict from --flops-per-sample or --count-flops"),
    ],
)  # fmt: skip
def test_each_bad_input_is_one_line(capsys, argv, message):
    if "--flops-per-sample" not in argv and "--profiles" not in argv:
        argv = [*argv, "--flops-per-sample", "1e9", "--gradient-bytes", "0"]
    code, out, err = _cli(capsys, *argv, "--global-batch", "64")
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_profiles_of_two_workloads_need_workload(capsys, tmp_path):
    import json

    data = json.loads(open(FIXTURE, encoding="utf-8").read())
    data["profiles"][0]["workload"] = "other"
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(data), encoding="utf-8")
    argv = ["--cluster", "4x h100", "--profiles", str(mixed), "--gradient-bytes", "1e6"]
    code, _, err = _cli(capsys, *argv, "--global-batch", "64")
    assert code == 2 and "mixes workloads other, patch-cnn" in err
    # Naming one keeps only its profiles: the H100 profile was the other workload's.
    code, out, err = _cli(capsys, *argv, "--global-batch", "64", "--workload", "other")
    assert code == 0, err
    assert "median of 1 profile(s)" in out
    code, _, err = _cli(capsys, *argv, "--global-batch", "64", "--workload", "patch-cnn")
    assert code == 2 and "device 'h100' has no matching profile" in err
