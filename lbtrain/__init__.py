"""lbtrain: exact, load-balanced synchronous data-parallel training on heterogeneous replicas.

Exports load lazily, so `import lbtrain.balancer` (pure Python) does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "BalancePlan": "lbtrain.balancer",
    "ReplicaSpeed": "lbtrain.balancer",
    "plan_batches": "lbtrain.balancer",
    "Communicator": "lbtrain.comm",
    "MPICommunicator": "lbtrain.comm",
    "SingleProcessCommunicator": "lbtrain.comm",
    "TorchDistCommunicator": "lbtrain.comm",
    "RankLost": "lbtrain.comm",
    "LauncherError": "lbtrain.comm",
    "world_communicator": "lbtrain.comm",
    "BalancedDataParallel": "lbtrain.parallel",
    "ModelMismatch": "lbtrain.parallel",
    "SyncBatchNorm": "lbtrain.parallel",
    "BatchNormMismatch": "lbtrain.parallel",
    "convert_sync_batchnorm": "lbtrain.parallel",
    "flush_denormals": "lbtrain.denormals",
    "assign_devices": "lbtrain.devices",
    "plan_for": "lbtrain.parallel",
    "TrainState": "lbtrain.parallel",
    "BalancedLoader": "lbtrain.data",
    "balanced_loader": "lbtrain.data",
    "GradientSync": "lbtrain.parallel.gradients",
    "sync_gradients": "lbtrain.parallel.gradients",
    "WeightedHookState": "lbtrain.parallel.ddp_hook",
    "weighted_allreduce_hook": "lbtrain.parallel.ddp_hook",
    "ReplicaProfile": "lbtrain.profiling",
    "profile_all": "lbtrain.profiling",
    "profile_replica": "lbtrain.profiling",
    "load_profiles": "lbtrain.profiling",
    "save_profiles": "lbtrain.profiling",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lbtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
