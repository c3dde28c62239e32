"""Weighted gradient synchronisation: the step that makes unequal batches exact."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from lbtrain.comm import Communicator

__all__ = ["DEFAULT_BUCKET_MB", "gradient_buckets", "sync_gradients"]

# Large enough that a small model needs one call and a big one a handful; DDP uses 25 MB.
DEFAULT_BUCKET_MB = 25.0


def gradient_buckets(
    params: Iterable[nn.Parameter], bucket_mb: float = DEFAULT_BUCKET_MB
) -> list[list[nn.Parameter]]:
    """Group trainable parameters, in order, into buckets of one dtype and device."""
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


def sync_gradients(
    model: nn.Module | Iterable[nn.Parameter],
    weight: float,
    comm: Communicator,
    *,
    bucket_mb: float = DEFAULT_BUCKET_MB,
) -> None:
    """Turn each rank's mean-loss gradient into the mean gradient over the global batch.

    Call after `loss.backward()` on this rank's mean loss and before `optimizer.step()`.
    Gradients are scaled by `weight` = b_i / B and sum-allreduced in a few flat buckets,
    so sum_i (b_i / B) * mean_i = the mean over all B samples: the update one process would
    make on the whole global batch. Dividing by the world size instead (DDP, Horovod, the
    static-balancing paper) over-weights the replicas with small batches.

    A parameter with no gradient on this rank contributes zeros, so every rank reduces the
    same buffers in the same order and nothing hangs. A rank with a zero share (weight 0)
    skips forward and backward and still calls this: it adds zeros and receives the sum.

    Args:
        model: a module, or its parameters, with the same structure on every rank.
        weight: this rank's b_i / B for the current step (BalancedLoader.weight).
        comm: the job's communicator.
        bucket_mb: flat-buffer size per allreduce call, in MiB.

    Note:
        Exact for models whose forward treats samples independently. BatchNorm in training
        mode normalises with per-rank batch statistics, so its gradients differ from a single
        process on the whole batch.
    """
    if not (isinstance(weight, int | float) and math.isfinite(weight) and 0 <= weight <= 1):
        raise ValueError(
            f"weight={weight!r} is invalid: pass this rank's b_i / B, a number in [0, 1] "
            "(BalancedLoader.weight)"
        )
    params = model.parameters() if isinstance(model, nn.Module) else model
    for bucket in gradient_buckets(params, bucket_mb):
        grads = []
        for param in bucket:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(param.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        if weight == 0:
            # A rank with no samples adds exact zeros, whatever stale values (even NaN) its
            # gradients hold: 0 * NaN would poison every rank's sum.
            flat.zero_()
        else:
            flat.mul_(weight)
        comm.allreduce_sum_(flat)
        offset = 0
        for grad in grads:
            count = grad.numel()
            grad.copy_(flat[offset : offset + count].view_as(grad))
            offset += count
