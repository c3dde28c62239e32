"""Analytical what-if models of distributed training on clusters one does not have.

Pure numpy (no torch): allreduce cost models (`network`), a device table (`devices`),
cluster/network specs (`cluster`) and the predicted step of a cluster (`predict`).
Units are SI: seconds, bytes, bytes/s, FLOP/s.
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
from lbtrain.whatif.predict import (
    GroupPrediction,
    Prediction,
    Roofline,
    ScalingRow,
    SpeedModel,
    predict,
    scaling,
    speed_models,
)

__all__ = [
    "ALGORITHMS",
    "BUILTIN_DEVICES",
    "Best",
    "Cluster",
    "DeviceGroup",
    "DeviceSpec",
    "GroupPrediction",
    "Link",
    "Network",
    "Prediction",
    "Roofline",
    "ScalingRow",
    "SpeedModel",
    "best",
    "hierarchical",
    "load_device_table",
    "parse_cluster",
    "parse_network",
    "predict",
    "scaling",
    "speed_models",
]
