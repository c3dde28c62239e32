"""Analytical what-if models of distributed training on clusters one does not have.

Pure numpy (no torch): allreduce cost models (`network`), a device table (`devices`),
cluster/network specs (`cluster`), the predicted step of a cluster (`predict`) and sweeps
along one axis (`sweep`), and data against spatial and pipeline parallelism (`parallel`;
the per-layer counts it takes come from `layers`, which imports torch).
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
from lbtrain.whatif.memory import memory_caps
from lbtrain.whatif.mix import mix_scaling
from lbtrain.whatif.network import ALGORITHMS, Best, Link, best, hierarchical
from lbtrain.whatif.parallel import SCHEMES, Option, compare_parallelism, pipeline_stages
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
from lbtrain.whatif.subset import Subset, best_subset
from lbtrain.whatif.sweep import AXES, Sweep, SweepPoint, parse_sweep, sweep

__all__ = [
    "ALGORITHMS",
    "AXES",
    "SCHEMES",
    "BUILTIN_DEVICES",
    "Best",
    "Cluster",
    "DeviceGroup",
    "DeviceSpec",
    "GroupPrediction",
    "Link",
    "Network",
    "Option",
    "Prediction",
    "Roofline",
    "ScalingRow",
    "SpeedModel",
    "Subset",
    "Sweep",
    "SweepPoint",
    "best",
    "best_subset",
    "compare_parallelism",
    "hierarchical",
    "load_device_table",
    "memory_caps",
    "mix_scaling",
    "parse_cluster",
    "parse_network",
    "parse_sweep",
    "pipeline_stages",
    "predict",
    "scaling",
    "speed_models",
    "sweep",
]
