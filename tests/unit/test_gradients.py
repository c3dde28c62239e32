"""sync_gradients in one process, and the weighting arithmetic it relies on."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import SingleProcessCommunicator, balanced_loader, sync_gradients
from lbtrain.comm import run_ranks
from lbtrain.parallel.buckets import gradient_buckets
from lbtrain.parallel.gradients import GradientSync


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
    GradientSync(model, SingleProcessCommunicator()).sync(0.25)
    for p, g in zip(model.parameters(), before, strict=True):
        torch.testing.assert_close(p.grad, g * 0.25)


def test_weights_that_do_not_sum_to_one_are_refused_before_any_gradient_changes():
    model = make_model()
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.randint(0, 3, (8,))
    before = mean_loss_grads(model, x, y)
    with pytest.raises(ValueError, match=r"weights sum to 0\.25, not 1 \(0\.25 on 1 ranks\)"):
        sync_gradients(model, 0.25, SingleProcessCommunicator())
    for p, g in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.grad, g)


def test_a_loader_planned_for_more_ranks_than_the_job_is_one_error_on_every_rank():
    """Weights from a 3-rank plan on 2 ranks sum to 2/3: the update would shrink silently."""
    dataset = TensorDataset(torch.randn(24, 6, dtype=torch.float64), torch.randint(0, 3, (24,)))

    def work(comm):
        loader = balanced_loader([1.0, 1.0, 1.0], dataset, global_batch_size=6, rank=comm.rank)
        model = make_model()
        x, y = next(iter(loader))
        mean_loss_grads(model, x, y)
        try:
            sync_gradients(model, loader.weight, comm)
        except ValueError as exc:
            return str(exc)
        return None

    messages = [r.value for r in run_ranks(2, work, timeout=30)]
    assert messages[0] == messages[1]
    assert messages[0] is not None and "weights sum to 0.666666667, not 1" in messages[0]
    assert "on 2 ranks" in messages[0]


def test_a_zero_share_rank_weighs_in_with_zero_and_passes_the_check():
    def work(comm):
        sizes = [0, 8]
        model = make_model()
        if sizes[comm.rank]:
            x, y = torch.randn(8, 6, dtype=torch.float64), torch.randint(0, 3, (8,))
            mean_loss_grads(model, x, y)
        sync_gradients(model, sizes[comm.rank] / 8, comm)
        return [p.grad.clone() for p in model.parameters()]

    grads = [r.value for r in run_ranks(2, work, timeout=30)]
    assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[1], strict=True))


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
    GradientSync(model, SingleProcessCommunicator()).sync(0.0)
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


def test_float32_weights_pass_and_a_prescaled_loss_sums_its_gradients_as_they_are():
    """Three float32 thirds sum to 1 + 3e-8: a rounding, not a wrong plan."""
    third = float(np.float32(1) / np.float32(3))
    # Built before the threads start: ranks that are threads share torch's global generator.
    template = make_model()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, dtype=torch.float64, generator=generator)
    y = torch.randint(0, 3, (8,), generator=generator)

    def work(comm):
        model = copy.deepcopy(template)
        before = mean_loss_grads(model, x, y)
        sync_gradients(model, third, comm, prescaled=True)
        return before, [p.grad.clone() for p in model.parameters()]

    results = [r.value for r in run_ranks(3, work, timeout=30)]
    before, after = results[0]
    for b, a in zip(before, after, strict=True):
        torch.testing.assert_close(a, 3 * b)  # three equal ranks, summed unscaled
