"""Metrics against hand-computed values, and the classification map."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from hyperspectral.maps import (
    MissingDependencyError,
    _panels,
    class_colours,
    error_codes,
    predict_scene,
    require_matplotlib,
    save_map,
)
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


def _cielab(rgb: np.ndarray) -> np.ndarray:
    """sRGB in [0, 1] to CIELAB (D65), where distance ~ perceived difference."""
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = (
        lin
        @ np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]).T
    )
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], 1)


def test_cielab_matches_published_values():
    lab = _cielab(np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    np.testing.assert_allclose(lab, [[53.24, 80.09, 67.20], [100, 0, 0]], atol=0.05)


def test_sixteen_class_colours_are_far_apart_and_far_from_the_background():
    pytest.importorskip("matplotlib")
    colours = class_colours(16)
    assert colours.shape == (17, 3) and colours[0].tolist() == [0, 0, 0]
    assert colours.min() >= 0 and colours.max() <= 1
    lab = _cielab(colours)
    gaps = np.linalg.norm(lab[:, None] - lab[None], axis=-1)[1:, 1:]
    closest = gaps[~np.eye(16, dtype=bool)].min()
    # 25 CIELAB units tell two map regions apart at a glance (2.3 is the bare minimum). The
    # old palette of hues 22.5 degrees apart had 19.9 (Grass-trees vs Grass-pasture-mowed);
    # tab20 reordered strong-then-pale has 16.6 (pale blue vs pale purple).
    assert closest >= 25, closest
    assert np.linalg.norm(lab[1:] - lab[0], axis=1).min() >= 40  # unlabelled stands out


def test_error_codes_count_only_test_pixels():
    gt = np.array([[0, 1, 1], [2, 2, 2]])
    pred = np.array([[1, 1, 0], [1, 0, 1]])  # 0-based: wrong at (0,1) and (1,1)
    test = np.array([[False, False, True], [True, True, False]])
    codes = error_codes(gt, pred, test)
    # (0,1) is wrong but a training pixel: "not tested", not an error.
    np.testing.assert_array_equal(codes, [[0, 1, 2], [2, 3, 1]])


def test_map_panels_say_how_many_test_pixels_are_wrong():
    pytest.importorskip("matplotlib")
    gt = np.array([[0, 1, 1], [2, 2, 2]])
    pred = np.array([[1, 1, 0], [1, 0, 1]])
    test = np.array([[False, False, True], [True, True, False]])
    colours = class_colours(2)
    panels = _panels(np.ones((2, 3, 3)), gt, pred, colours, (43, 21, 11), test)
    titles = [t for _, t in panels]
    assert "bands 43, 21, 11" in titles[0] and "as R, G, B" in titles[0]
    assert titles[3] == "errors: 1 of 3 test pixels (33.3%)"
    masked, everything = panels[2][0], panels[4][0]
    np.testing.assert_array_equal(masked[0, 0], colours[0])  # unlabelled stays background
    np.testing.assert_array_equal(masked[1, 1], colours[1])  # predicted class 0 -> colour 1
    np.testing.assert_array_equal(everything[0, 0], colours[2])
    # Without a test mask every labelled pixel is scored, and the title says so.
    assert _panels(np.ones((2, 3, 3)), gt, pred, colours, (0, 1, 2), None)[3][1] == (
        "errors: 2 of 5 labelled pixels (40.0%)"
    )
    # A disjoint split's guard band gets its own colour; training pixels keep theirs.
    guard = np.array([[False, False, False], [False, False, True]])
    errors = _panels(np.ones((2, 3, 3)), gt, pred, colours, (0, 1, 2), test, guard)[3][0]
    plain = panels[3][0]
    assert not np.array_equal(errors[1, 2], plain[1, 2])  # (1,2): guard, not training
    np.testing.assert_array_equal(errors[0, 1], plain[0, 1])  # (0,1): a training pixel
    np.testing.assert_array_equal(errors[1, 1], plain[1, 1])  # a wrong test pixel stays red


@pytest.mark.parametrize("shape", [(12, 10), (40, 10)])  # the grid and the one-row layout
def test_map_png_is_written(tmp_path, shape):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    gt = rng.integers(0, 4, shape)
    path = save_map(
        tmp_path / "m" / "map.png",
        rng.random((*shape, 3)),
        gt,
        rng.integers(0, 3, shape),
        ["a", "b", "c"],
        bands=(4, 2, 0),
        test=rng.random(shape) < 0.5,
        title="t",
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_without_matplotlib_the_map_names_the_extra_and_the_way_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError) as info:
        require_matplotlib()
    message = str(info.value)
    assert "\n" not in message and "--map" in message
    assert "pip install 'lbtrain[hyperspectral]'" in message and "--no-map" in message
