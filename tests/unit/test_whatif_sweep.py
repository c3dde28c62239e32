"""lbtrain.whatif.sweep and `lbtrain what-if --sweep`: the five axes, their algebra, bad input."""

from __future__ import annotations

import pytest

from lbtrain.cli.entry import main
from lbtrain.comm import SingleProcessCommunicator
from lbtrain.whatif.cluster import parse_cluster, parse_network
from lbtrain.whatif.devices import BUILTIN_DEVICES
from lbtrain.whatif.predict import Roofline, SpeedModel, predict, speed_models
from lbtrain.whatif.sweep import AXES, parse_sweep, sweep

NETWORK = parse_network("intra=100GB/s,5us; inter=10Gb/s,2us")
CLUSTER = parse_cluster("32x v100@4")
GRADIENT = 50 * 10**6


def _roofline_speeds(roofline: Roofline):
    return lambda devices: speed_models(devices, (), roofline)


COMPUTE_BOUND = _roofline_speeds(Roofline(flops_per_sample=1e9))
MEMORY_BOUND = _roofline_speeds(Roofline(flops_per_sample=1e6, bytes_per_sample=1e8))


def _steps(text, speeds=COMPUTE_BOUND, cluster=CLUSTER, batch=4096):
    points = sweep(parse_sweep(text), cluster, NETWORK, speeds, batch, "cost", GRADIENT)
    return [p.prediction for p in points]


