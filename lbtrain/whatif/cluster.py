"""Cluster and network specs for what-if predictions, parsed from short strings.

Cluster grammar (case-insensitive, spaces free)::

    cluster := entry ("," entry)*
    entry   := COUNT "x" DEVICE ["@" PER_NODE]        e.g. "4x h100, 64x cpu-core@16"

DEVICE is a name of the device table (`lbtrain.whatif.devices`). Each entry fills its own
nodes of PER_NODE devices (the last node may hold fewer); entries never share a node.
Without ``@PER_NODE`` a GPU entry puts 8 devices per node (an HGX/DGX server) and a
CPU-core entry 64 cores per node (a two-socket server of 32-core CPUs).

Network grammar::

    network := link (";" link)*
    link    := ("intra" | "inter") "=" BANDWIDTH "," LATENCY   e.g. "intra=900GB/s,5us"

BANDWIDTH is a number with a unit: B/s, KB/s, MB/s, GB/s, TB/s (bytes) or Kb/s, Mb/s,
Gb/s, Tb/s (bits), decimal prefixes. LATENCY is a number with s, ms, us (or µs) or ns.
``intra`` links ranks of one node, ``inter`` the nodes; a spec naming only one of them
uses it for both (a flat network). The results are in SI units (bytes/s, seconds).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from lbtrain.whatif.devices import BUILTIN_DEVICES, DeviceSpec
from lbtrain.whatif.network import Link

__all__ = [
    "DEFAULT_PER_NODE",
    "Cluster",
    "DeviceGroup",
    "Link",
    "Network",
    "parse_bandwidth",
    "parse_cluster",
    "parse_network",
]

DEFAULT_PER_NODE = {"gpu": 8, "cpu": 64}

_BANDWIDTH_UNITS = {
    "B/s": 1.0, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
    "Kb/s": 1e3 / 8, "Mb/s": 1e6 / 8, "Gb/s": 1e9 / 8, "Tb/s": 1e12 / 8,
}  # fmt: skip
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_ENTRY = re.compile(
    r"^(?P<count>\S+?)\s*[x×]\s*(?P<device>[^@\s]+)\s*(?:@\s*(?P<per_node>\S+))?$", re.IGNORECASE
)
_QUANTITY = re.compile(r"^(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>\S+)$")


@dataclass(frozen=True)
class DeviceGroup:
    """`count` devices of one kind, `per_node` of them to a node."""

    count: int
    device: DeviceSpec
    per_node: int

    @property
    def nodes(self) -> int:
        """Nodes this group fills."""
        return math.ceil(self.count / self.per_node)


@dataclass(frozen=True)
class Cluster:
    """The device groups of a cluster, in spec order (groups of count 0 are dropped)."""

    groups: tuple[DeviceGroup, ...]

    @property
    def devices(self) -> int:
        """Devices in all groups: the ranks of a one-rank-per-device job."""
        return sum(group.count for group in self.groups)

    @property
    def nodes(self) -> int:
        """Nodes in all groups."""
        return sum(group.nodes for group in self.groups)

    def with_counts(self, counts: Sequence[int]) -> Cluster:
        """The same entries with `counts` devices each (an entry at 0 is left out)."""
        return Cluster(tuple(
            dataclasses.replace(g, count=c) for g, c in zip(self.groups, counts, strict=True) if c
        ))  # fmt: skip

    @property
    def max_per_node(self) -> int:
        """Devices on the fullest node, which sets the intra-node stage of an allreduce."""
        return max(min(group.per_node, group.count) for group in self.groups)


@dataclass(frozen=True)
class Network:
    """The two levels of a cluster's network."""

    intra: Link
    inter: Link


def parse_cluster(spec: str, devices: dict[str, DeviceSpec] | None = None) -> Cluster:
    """Parse ``"4x h100, 64x cpu-core@16"`` (grammar in the module docstring).

    `devices` defaults to `BUILTIN_DEVICES`; pass `load_device_table`'s result for more.
    Bad input raises a one-line ValueError naming the entry and the fix.
    """
    table = BUILTIN_DEVICES if devices is None else devices
    entries = [part.strip() for part in spec.split(",")]
    if not spec.strip():
        raise ValueError("cluster spec is empty: name devices, e.g. '4x h100, 64x cpu-core@16'")
    groups = [_group(entry, table) for entry in entries]
    kept = tuple(group for group in groups if group.count > 0)
    if not kept:
        raise ValueError(f"cluster spec {spec!r} has no devices: give at least one count >= 1")
    return Cluster(kept)


