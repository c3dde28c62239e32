"""Spatial and pipeline parallelism on a cluster of several kinds of device: one kind
reduces to the single-kind model, the batch is the integer min-max over the groups, and
the CLI shows a mixed cluster's verdict."""

from __future__ import annotations

import itertools

import pytest

from examples.scene_fcn import workload as scene_fcn
from lbtrain.cli.entry import main
from lbtrain.comm import SingleProcessCommunicator
from lbtrain.whatif.cluster import Cluster, DeviceGroup, parse_network
from lbtrain.whatif.devices import DeviceSpec
from lbtrain.whatif.layers import Layer, count_layers
from lbtrain.whatif.parallel import compare_parallelism, group_link, spatial_group
from lbtrain.whatif.parallel_mixed import compare_mixed
from lbtrain.whatif.predict import SpeedModel

NETWORK = parse_network("intra=150GB/s,5us; inter=100Gb/s,2us")
LAYERS = [
    Layer("conv1", 600.0, 1000.0, 10.0, True, 8, 40),
    Layer("conv2", 300.0, 500.0, 20.0, True, 8, 40),
    Layer("fc", 100.0, 4.0, 0.0, False, 0, 20),
]


def _device(name: str) -> DeviceSpec:
    return DeviceSpec(name, "gpu", 1e12, 1e11)


def _cluster(*entries: tuple[int, str, int]) -> Cluster:
    return Cluster(tuple(DeviceGroup(count, _device(name), per) for count, name, per in entries))


@pytest.mark.parametrize(("devices", "per_node", "batch"), [(8, 4, 2), (8, 4, 64), (12, 6, 30)])
def test_one_kind_gives_what_the_single_kind_model_gives(devices, per_node, batch):
    layers = count_layers(scene_fcn(size=64))
    speed = SpeedModel(1e-3, 0.02, "test")
    single = {o.scheme: o for o in compare_parallelism(layers, speed, devices, per_node,
                                                        NETWORK, batch)}  # fmt: skip
    mixed = {o.scheme: o for o in compare_mixed(layers, _cluster((devices, "a", per_node)),
                                                NETWORK, {"a": speed}, batch)}  # fmt: skip
    assert single.keys() == mixed.keys() == {"data", "spatial", "pipeline"}
    for scheme, option in single.items():
        other = mixed[scheme]
        assert (other.ways, other.microbatches, other.samples) == (
            option.ways, option.microbatches, option.samples), scheme  # fmt: skip
        for figure in ("compute", "communication", "sync"):
            assert getattr(other, figure) == pytest.approx(getattr(option, figure), rel=1e-6)


def test_spatial_groups_share_the_batch_by_speed_as_the_best_integer_split():
    fast, slow = SpeedModel(0.0, 1.0, "fast"), SpeedModel(0.0, 3.0, "slow")
    cluster = _cluster((2, "fast", 2), (2, "slow", 2))
    batch = 8
    options = {o.scheme: o for o in compare_mixed(LAYERS, cluster, NETWORK,
                                                  {"fast": fast, "slow": slow}, batch)}  # fmt: skip
    spatial = options["spatial"]
    assert spatial.ways == 2  # one group of each kind
    # Every split of 8 images between the fast group and the slow one, by brute force.
    groups = [spatial_group(LAYERS, s, 2, group_link(2, 2, NETWORK)) for s in (fast, slow)]
    best = min(
        max(sum(groups[0].times(a)), sum(groups[1].times(batch - a))) for a in range(batch + 1)
    )
    assert spatial.compute + spatial.communication == pytest.approx(best)
    assert spatial.samples == 6  # 6 images on the fast group, 2 on the slow: 6 x 1 = 2 x 3
    assert spatial.shares == (6, 2)
    # Equal speeds would split 4 / 4: the mix moved work to the fast kind.
    even = compare_mixed(LAYERS, cluster, NETWORK, {"fast": fast, "slow": fast}, batch)
    assert next(o for o in even if o.scheme == "spatial").samples == 4


def test_pipelines_of_each_kind_share_the_batch_and_the_slowest_sets_the_step():
    fast, slow = SpeedModel(1e-3, 0.01, "fast"), SpeedModel(1e-3, 0.04, "slow")
    cluster = _cluster((4, "fast", 4), (4, "slow", 4))
    options = compare_mixed(LAYERS, cluster, NETWORK, {"fast": fast, "slow": slow}, 64)
    pipeline = next(o for o in options if o.scheme == "pipeline")
    mixed_step = pipeline.compute + pipeline.communication
    # The same cluster of the fast kind only is faster; of the slow kind only, slower.
    for speeds, faster in (
        ({"fast": fast, "slow": fast}, True),
        ({"fast": slow, "slow": slow}, False),
    ):
        same = next(o for o in compare_mixed(LAYERS, cluster, NETWORK, speeds, 64)
                    if o.scheme == "pipeline" and o.ways == pipeline.ways)  # fmt: skip
        assert (same.compute + same.communication < mixed_step) == faster


