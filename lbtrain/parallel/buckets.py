"""Gradient buckets: which parameters share a flat buffer, and the views `.grad` become.

Gradients live in persistent flat buckets, one per group of parameters of one dtype and
device, and each parameter's `.grad` is a view into its bucket (as DDP's
`gradient_as_bucket_view`): backward accumulates straight into the bucket and the
allreduce sums it in place, with no concatenation and no copy back. Buckets hold the
parameters in reverse order, the order backward produces their gradients. When and how the
buckets are weighted and reduced is `lbtrain.parallel.gradients`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from lbtrain.comm import Request

__all__ = [
    "DEFAULT_BUCKET_MB",
    "OVERLAP_BUCKET_MB",
    "Bucket",
    "gradient_buckets",
    "layout_signature",
    "sync_layout",
]

# Large enough that a small model needs one call and a big one a handful; DDP uses 25 MB.
DEFAULT_BUCKET_MB = 25.0
# With overlap, smaller: a bucket starts only once all its gradients are in, and HybridSN's
# first dense layer alone is 18 of its 19.5 MiB. 4 MiB cut the wait after backward by 71%
# where 25 MiB cut it by 31% (benchmark 2 in BENCHMARKS.md).
OVERLAP_BUCKET_MB = 4.0


def gradient_buckets(
    params: Iterable[nn.Parameter], bucket_mb: float = DEFAULT_BUCKET_MB
) -> list[list[nn.Parameter]]:
    """Group trainable parameters, in the order given, into buckets of one dtype and device."""
    limit = bucket_mb * 1024 * 1024
    buckets: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    current_bytes = 0
    for param in params:
        if not param.requires_grad:
            continue
        nbytes = param.numel() * param.element_size()
        kind_changed = current and (
            current[0].dtype != param.dtype or current[0].device != param.device
        )
        if current and (kind_changed or current_bytes + nbytes > limit):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(param)
        current_bytes += nbytes
    if current:
        buckets.append(current)
    return buckets


def sync_layout(
    params: Iterable[nn.Parameter], bucket_mb: float = DEFAULT_BUCKET_MB
) -> list[list[nn.Parameter]]:
    """The buckets `GradientSync` reduces, in the order it reduces them (reverse parameters)."""
    return gradient_buckets(reversed(list(params)), bucket_mb)


class Bucket:
    """One flat gradient buffer and the parameters whose `.grad` are views into it."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        self.params = list(params)
        first = self.params[0]
        total = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(total, dtype=first.dtype, device=first.device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for param in self.params:
            self.views.append(self.flat[offset : offset + param.numel()].view_as(param))
            offset += param.numel()
        self.ready: set[int] = set()
        self.launched = False
        self.request: Request | None = None
        self.carry: torch.Tensor | None = None  # a synced sum kept out of the next sum

    def attach(self, index: int) -> None:
        """Point parameter `index`'s `.grad` at its view, keeping what it holds."""
        param, view = self.params[index], self.views[index]
        grad = param.grad
        if grad is None:
            view.zero_()
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)  # the user set it to None or replaced it: one copy this step
        if grad is not view:
            param.grad = view


def layout_signature(params: Iterable[nn.Parameter], bucket_mb: float) -> tuple:
    """What a GradientSync's buckets depend on: the trainable parameters, as placed now."""
    return bucket_mb, tuple(
        (id(p), tuple(p.shape), p.dtype, p.device) for p in params if p.requires_grad
    )
