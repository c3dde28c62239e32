"""Balanced data loading: each rank's share of every global batch."""

from lbtrain.data.loader import BalancedLoader, balanced_loader
from lbtrain.data.sampler import BalancedBatchSampler, epoch_schedule

__all__ = ["BalancedBatchSampler", "BalancedLoader", "balanced_loader", "epoch_schedule"]
