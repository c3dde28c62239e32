"""A user's own training loop, balanced and exact: the DDP-shaped wrapper and its planning.

plan = plan_for(model, loss_fn, sample, comm, global_batch=256)
loader = balanced_loader(plan, dataset, rank=comm.rank)
model = BalancedDataParallel(model, comm, loader)

The gradient sync beside the wrapper: `buckets` (the flat buffers `.grad` views into),
`gradients` (`GradientSync`, `sync_gradients`: weight and sum them), `staging` (a CUDA
bucket through host memory) and `ddp_hook` (the same weighting for stock DDP).

Exports load lazily: profiling imports the bucket layout from here, and the wrapper's
planning imports profiling, so an eager import of the wrapper would be a circle.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BalancedDataParallel": "lbtrain.parallel.wrapper",
    "BatchNormMismatch": "lbtrain.parallel.batchnorm",
    "GradientSync": "lbtrain.parallel.gradients",
    "ModelMismatch": "lbtrain.parallel.layout",
    "SyncBatchNorm": "lbtrain.parallel.batchnorm",
    "TrainState": "lbtrain.parallel.train_state",
    "WeightedHookState": "lbtrain.parallel.ddp_hook",
    "check_same_model": "lbtrain.parallel.layout",
    "convert_sync_batchnorm": "lbtrain.parallel.batchnorm",
    "plan_for": "lbtrain.parallel.planning",
    "sync_gradients": "lbtrain.parallel.gradients",
    "weighted_allreduce_hook": "lbtrain.parallel.ddp_hook",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lbtrain.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
