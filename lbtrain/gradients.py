"""Moved to `lbtrain.parallel.gradients` (the sync) and `lbtrain.parallel.buckets` (the
layout); kept because docs/library.md showed `from lbtrain.gradients import GradientSync`."""

from lbtrain.parallel.buckets import (
    DEFAULT_BUCKET_MB,
    OVERLAP_BUCKET_MB,
    gradient_buckets,
    sync_layout,
)
from lbtrain.parallel.gradients import GradientSync, sync_gradients

__all__ = [
    "DEFAULT_BUCKET_MB",
    "OVERLAP_BUCKET_MB",
    "GradientSync",
    "gradient_buckets",
    "sync_gradients",
    "sync_layout",
]
