"""The lazy patch dataset and the model registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hyperspectral.models import (
    MODELS,
    build_model,
    member_correct_predictions,
    member_cross_entropy,
)
from hyperspectral.patches import MemberBatches, PatchDataset, pad_cube


@pytest.fixture(scope="module")
def cube():
    return np.random.default_rng(0).normal(size=(7, 9, 4)).astype(np.float32)


def test_patches_equal_a_direct_slice_including_borders(cube):
    p, r = 5, 2
    padded = pad_cube(cube, p)
    reference = np.pad(cube, ((r, r), (r, r), (0, 0)))  # zero padding, as documented
    gt = np.arange(1, 64).reshape(7, 9)
    ds = PatchDataset(padded, np.arange(63), p, 9, gt)
    for idx in [0, 8, 30, 54, 62]:  # corners, middle, edges
        row, col = divmod(idx, 9)
        patch, target = ds[idx]
        expected = reference[row : row + p, col : col + p].transpose(2, 0, 1)
        np.testing.assert_array_equal(patch.numpy(), expected)
        assert int(target) == gt[row, col] - 1
        # Centre of the patch is the pixel itself.
        np.testing.assert_array_equal(patch[:, r, r].numpy(), cube[row, col])
    # A batch of every pixel, in a shuffled order, with repeats: each item is its slice. The
    # dataset's pixels in an order of their own, so positions and pixels differ.
    ds = PatchDataset(padded, np.random.default_rng(1).permutation(63), p, 9, gt)
    order = torch.cat(
        [torch.randperm(63, generator=torch.Generator().manual_seed(0)), torch.tensor([30, 0, 30])]
    )
    x, y = ds.batch(order)
    assert x.shape == (66, 4, p, p) and x.is_contiguous()
    for j, idx in enumerate(order.tolist()):
        np.testing.assert_array_equal(x[j].numpy(), ds[idx][0].numpy())
        assert int(y[j]) == int(ds[idx][1])
    empty, none = ds.batch(torch.tensor([], dtype=torch.int64))
    assert empty.shape == (0, 4, p, p) and none.shape == (0,)


def test_dataset_shares_one_padded_cube(cube):
    padded = pad_cube(cube, 3)
    a = PatchDataset(padded, np.arange(10), 3, 9)
    b = PatchDataset(padded, np.arange(10, 63), 3, 9)
    assert a.padded.data_ptr() == b.padded.data_ptr() == padded.data_ptr()
    assert a.padded.numel() == 4 * 9 * 11  # C x (H+2r) x (W+2r), not N x P x P x C
    assert int(a[0][1]) == -1  # no labels given


def test_patch_dataset_rejects_bad_arguments(cube):
    with pytest.raises(ValueError, match="patch_size=4 must be a positive odd"):
        pad_cube(cube, 4)
    with pytest.raises(ValueError, match="out-of-range"):
        PatchDataset(pad_cube(cube, 3), np.array([63]), 3, 9)


@pytest.mark.parametrize(
    ("name", "bands", "patch"),
    [
        ("hu", 50, 1),
        ("hu", 50, 5),
        ("hamida", 20, 5),
        ("hamida", 20, 3),
        ("hybridsn", 15, 9),
        ("hybridsn", 30, 25),
        ("ssftt", 30, 13),
        ("ssftt", 3, 5),
    ],
)
def test_model_output_shapes(name, bands, patch):
    torch.manual_seed(0)
    model = build_model(name, bands=bands, num_classes=7, patch_size=patch, dropout=0.0)
    out = model(torch.randn(3, bands, patch, patch))
    assert out.shape == (3, 7)
    assert MODELS[name].factory.__doc__ and type(model).__doc__


@pytest.mark.parametrize("name", list(MODELS))
def test_dropout_zero_makes_training_mode_deterministic(name):
    spec = MODELS[name]
    bands = 30 if name == "hybridsn" else 20
    x = torch.randn(2, bands, spec.patch_size, spec.patch_size)
    model = build_model(name, bands=bands, num_classes=4, dropout=0.0).train()
    torch.testing.assert_close(model(x), model(x))
    noisy = build_model(name, bands=bands, num_classes=4, dropout=0.5).train()
    torch.manual_seed(1)
    first = noisy(x)
    assert not torch.equal(first, noisy(x))


def test_ssftt_is_the_published_network_with_its_recipe_as_defaults():
    spec = MODELS["ssftt"]
    assert (spec.patch_size, spec.pca, spec.dropout) == (13, 30, 0.1)
    model = build_model("ssftt", bands=30, num_classes=16)
    assert model.embed_dropout.p == 0.1 and MODELS["hamida"].dropout == 0.4
    # On Indian Pines' shapes (PCA 30, patch 13, 16 classes), counted layer by layer:
    # 3-D conv 224 + BN 16, 2-D conv 129,088 + BN 128, tokenizer 4,352, class token and
    # positions 384, encoder 17,992 (norms 256, qkv 12,480, projection 4,160, MLP 1,096),
    # classifier 1,040.
    assert sum(p.numel() for p in model.parameters()) == 153_224
    # Tokens pool every spatial feature: a change in a corner pixel reaches the logits.
    model.eval()
    x = torch.randn(1, 30, 13, 13)
    y = x.clone()
    y[0, :, 0, 0] += 1.0
    assert not torch.allclose(model(x), model(y))
    with pytest.raises(ValueError, match="ssftt needs an odd patch_size >= 5, got 3"):
        build_model("ssftt", bands=30, num_classes=3, patch_size=3)


def test_build_model_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown model 'resnet'; choose one of hu, hamida"):
        build_model("resnet", bands=10, num_classes=3)
    with pytest.raises(ValueError, match="dropout=1.0"):
        build_model("hu", bands=10, num_classes=3, dropout=1.0)
    with pytest.raises(ValueError, match="patch_size >= 9, got 7"):
        build_model("hybridsn", bands=30, num_classes=3, patch_size=7)
    for members in (0, True, 2.0):
        with pytest.raises(ValueError, match=f"members={members!r} must be a whole number"):
            build_model("hu", bands=10, num_classes=3, members=members)


def test_an_ensemble_trains_each_member_on_its_own_loss_and_predicts_their_mean():
    torch.manual_seed(0)
    ensemble = build_model("hamida", bands=6, num_classes=4, dropout=0.0, members=3)
    first, second = ensemble.members[0], ensemble.members[1]
    # Each member starts from its own weights.
    assert not torch.equal(next(first.parameters()), next(second.parameters()))
    x, y = torch.randn(5, 6, 5, 5), torch.tensor([0, 1, 2, 3, 1])
    stacked = ensemble.train()(x)
    assert stacked.shape == (5, 4, 3)
    # The loss is the members' mean loss ...
    each = [torch.nn.functional.cross_entropy(m(x), y) for m in ensemble.members]
    loss = member_cross_entropy(stacked, y)
    torch.testing.assert_close(loss, sum(each) / 3)
    # ... so a member's gradient is its own loss's, whatever the others predict.
    loss.backward()
    alone = [p.grad.clone() for p in first.parameters()]
    first.zero_grad()
    (each[0] / 3).backward()
    for got, want in zip(alone, (p.grad for p in first.parameters()), strict=True):
        torch.testing.assert_close(got, want)
    # In eval mode: the log of the members' mean probability, read like one model's logits.
    ensemble.eval()
    with torch.no_grad():
        mean = torch.stack([m(x).softmax(1) for m in ensemble.members]).mean(0)
        torch.testing.assert_close(ensemble(x).exp(), mean)
    assert member_correct_predictions(stacked, y) == float((mean.argmax(1) == y).sum())
    # One model's (N, K) logits are read as they always were.
    assert member_cross_entropy(first(x), y) == torch.nn.functional.cross_entropy(first(x), y)


def test_member_batches_give_each_member_every_sample_once_in_its_own_order(cube):
    gt = np.arange(1, 64).reshape(7, 9)  # every pixel its own class: targets name the pixel
    base = PatchDataset(pad_cube(cube, 3), np.arange(5, 60), 3, 9, gt)
    batches = MemberBatches(base, members=3, seed=4)
    everything = list(range(len(base)))
    x, y = batches.__getitems__(everything)
    assert x.shape == (len(base), 3, 4, 3, 3) and y.shape == (len(base), 3)
    # Member 0 reads the sampler's order; each member reads every sample once an epoch ...
    torch.testing.assert_close(y[:, 0], base.targets)
    for member in range(3):
        assert sorted(y[:, member].tolist()) == sorted(base.targets.tolist())
        for row in (0, 17, len(base) - 1):  # ... with its patch, not another pixel's
            torch.testing.assert_close(x[row, member], base[int(y[row, member]) - 5][0])
    # ... and the members' batches differ: the same index is another sample for each.
    assert (y[:, 1] != y[:, 0]).float().mean() > 0.8 and (y[:, 2] != y[:, 1]).any()
    # The orders depend on the seed alone (every rank draws the same), a batch on its
    # indices alone (any split of the global batch over ranks reads the same samples).
    again = MemberBatches(base, members=3, seed=4)
    torch.testing.assert_close(again.__getitems__([9, 2])[1], y[[9, 2]])
    assert not torch.equal(MemberBatches(base, members=3, seed=5).__getitems__(everything)[1], y)
    x1, y1 = batches[9]
    torch.testing.assert_close(x1, x[9])
    torch.testing.assert_close(y1, y[9])
    with pytest.raises(ValueError, match="needs >= 2 members"):
        MemberBatches(base, members=1, seed=0)
    # The stream is pinned: BENCHMARKS.md's figures for --ensemble-batches own were measured
    # with it, and another would train other batches.
    ten = PatchDataset(pad_cube(cube, 3), np.arange(10), 3, 9, gt)
    assert MemberBatches(ten, members=2, seed=0).orders[1, :6].tolist() == [0, 8, 5, 9, 1, 7]


def test_an_ensemble_with_its_own_batches_trains_member_m_on_its_own_samples():
    torch.manual_seed(0)
    ensemble = build_model(
        "hamida", bands=6, num_classes=4, dropout=0.0, members=2, own_batches=True
    )
    x, y = torch.randn(5, 2, 6, 5, 5), torch.tensor([[0, 1], [2, 3], [1, 1], [0, 2], [3, 0]])
    stacked = ensemble.train()(x)
    assert stacked.shape == (5, 4, 2)
    for m, member in enumerate(ensemble.members):
        torch.testing.assert_close(stacked[..., m], member(x[:, m]))
    # Each member's loss on its own samples, their mean: still a mean over the batch.
    each = [torch.nn.functional.cross_entropy(stacked[..., m], y[:, m]) for m in range(2)]
    torch.testing.assert_close(member_cross_entropy(stacked, y), sum(each) / 2)
    right = [(stacked[..., m].argmax(1) == y[:, m]).sum() for m in range(2)]
    assert member_correct_predictions(stacked, y) == float(sum(right)) / 2
    with pytest.raises(ValueError, match=r"takes \(N, 2, ...\) inputs in training"):
        ensemble(torch.randn(5, 6, 5, 5))
    # Predicting reads one patch a pixel, as before.
    assert ensemble.eval()(torch.randn(5, 6, 5, 5)).shape == (5, 4)
