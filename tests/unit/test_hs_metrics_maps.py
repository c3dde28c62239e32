"""Metrics against hand-computed values, and the classification map."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hyperspectral.maps import class_colours, predict_scene, save_map
from hyperspectral.metrics import (
    confusion_matrix,
    format_table,
    metrics_from_confusion,
    write_metrics,
)
from hyperspectral.models import build_model
from hyperspectral.patches import PatchDataset, pad_cube

# Hand-worked example: rows are true classes, columns predictions.
# class 0: 6 samples, 5 right; class 1: 5 samples, 3 right; class 2: 4 samples, 4 right.
CM = np.array([[5, 1, 0], [2, 3, 0], [0, 0, 4]])


def test_metrics_match_hand_computation():
    m = metrics_from_confusion(CM)
    assert m["oa"] == pytest.approx(12 / 15)
    assert m["aa"] == pytest.approx((5 / 6 + 3 / 5 + 1) / 3)
    # p_e = (6*7 + 5*4 + 4*4) / 15^2 = 78/225; kappa = (0.8 - p_e) / (1 - p_e)
    pe = 78 / 225
    assert m["kappa"] == pytest.approx((0.8 - pe) / (1 - pe))
    assert m["per_class_accuracy"] == pytest.approx([5 / 6, 3 / 5, 1.0])
    assert m["support"] == [6, 5, 4] and m["total"] == 15
    # Kappa = 102/147 reads as a coefficient with 4 decimals, never x 100; OA and AA in %.
    assert format_table(m).splitlines()[-3:] == ["OA    80.00 %", "AA    81.11 %", "kappa 0.6939"]


def test_metrics_agree_with_scikit_learn_and_sum_over_shards():
    from sklearn.metrics import accuracy_score, cohen_kappa_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 300)
    p = np.where(rng.random(300) < 0.7, y, rng.integers(0, 5, 300))
    whole = confusion_matrix(y, p, 5)
    # Two "ranks" each see half; summing their matrices gives the same metrics.
    summed = confusion_matrix(y[:150], p[:150], 5) + confusion_matrix(y[150:], p[150:], 5)
    np.testing.assert_array_equal(whole, summed)
    m = metrics_from_confusion(summed)
    assert m["oa"] == pytest.approx(accuracy_score(y, p))
    assert m["kappa"] == pytest.approx(cohen_kappa_score(y, p))


def test_absent_class_is_left_out_of_aa_and_shown_as_dash(tmp_path):
    cm = np.array([[3, 1, 0], [0, 0, 0], [1, 0, 1]])
    m = metrics_from_confusion(cm)
    assert m["per_class_accuracy"][1] is None
    assert m["aa"] == pytest.approx((0.75 + 0.5) / 2)
    table = format_table(m, ["water", "sand", "rock"])
    assert "sand" in table and "-" in table.splitlines()[2] and "OA    66.67 %" in table
    j, t = write_metrics(m, tmp_path, ["water", "sand", "rock"], {"seed": 3})
    data = json.loads(j.read_text())
    assert data["seed"] == 3 and data["class_names"][2] == "rock"
    assert t.read_text() == table
    with pytest.raises(ValueError, match="empty"):
        metrics_from_confusion(np.zeros((2, 2)))


def test_predict_scene_is_batched_and_equals_per_pixel_prediction():
    rng = np.random.default_rng(0)
    cube = rng.normal(size=(6, 7, 8)).astype(np.float32)
    torch.manual_seed(0)
    model = build_model("hamida", bands=8, num_classes=3, patch_size=5, dropout=0.0)
    padded = pad_cube(cube, 5)
    pred = predict_scene(model, padded, (6, 7), 5, batch_size=4)  # 42 px, ragged last batch
    ds = PatchDataset(padded, np.arange(42), 5, 7)
    with torch.no_grad():
        single = [int(model(ds[i][0][None]).argmax()) for i in range(42)]
    np.testing.assert_array_equal(pred.ravel(), single)
    assert model.training  # mode is restored


class _Recorder(torch.nn.Module):
    """Wraps a model and records the batch sizes it is called with."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.sizes = inner, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sizes.append(x.shape[0])
        return self.inner(x)


def test_predict_scene_memory_is_bounded_by_the_batch():
    cube = np.random.default_rng(1).normal(size=(30, 31, 6)).astype(np.float32)
    model = _Recorder(build_model("hu", bands=6, num_classes=3, dropout=0.0))
    pred = predict_scene(model, pad_cube(cube, 3), (30, 31), 3, batch_size=100)
    assert pred.shape == (30, 31) and pred.dtype == np.int64
    # Never more than one batch of patches in flight; every pixel predicted once.
    assert max(model.sizes) == 100 and sum(model.sizes) == 30 * 31
    with pytest.raises(ValueError, match="batch_size=0"):
        predict_scene(model, pad_cube(cube, 3), (30, 31), 3, batch_size=0)


def test_class_colours_are_distinct_with_black_for_unlabelled():
    colours = class_colours(16)
    assert colours.shape == (17, 3) and colours[0].tolist() == [0, 0, 0]
    assert len({tuple(np.round(c, 3)) for c in colours}) == 17
    assert colours.min() >= 0 and colours.max() <= 1


def test_map_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    gt = rng.integers(0, 4, (12, 10))
    path = save_map(
        tmp_path / "m" / "map.png",
        rng.random((12, 10, 5)),
        gt,
        rng.integers(0, 3, (12, 10)),
        ["a", "b", "c"],
        (0, 1, 2),
        "t",
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
