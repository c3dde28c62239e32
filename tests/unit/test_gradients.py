"""sync_gradients in one process, and the weighting arithmetic it relies on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lbtrain import SingleProcessCommunicator, sync_gradients
from lbtrain.gradients import gradient_buckets


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def mean_loss_grads(model, x, y):
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_weighted_sum_of_shard_means_is_the_global_mean_and_naive_average_is_not():
    torch.manual_seed(1)
    x, y = torch.randn(64, 6, dtype=torch.float64), torch.randint(0, 3, (64,))
    model = make_model()
    full = mean_loss_grads(model, x, y)
    sizes = [5, 11, 48]
    shards = torch.split(torch.arange(64), sizes)
    shard_grads = [mean_loss_grads(model, x[idx], y[idx]) for idx in shards]
    weighted = [
        sum(g[k] * b / 64 for g, b in zip(shard_grads, sizes, strict=True))
        for k in range(len(full))
    ]
    naive = [sum(g[k] / 3 for g in shard_grads) for k in range(len(full))]
    for w, f in zip(weighted, full, strict=True):
        torch.testing.assert_close(w, f)
    assert max((n - f).abs().max().item() for n, f in zip(naive, full, strict=True)) > 1e-3


def test_single_process_sync_scales_by_the_weight():
    model = make_model()
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.randint(0, 3, (8,))
    before = mean_loss_grads(model, x, y)
    sync_gradients(model, 0.25, SingleProcessCommunicator())
    for p, g in zip(model.parameters(), before, strict=True):
        torch.testing.assert_close(p.grad, g * 0.25)


def test_missing_gradient_becomes_zero_so_every_rank_reduces_the_same_buffers():
    model = make_model()
    model.zero_grad(set_to_none=True)
    sync_gradients(model, 1.0, SingleProcessCommunicator())
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_buckets_split_by_size_dtype_and_skip_frozen_parameters():
    layers = [nn.Linear(256, 256) for _ in range(4)]  # ~257 KiB of float32 each
    layers[1].double()
    layers[3].weight.requires_grad_(False)
    params = [p for layer in layers for p in layer.parameters()]
    buckets = gradient_buckets(params, bucket_mb=0.3)
    assert sum(len(b) for b in buckets) == len(params) - 1
    for bucket in buckets:
        assert len({p.dtype for p in bucket}) == 1
    assert len(gradient_buckets(params, bucket_mb=100)) == 3  # float32 | float64 | float32


@pytest.mark.parametrize("weight", [-0.1, 1.5, float("nan")])
def test_bad_weight_is_rejected(weight):
    with pytest.raises(ValueError, match="weight="):
        sync_gradients(make_model(), weight, SingleProcessCommunicator())


def test_zero_weight_adds_exact_zeros_even_over_stale_nan_gradients():
    """A zero-share rank skips backward; whatever its gradients hold, it adds zeros."""
    model = make_model()
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    sync_gradients(model, 0.0, SingleProcessCommunicator())
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())