def test_parse_reads_every_axis_in_si_units():
    assert parse_sweep("link=1Gb/s, 10GB/s").values == (1e9 / 8, 10e9)
    assert parse_sweep("flops=0.5x,2").values == (0.5, 2.0)
    assert parse_sweep("Batch=64,128").axis == "batch"
    assert parse_sweep("devices=1,8").labels == ("1", "8")
    assert {parse_sweep(f"{axis}=1{'Gb/s' if axis == 'link' else ''}").axis for axis in AXES} == (
        set(AXES)
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("speed=1,2", "AXIS one of batch"),
        ("link", "AXIS one of"),
        ("link=", "no values: give at least one, e.g. link=10Gb/s"),
        ("link=10Gb", "'10Gb' is not a bandwidth"),
        ("link=0Gb/s", "must be a finite number > 0"),
        ("flops=0,1", "'0' must be a finite number > 0"),
        ("flops=fast", "'fast' is not a number"),
        ("batch=1.5", "must be a whole number"),
        ("devices=-2", "must be a finite number > 0"),
        ("batch=64,64", "given twice"),
    ],
)
def test_a_bad_sweep_is_one_line_naming_the_fix(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_sweep(text)
    assert "\n" not in str(info.value) and str(info.value).startswith("--sweep ")


def test_a_faster_link_shrinks_only_the_sync_and_never_slows_the_step():
    results = _steps("link=1Gb/s,10Gb/s,100Gb/s,1Tb/s")
    assert len({r.compute for r in results}) == 1
    syncs = [r.sync for r in results]
    assert syncs == sorted(syncs, reverse=True) and syncs[0] > 10 * syncs[-1]
    # The bandwidth term dominates on a slow link: 10x the bandwidth, nearly 10x less sync.
    assert syncs[0] / syncs[1] == pytest.approx(10, rel=0.05)


def test_doubling_the_peak_flops_halves_a_compute_bound_step_and_not_a_memory_bound_one():
    low, high = _steps("flops=1,2")
    assert high.compute == pytest.approx(low.compute / 2)
    assert high.sync == low.sync
    low, high = _steps("flops=1,2", MEMORY_BOUND)
    assert high.compute == pytest.approx(low.compute)
    low, high = _steps("memory-bandwidth=1,2", MEMORY_BOUND)
    assert high.compute == pytest.approx(low.compute / 2)


def test_a_batch_sweep_is_the_prediction_at_each_batch():
    results = _steps("batch=256,1024,4096")
    for batch, result in zip((256, 1024, 4096), results, strict=True):
        expected = predict(CLUSTER, NETWORK, COMPUTE_BOUND([BUILTIN_DEVICES["v100"]]), batch,
                           "cost", GRADIENT)  # fmt: skip
        assert result == expected


def test_a_value_the_memory_cannot_hold_names_itself():
    with pytest.raises(ValueError, match="--sweep batch=64: .*does not fit the devices' memory"):
        sweep(parse_sweep("batch=16,64"), CLUSTER, NETWORK, COMPUTE_BOUND, None, "cost",
              GRADIENT, caps={"v100": 1})  # fmt: skip


def test_a_devices_sweep_is_the_prediction_of_that_cluster():
    results = _steps("devices=4,8,32")
    for count, result in zip((4, 8, 32), results, strict=True):
        cluster = parse_cluster(f"{count}x v100@4")
        expected = predict(cluster, NETWORK, COMPUTE_BOUND([BUILTIN_DEVICES["v100"]]), 4096,
                           "cost", GRADIENT)  # fmt: skip
        assert result == expected
    assert results[0].sync < results[1].sync  # 4 fit one node: no inter-node stage


def test_sweeps_the_cluster_or_the_speeds_cannot_take_are_refused():
    with pytest.raises(ValueError, match="one-entry cluster.*2 entries"):
        _steps("devices=1,2", cluster=parse_cluster("4x v100, 2x t4"))
    with pytest.raises(ValueError, match="fits one node"):
        _steps("link=1Gb/s,2Gb/s", cluster=parse_cluster("4x v100@8"))
    with pytest.raises(ValueError, match="needs --global-batch"):
        _steps("link=1Gb/s", batch=None)
    profiled = {"v100": SpeedModel(1e-3, 1e-4, "median of 3 profile(s)")}
    with pytest.raises(ValueError, match="'v100' is timed by a profile"):
        _steps("flops=1,2", speeds=lambda devices: profiled)


def _cli(capsys, *argv):
    try:
        code = main(["what-if", *argv], comm=SingleProcessCommunicator())
    except SystemExit as exit_:  # argparse's own errors (a bad --sweep) exit from the parser
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


BASE = ["--cluster", "32x v100@4", "--flops-per-sample", "6e8", "--gradient-bytes", "3e6"]


def test_the_cli_prints_one_row_per_value_and_draws_them(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sweep.png"
    code, out, err = _cli(capsys, *BASE, "--global-batch", "4096", "--sweep",
                          "link=1Gb/s,10Gb/s,100Gb/s", "--plot", str(plot))  # fmt: skip
    assert code == 0, err
    table = out.split("sweep of the link between nodes")[1].splitlines()[2:5]
    assert [row.split()[0] for row in table] == ["1Gb/s", "10Gb/s", "100Gb/s"]
    syncs = [float(row.split()[4]) for row in table]
    assert syncs == sorted(syncs, reverse=True)
    assert plot.stat().st_size > 0


def test_the_cli_sweeps_the_batch_without_a_global_batch(capsys):
    code, out, err = _cli(capsys, *BASE, "--sweep", "batch=128,256")
    assert code == 0, err
    assert "what-if:" not in out  # no base prediction without --global-batch
    assert "sweep of the global batch" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--global-batch", "64", "--sweep", "speed=1"], "AXIS one of"),
        (["--sweep", "link=1Gb/s"], "--global-batch is required"),
        (["--sweep", "batch=64", "--scaling", "strong"], "--scaling strong needs --global-batch"),
        (["--global-batch", "64", "--sweep", "link=1Gb/s", "--cluster", "4x v100@8"],
         "fits one node"),
        (["--sweep", "link=1Gb/s", "--scaling", "weak", "--batch-per-device", "8"],
         "--sweep needs --global-batch"),
        (["--global-batch", "64", "--plot", "x.png"], "add --scaling strong or weak, or --sweep"),
        (["--global-batch", "64", "--sweep", "flops=1", "--scaling", "weak",
          "--batch-per-device", "8", "--plot", "x.png"], "not both"),
    ],
)  # fmt: skip
def test_each_bad_sweep_flag_is_one_line(capsys, argv, message):
    code, out, err = _cli(capsys, *BASE, *argv)
    assert code == 2 and out == ""
    assert message in err.splitlines()[0], err


def test_a_network_naming_one_level_keeps_the_others_default(capsys):
    code, out, err = _cli(capsys, *BASE, "--global-batch", "4096", "--network",
                          "inter=10Gb/s,2us")  # fmt: skip
    assert code == 0, err
    assert "network: intra 900 GB/s, 5 us; inter 1.25 GB/s, 2 us" in out
    assert "roofline at 50% of peak (FLOP-bound)" in out
    code, out, err = _cli(capsys, "--cluster", "4x h100", "--flops-per-sample", "1e9",
                          "--gradient-bytes", "0", "--global-batch", "64")  # fmt: skip
    assert "4 devices on 1 node," in out
