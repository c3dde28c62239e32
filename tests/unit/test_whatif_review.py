"""What a review of the first what-if slice found, kept fixed: the best subset's tie-break,
the nodes of a cluster whose entries fill their own, spec case, CPU thread scaling under
--profile-map, a roofline too fast to be a speed, and a --plot with nothing to draw."""

from __future__ import annotations

import os

import pytest

from lbtrain import SingleProcessCommunicator
from lbtrain.balancer import CommCost, ReplicaSpeed
from lbtrain.balancer.subsets import best_subset
from lbtrain.cli.entry import main
from lbtrain.profiling import load_profiles
from lbtrain.whatif.cluster import parse_cluster, parse_network
from lbtrain.whatif.devices import BUILTIN_DEVICES
from lbtrain.whatif.network import hierarchical
from lbtrain.whatif.predict import Roofline, SpeedModel, predict, speed_models

FIXTURE = "tests/fixtures/profiles_gpu_cpu.json"


def test_a_tie_keeps_the_larger_subset_as_the_old_advice_did():
    # Both subsets step 2.0 s: one rank alone (no sync), or both (1 s each plus 1 s sync).
    chosen = best_subset([ReplicaSpeed(1.0, 0.0, 1.0)] * 2, 2, CommCost(1.0, 1))
    assert chosen is not None and tuple(chosen.ranks) == (0, 1) and chosen.step == 2.0


def test_entries_that_fill_nodes_of_their_own_count_every_node_in_the_sync():
    cluster = parse_cluster("9x h100, 9x a100")
    assert cluster.nodes == 4 and cluster.max_per_node == 8
    network = parse_network("intra=900GB/s,5us; inter=1Gb/s,2us")
    speeds = {name: SpeedModel(0.0, 1e-3, "test") for name in ("h100", "a100")}
    found = predict(cluster, network, speeds, 180, "cost", 1e8)
    four = hierarchical(1e8, 18, 8, network.intra, network.inter, nodes=4).seconds
    three = hierarchical(1e8, 18, 8, network.intra, network.inter).seconds
    assert found.sync == pytest.approx(four) and four > three


def test_a_cluster_spec_is_case_insensitive():
    assert parse_cluster("4X H100").devices == parse_cluster("4x h100").devices == 4


def test_cpu_profiles_give_the_same_core_whether_matched_by_default_or_by_map():
    profiles = load_profiles(FIXTURE)
    core = [BUILTIN_DEVICES["cpu-core"]]
    default = speed_models(core, profiles)["cpu-core"]
    mapped = speed_models(core, profiles, profile_map={"cpu-core": "cpu"})["cpu-core"]
    assert mapped.beta == pytest.approx(default.beta)


def test_a_speed_too_fast_to_be_one_is_refused_in_one_line(capsys):
    with pytest.raises(ValueError, match="no speed"):
        SpeedModel(0.0, 1e-320, "roofline")
    argv = ["what-if", "--cluster", "4x h100", "--global-batch", "64", "--gradient-bytes",
            "1e6", "--flops-per-sample", "1e-300"]  # fmt: skip
    assert main(argv, comm=SingleProcessCommunicator()) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "no speed" in err and "Traceback" not in err, err


def test_a_plot_without_a_scaling_table_is_refused(capsys, tmp_path):
    argv = ["what-if", "--cluster", "4x h100", "--global-batch", "64", "--gradient-bytes",
            "1e6", "--flops-per-sample", "1e9", "--plot", str(tmp_path / "s.png")]  # fmt: skip
    assert main(argv, comm=SingleProcessCommunicator()) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--scaling" in err, err
    assert not (tmp_path / "s.png").exists()


def test_a_profile_taken_under_an_emulated_slowdown_stands_for_the_device_itself():
    """A rank emulating a 3x slower device measured 3x its own times; the device is asked."""
    import dataclasses

    real = [p for p in load_profiles(FIXTURE) if p.device_kind == "cpu"][:1]
    slowed = [dataclasses.replace(p, alpha=3 * p.alpha, beta=3 * p.beta, slowdown=3.0)
              for p in real]  # fmt: skip
    core = [BUILTIN_DEVICES["cpu-core"]]
    alone = speed_models(core, real)["cpu-core"]
    both = speed_models(core, [*real, *slowed])["cpu-core"]
    assert (both.alpha, both.beta) == pytest.approx((alone.alpha, alone.beta))
    assert "emulated slowdowns divided out" in both.source


def test_a_profile_map_to_another_kind_of_device_is_refused():
    """Mapping the table's h100 to CPU profiles would calibrate the cluster's a100 on them."""
    profiles = load_profiles(FIXTURE)
    table = list(BUILTIN_DEVICES.values())
    with pytest.raises(ValueError, match=r"--profile-map h100=cpu gives the gpu device 'h100' "
                       r"profiles of cpu ranks"):  # fmt: skip
        speed_models([BUILTIN_DEVICES["a100"]], profiles, profile_map={"h100": "cpu"},
                     table=table)  # fmt: skip
    # A table device mapped to GPU profiles still calibrates the cluster's GPUs, as documented.
    a100 = speed_models([BUILTIN_DEVICES["a100"]], profiles, Roofline(1e9),
                        profile_map={"t4": "cuda"}, table=table)["a100"]  # fmt: skip
    assert "calibrated on gpu profiles" in a100.source, a100.source