def test_k_must_divide_every_entry():
    speeds = {"a": SpeedModel(0.0, 1.0, "a"), "b": SpeedModel(0.0, 2.0, "b")}
    options = compare_mixed(LAYERS, _cluster((2, "a", 2), (3, "b", 3)), NETWORK, speeds, 8)
    assert [o.scheme for o in options] == ["data"]  # no k >= 2 divides both 2 and 3
    options = compare_mixed(LAYERS, _cluster((4, "a", 4), (2, "b", 2)), NETWORK, speeds, 8)
    assert {o.ways for o in options if o.scheme != "data"} <= {2}


@pytest.mark.parametrize("batch", [1, 3, 7, 20])
def test_the_min_max_holds_the_batch_and_no_split_does_better(batch):
    speeds = {"a": SpeedModel(0.5, 1.0, "a"), "b": SpeedModel(0.1, 2.5, "b")}
    cluster = _cluster((4, "a", 2), (2, "b", 2))
    spatial = next(o for o in compare_mixed(LAYERS, cluster, NETWORK, speeds, batch)
                   if o.scheme == "spatial" and o.ways == 2)  # fmt: skip
    link = group_link(2, 2, NETWORK)
    groups = [spatial_group(LAYERS, speeds[n], 2, link) for n in ("a", "a", "b")]
    best = min(
        max(sum(g.times(b)) for g, b in zip(groups, split, strict=True))
        for split in itertools.product(range(batch + 1), repeat=3)
        if sum(split) == batch
    )
    assert spatial.compute + spatial.communication == pytest.approx(best)


def test_the_cli_compares_schemes_on_a_mixed_cluster(capsys):
    argv = ["what-if", "--workload", "examples.scene_fcn:workload", "--count-flops", "--cluster",
            "4x h100@4, 4x v100@4", "--global-batch", "2", "--parallelism"]  # fmt: skip
    try:
        code = main(argv, comm=SingleProcessCommunicator())
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 0, err
    table = out.split("parallelism on 4x h100 (4 a node), 4x v100 (4 a node), global batch 2")[1]
    assert {"data", "spatial", "pipeline"} <= {line.split()[0] for line in table.splitlines()[2:5]}
    # Two groups of two H100s take a scene each; the V100s, slower, are better left idle.
    assert "verdict: spatial over 2" in table
    assert "  spatial over 2: h100 1, v100 0" in table


@pytest.mark.parametrize(("devices", "per_node"), [(16, 4), (12, 6), (8, 8), (24, 4)])
def test_one_kind_syncs_as_the_single_kind_model_at_every_k(devices, per_node):
    from lbtrain.whatif import parallel, parallel_mixed

    speed = SpeedModel(1e-3, 0.02, "test")
    layers = count_layers(scene_fcn(size=64))
    cluster = _cluster((devices, "a", per_node))
    for k in (k for k in range(2, devices + 1) if devices % k == 0):
        for single, mixed in (
            (parallel._spatial(layers, speed, devices, k, per_node, NETWORK, 64),
             parallel_mixed._spatial(layers, cluster, NETWORK, {"a": speed}, k, 64)),
            (parallel._pipeline(layers, speed, devices, k, per_node, NETWORK, 64),
             parallel_mixed._pipeline(layers, cluster, NETWORK, {"a": speed}, k, 64)),
        ):  # fmt: skip
            if single is None:
                assert mixed is None
                continue
            assert mixed.sync == pytest.approx(single.sync, rel=1e-9), (k, single.scheme)
            assert mixed.step == pytest.approx(single.step, rel=1e-9), (k, single.scheme)


@pytest.mark.parametrize("batch", [4096, 4097, 300_000])
def test_the_shares_hold_the_batch_and_less_than_a_sample_a_unit_more(batch):
    layers = count_layers(scene_fcn(size=64))
    speeds = {"h100": SpeedModel(1e-4, 1e-4, "h"), "v100": SpeedModel(1e-4, 3.7e-4, "v")}
    cluster = _cluster((8, "h100", 8), (16, "v100", 8))
    for option in compare_mixed(layers, cluster, NETWORK, speeds, batch):
        units = [g.count // option.ways for g in cluster.groups]
        held = sum(u * share for u, share in zip(units, option.shares, strict=True))
        assert batch <= held < batch + sum(units), option.scheme
        assert option.samples == max(option.shares)  # the busiest unit's, in every row