def _group(entry: str, table: dict[str, DeviceSpec]) -> DeviceGroup:
    match = _ENTRY.match(entry)
    if not entry or match is None:
        raise ValueError(
            f"cluster entry {entry!r} is malformed: write COUNTx DEVICE[@PER_NODE], "
            "e.g. '4x h100@8'"
        )
    count = _whole(match["count"], f"cluster entry {entry!r}: count", minimum=0)
    name = match["device"].lower()
    if name not in table:
        raise ValueError(
            f"cluster entry {entry!r}: unknown device {name!r}; known: {', '.join(sorted(table))}"
        )
    device = table[name]
    if match["per_node"] is None:
        per_node = DEFAULT_PER_NODE[device.kind]
    else:
        per_node = _whole(match["per_node"], f"cluster entry {entry!r}: @PER_NODE", minimum=1)
    return DeviceGroup(count, device, per_node)


def _whole(text: str, what: str, minimum: int) -> int:
    if not re.fullmatch(r"[-+]?\d+", text) or int(text) < minimum:
        raise ValueError(f"{what} {text!r} must be a whole number >= {minimum}")
    return int(text)


def parse_network(spec: str) -> Network:
    """Parse ``"intra=900GB/s,5us; inter=100Gb/s,2us"`` (grammar in the module docstring).

    Bad input raises a one-line ValueError naming the part and the fix.
    """
    links: dict[str, Link] = {}
    for part in (piece.strip() for piece in spec.split(";")):
        if not part:
            continue
        level, sep, values = part.partition("=")
        level = level.strip().lower()
        if not sep or level not in ("intra", "inter"):
            raise ValueError(
                f"network part {part!r} is malformed: write intra=BANDWIDTH,LATENCY or "
                "inter=BANDWIDTH,LATENCY, e.g. 'inter=100Gb/s,2us'"
            )
        if level in links:
            raise ValueError(f"network spec {spec!r} names {level!r} twice: keep one")
        links[level] = _link(part, values)
    if not links:
        raise ValueError("network spec is empty: e.g. 'intra=900GB/s,5us; inter=100Gb/s,2us'")
    # A spec naming one level describes a flat network: that link serves both.
    only = next(iter(links.values()))
    return Network(intra=links.get("intra", only), inter=links.get("inter", only))


def _link(part: str, values: str) -> Link:
    pieces = [piece.strip() for piece in values.split(",")]
    if len(pieces) != 2:
        raise ValueError(
            f"network part {part!r} needs a bandwidth and a latency, e.g. '100Gb/s,2us'"
        )
    beta = _quantity(part, pieces[0], _BANDWIDTH_UNITS, "bandwidth")
    alpha = _quantity(part, pieces[1], _LATENCY_UNITS, "latency")
    if beta <= 0:
        raise ValueError(f"network part {part!r}: bandwidth {pieces[0]!r} must be > 0")
    if alpha < 0:
        raise ValueError(f"network part {part!r}: latency {pieces[1]!r} must be >= 0")
    return Link(alpha=alpha, beta=beta)


def parse_bandwidth(text: str) -> float | None:
    """Bytes/s of a bandwidth such as ``"100Gb/s"`` (units in the module docstring), or None
    when the text is not a number and a bandwidth unit."""
    match = _QUANTITY.match(text.strip())
    if match is None or match["unit"] not in _BANDWIDTH_UNITS:
        return None
    return float(match["number"]) * _BANDWIDTH_UNITS[match["unit"]]


def _quantity(part: str, text: str, units: dict[str, float], what: str) -> float:
    match = _QUANTITY.match(text)
    if match is None or match["unit"] not in units:
        raise ValueError(
            f"network part {part!r}: {what} {text!r} is malformed: write a number and one of "
            f"{', '.join(units)}"
        )
    value = float(match["number"]) * units[match["unit"]]
    if not math.isfinite(value):
        raise ValueError(f"network part {part!r}: {what} {text!r} must be finite")
    return value
