"""A user's own training loop, balanced and exact: the DDP-shaped wrapper and its planning.

plan = plan_for(model, loss_fn, sample, comm, global_batch=256)
loader = balanced_loader(plan, dataset, rank=comm.rank)
model = BalancedDataParallel(model, comm, loader)
"""

from lbtrain.parallel.batchnorm import BatchNormMismatch, SyncBatchNorm, convert_sync_batchnorm
from lbtrain.parallel.layout import ModelMismatch, check_same_model
from lbtrain.parallel.planning import plan_for
from lbtrain.parallel.wrapper import BalancedDataParallel

__all__ = [
    "BalancedDataParallel",
    "BatchNormMismatch",
    "ModelMismatch",
    "SyncBatchNorm",
    "check_same_model",
    "convert_sync_batchnorm",
    "plan_for",
]
