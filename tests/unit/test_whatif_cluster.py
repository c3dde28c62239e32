"""What-if cluster and network specs and the device table (issue 22), and their errors."""

from __future__ import annotations

import json

import pytest

from lbtrain.whatif.cluster import DEFAULT_PER_NODE, parse_cluster, parse_network
from lbtrain.whatif.devices import BUILTIN_DEVICES, DeviceSpec, load_device_table
from lbtrain.whatif.network import Link


def test_a_cluster_spec_gives_groups_nodes_and_defaults():
    cluster = parse_cluster("4x H100, 64x cpu-core@16, 20 x a100")
    counts = [(g.count, g.device.name, g.per_node) for g in cluster.groups]
    assert counts == [(4, "h100", 8), (64, "cpu-core", 16), (20, "a100", 8)]
    assert cluster.devices == 88
    assert cluster.nodes == 1 + 4 + 3
    assert cluster.max_per_node == 16
    assert parse_cluster("100x cpu-core").groups[0].per_node == DEFAULT_PER_NODE["cpu"] == 64
    assert parse_cluster("2x h100, 0x t4").devices == 2  # a zero count is dropped


def test_a_cluster_uses_a_given_device_table():
    extra = DeviceSpec("mi250x", "gpu", 47.9e12, 3.2e12)
    cluster = parse_cluster("2x mi250x", {**BUILTIN_DEVICES, "mi250x": extra})
    assert cluster.groups[0].device is extra


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "cluster spec is empty"),
        ("  ", "cluster spec is empty"),
        ("0x h100, 0x t4", "has no devices: give at least one count >= 1"),
        ("4x h100,", "cluster entry '' is malformed: write COUNTx DEVICE"),
        ("h100", "cluster entry 'h100' is malformed: write COUNTx DEVICE"),
        ("fourx h100", "count 'four' must be a whole number >= 0"),
        ("-2x h100", "count '-2' must be a whole number >= 0"),
        ("2.5x h100", r"count '2\.5' must be a whole number"),
        ("4x h1000", "unknown device 'h1000'; known: a100, cpu-core, h100"),
        ("4x h100@0", "@PER_NODE '0' must be a whole number >= 1"),
        ("4x h100@eight", "@PER_NODE 'eight' must be a whole number >= 1"),
    ],
)
def test_a_bad_cluster_spec_is_one_line_naming_the_part(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_cluster(spec)
    assert "\n" not in str(info.value)


def _si(link: Link) -> tuple[float, float]:
    return link.alpha, link.beta


def test_a_network_spec_converts_units_to_si():
    net = parse_network("intra=900GB/s,5us; inter=100Gb/s,2us")
    assert _si(net.intra) == pytest.approx((5e-6, 9e11))
    assert _si(net.inter) == pytest.approx((2e-6, 1.25e10))
    net = parse_network("inter = 400 MB/s , 1.5ms")
    assert net.intra == net.inter
    assert _si(net.intra) == pytest.approx((1.5e-3, 4e8))
    assert _si(parse_network("intra=1e3B/s,10ns").inter) == pytest.approx((1e-8, 1e3))
    assert _si(parse_network("intra=8Mb/s,0s").intra) == pytest.approx((0.0, 1e6))
    assert _si(parse_network("intra=1TB/s,1µs").intra) == pytest.approx((1e-6, 1e12))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "network spec is empty"),
        ("intra=0GB/s,1us", "bandwidth '0GB/s' must be > 0"),
        ("inter=-5Gb/s,1us", "bandwidth '-5Gb/s' must be > 0"),
        ("inter=5Gb/s,-1us", "latency '-1us' must be >= 0"),
        ("inter=5Gbps,1us", "bandwidth '5Gbps' is malformed: write a number and one of B/s"),
        ("inter=5Gb/s,1 sec", "latency '1 sec' is malformed: write a number and one of s, ms"),
        ("inter=fast,1us", "bandwidth 'fast' is malformed"),
        ("inter=5Gb/s", "needs a bandwidth and a latency"),
        ("wan=5Gb/s,1us", "network part 'wan=5Gb/s,1us' is malformed: write intra="),
        ("inter=1GB/s,1us; inter=2GB/s,1us", "names 'inter' twice"),
        ("inter=1e999GB/s,1us", "must be finite"),
    ],
)
def test_a_bad_network_spec_is_one_line_naming_the_part(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_network(spec)
    assert "\n" not in str(info.value)


def test_builtin_devices_are_sane():
    assert {"h100", "a100", "v100", "t4", "cpu-core"} <= set(BUILTIN_DEVICES)
    core = BUILTIN_DEVICES["cpu-core"]
    assert core.kind == "cpu" and core.flops == 2.5e9 * 32
    for spec in BUILTIN_DEVICES.values():
        assert spec.source, spec.name
        if spec.kind == "gpu":
            assert spec.flops > 10 * core.flops and spec.memory_bandwidth > core.memory_bandwidth


def test_a_device_table_file_extends_and_overrides_the_builtins(tmp_path):
    toml = tmp_path / "devices.toml"
    toml.write_text(
        '[MI250X]\nkind = "gpu"\nflops = 47.9e12\nmemory_bandwidth = 3.2e12\nmemory = 128e9\n'
        '[t4]\nkind = "gpu"\nflops = 1e12\nmemory_bandwidth = 1e11\n'
    )
    table = load_device_table(toml)
    assert table["mi250x"].flops == 47.9e12 and table["mi250x"].memory == 128e9
    assert table["t4"].flops == 1e12 and BUILTIN_DEVICES["t4"].flops == 8.1e12
    assert table["h100"] is BUILTIN_DEVICES["h100"]
    js = tmp_path / "more.json"
    core = {"kind": "cpu", "flops": 1e11, "memory_bandwidth": 5e9}
    js.write_text(json.dumps({"epyc-core": core}))
    merged = load_device_table(js, base=table)
    assert {"mi250x", "epyc-core", "h100"} <= set(merged)
    assert parse_cluster("3x epyc-core", merged).groups[0].per_node == 64


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[x]\nkind = "gpu"\nflops = 1.0\n', "device 'x': missing key 'memory_bandwidth'"),
        ('[x]\nkind = "tpu"\nflops = 1.0\nmemory_bandwidth = 1.0\n', "key 'kind'='tpu'"),
        ('[x]\nkind = "gpu"\nflops = 0\nmemory_bandwidth = 1.0\n', "key 'flops'=0 must be"),
        ('[x]\nkind = "gpu"\nflops = 1\nmemory_bandwidth = "fast"\n', "key 'memory_bandwidth'"),
        ('[x]\nkind = "gpu"\nflops = 1\nmemory_bandwidth = 1\nfp16 = 2\n', "unknown key 'fp16'"),
        ("x = 3\n", "device 'x' must be a table"),
        ("[x\n", "is not valid TOML"),
        ("", "must hold one table per device name"),
    ],
)
def test_a_bad_device_table_is_one_line_naming_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "devices.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        load_device_table(path)
    assert "\n" not in str(info.value) and "devices.toml" in str(info.value)


def test_a_missing_or_bad_json_device_table_is_named(tmp_path):
    with pytest.raises(ValueError, match="nope.toml' cannot be read"):
        load_device_table(tmp_path / "nope.toml")
    bad = tmp_path / "d.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="d.json' is not valid JSON"):
        load_device_table(bad)