def test_a_sweep_given_out_of_order_is_drawn_in_the_axis_order(monkeypatch, tmp_path):
    """10, 100, 1, 25 Gb/s drawn as given would double back on the log axis."""
    from types import SimpleNamespace

    from lbtrain.cli import whatif_sweep
    from lbtrain.whatif.sweep import SweepPoint

    drawn = {}

    def keep(figure, plt, path):
        drawn["x"] = list(figure.axes[1].lines[0].get_xdata())
        plt.close(figure)
        return tmp_path / "s.png"

    monkeypatch.setattr(whatif_sweep, "save_figure", keep)
    points = [
        SweepPoint(f"{v:g}Gb/s", v, SimpleNamespace(compute=1e-3, sync=1e-3 / v, throughput=v))
        for v in (10.0, 100.0, 1.0, 25.0)
    ]
    whatif_sweep.plot_sweep("link", points, str(tmp_path / "s.png"))
    assert drawn["x"] == [1.0, 10.0, 25.0, 100.0]


def test_a_mix_scales_against_one_copy(capsys):
    argv = ["what-if", "--cluster", "1x h100, 2x cpu-core", "--scaling", "strong",
            "--flops-per-sample", "1e9", "--gradient-bytes", "0",
            "--global-batch", "64"]  # fmt: skip
    assert main(argv, comm=SingleProcessCommunicator()) == 0
    assert "speedup against 1 copy):" in capsys.readouterr().out


def test_a_strong_scaling_table_says_where_more_devices_lose(capsys):
    argv = ["what-if", "--cluster", "16x h100", "--scaling", "strong", "--flops-per-sample",
            "1e9", "--global-batch", "1024", "--gradient-bytes"]  # fmt: skip
    assert main([*argv, "1e8"], comm=SingleProcessCommunicator()) == 0
    out = capsys.readouterr().out
    assert "note: past 8 devices the throughput falls" in out, out
    assert main([*argv, "0"], comm=SingleProcessCommunicator()) == 0  # no sync: no loss
    assert "throughput falls" not in capsys.readouterr().out


_BASE = ["what-if", "--cluster", "8x v100", "--global-batch", "64", "--gradient-bytes", "1e6",
         "--flops-per-sample", "1e9"]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--batch-per-device", "16"], ["--batch-per-device 16", "add --scaling weak"]),
        (["--max-devices", "4"], ["--max-devices 4", "add --scaling"]),
        (["--profile-map", "v100=cuda"], ["--profile-map", "add --profiles FILE"]),
        (["--profiles", FIXTURE, "--profile-map", "v100=nothing"], ["v100=nothing", "cpu, cuda"]),
    ],
    ids=["batch-per-device", "max-devices", "map-without-profiles", "map-no-match"],
)
def test_a_flag_that_would_be_ignored_is_one_line(capsys, extra, needles):
    # Each once printed a prediction, exit 0, without the flag's effect.
    assert main([*_BASE, *extra], comm=SingleProcessCommunicator()) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and not out, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.skipif(not os.access("/sys", os.F_OK), reason="needs Linux's /sys")
def test_a_plot_that_cannot_be_written_is_refused_before_the_prediction(capsys):
    # /sys refuses new files even where access() says yes (root): the write is tried first.
    argv = [*_BASE, "--sweep", "batch=8,16", "--plot", "/sys/lbtrain-test.png"]
    assert main(argv, comm=SingleProcessCommunicator()) == 2
    out, err = capsys.readouterr()
    assert not out and len(err.splitlines()) == 1 and "--plot '/sys/lbtrain-test.png'" in err, err


def test_a_profile_file_that_is_a_folder_and_a_nan_byte_count_name_the_fix(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"is a folder; name the JSON file"):
        load_profiles(tmp_path)
    with pytest.raises(SystemExit):
        main([*_BASE[:5], "--gradient-bytes", "nan"], comm=SingleProcessCommunicator())
    assert "must be a finite number >= 0" in capsys.readouterr().err


def test_the_write_probe_names_the_folder_and_lets_a_dangling_link_through(tmp_path, monkeypatch):
    import tempfile

    from lbtrain.cli.common import check_writable

    link = tmp_path / "plot.png"
    link.symlink_to(tmp_path / "missing.png")  # the write replaces it: not a refusal
    check_writable(str(link), "--plot")
    assert list(tmp_path.iterdir()) == [link]  # the probe left nothing behind

    def read_only(*args, **kwargs):  # a read-only mount, where access() still says yes
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", read_only)
    with pytest.raises(ValueError, match=rf"cannot be written \({tmp_path}: Read-only file"):
        check_writable(str(tmp_path / "x.png"), "--plot")
