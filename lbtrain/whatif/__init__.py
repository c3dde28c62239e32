"""Analytical what-if models of distributed training on clusters one does not have.

Pure numpy (no torch): allreduce cost models (`network`), a device table (`devices`),
cluster/network specs (`cluster`), the predicted step of a cluster (`predict`) and sweeps
along one axis (`sweep`).
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
from lbtrain.whatif.sweep import AXES, Sweep, SweepPoint, parse_sweep, sweep

__all__ = [
    "ALGORITHMS",
    "AXES",
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
    "Sweep",
    "SweepPoint",
    "best",
    "hierarchical",
    "load_device_table",
    "parse_cluster",
    "parse_network",
    "parse_sweep",
    "predict",
    "scaling",
    "speed_models",
    "sweep",
]
