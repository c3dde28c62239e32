"""Analytical what-if models of distributed training on clusters one does not have.

Pure numpy (no torch): allreduce cost models (`network`), a device table (`devices`) and
cluster/network specs (`cluster`). Units are SI: seconds, bytes, bytes/s, FLOP/s.
"""

from lbtrain.whatif.cluster import (
    Cluster,
    DeviceGroup,
    Network,
    parse_cluster,
    parse_network,
)
from lbtrain.whatif.devices import BUILTIN_DEVICES, DeviceSpec, load_device_table
from lbtrain.whatif.network import ALGORITHMS, Best, Link, best, hierarchical

__all__ = [
    "ALGORITHMS",
    "BUILTIN_DEVICES",
    "Best",
    "Cluster",
    "DeviceGroup",
    "DeviceSpec",
    "Link",
    "Network",
    "best",
    "hierarchical",
    "load_device_table",
    "parse_cluster",
    "parse_network",
]
