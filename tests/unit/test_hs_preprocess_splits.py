"""Leak-free preprocessing and the three split kinds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hyperspectral.datasets import load_scene, make_synthetic_scene
from hyperspectral.preprocess import fit_preprocessor
from hyperspectral.splits import (
    disjoint_split,
    fixed_split,
    load_split,
    make_split,
    random_split,
    save_split,
)


@pytest.fixture(scope="module")
def scene():
    return make_synthetic_scene(40, 44, 16, 4, seed=3)


@pytest.fixture(scope="module")
def indian_pines_gt():
    """Real Indian Pines labels: from $LBTRAIN_DATA when set, else tensorly's copy."""
    return load_scene("IndianPines", download=False, progress=None).gt


def _covers_test_pixel(
    train: np.ndarray, test: np.ndarray, shape: tuple[int, int], patch: int
) -> np.ndarray:
    """For each training pixel, whether its patch x patch window holds a test pixel."""
    from scipy import ndimage

    test_mask = np.zeros(shape[0] * shape[1], bool)
    test_mask[test] = True
    near_test = ndimage.maximum_filter(test_mask.reshape(shape), size=patch, mode="constant")
    return near_test.ravel()[train]


def test_standardisation_uses_training_pixels_only(scene):
    split = random_split(scene.gt, 0.2, seed=0)
    prep = fit_preprocessor(scene.cube, split.train)
    train_pixels = scene.cube.reshape(-1, 16)[split.train].astype(np.float64)
    np.testing.assert_allclose(prep.mean, train_pixels.mean(0), rtol=1e-10)
    np.testing.assert_allclose(prep.std, train_pixels.std(0), rtol=1e-10)
    # Wildly changing every non-training pixel must not move the fit...
    poisoned = scene.cube.copy().reshape(-1, 16)
    others = np.setdiff1d(np.arange(poisoned.shape[0]), split.train)
    poisoned[others] = poisoned[others] * 100 + 1e4
    refit = fit_preprocessor(poisoned.reshape(scene.cube.shape), split.train)
    np.testing.assert_array_equal(refit.mean, prep.mean)
    np.testing.assert_array_equal(refit.std, prep.std)
    # ...while changing one training pixel does (so this test can fail).
    poisoned[split.train[0]] += 1e4
    moved = fit_preprocessor(poisoned.reshape(scene.cube.shape), split.train)
    assert not np.allclose(moved.mean, prep.mean)


def test_pca_is_fitted_on_training_pixels_only(scene):
    split = random_split(scene.gt, 0.2, seed=1)
    prep = fit_preprocessor(scene.cube, split.train, 5)
    poisoned = scene.cube.copy().reshape(-1, 16)
    test_mask = np.ones(poisoned.shape[0], bool)
    test_mask[split.train] = False
    poisoned[test_mask] = np.random.default_rng(0).normal(0, 50, (test_mask.sum(), 16))
    refit = fit_preprocessor(poisoned.reshape(scene.cube.shape), split.train, 5)
    np.testing.assert_allclose(refit.pca.components_, prep.pca.components_)
    out = prep.transform(scene.cube)
    assert out.shape == (40, 44, 5) and out.dtype == np.float32
    # Whitened PCA of training pixels has unit variance there (ddof=1 as sklearn).
    np.testing.assert_allclose(out.reshape(-1, 5)[split.train].std(0, ddof=1), 1, rtol=1e-3)
    with pytest.raises(ValueError, match="pca_components=40 is out of range"):
        fit_preprocessor(scene.cube, split.train, 40)


def test_random_split_is_stratified_disjoint_and_seeded(scene):
    a = random_split(scene.gt, 0.25, seed=7)
    b = random_split(scene.gt, 0.25, seed=7)
    c = random_split(scene.gt, 0.25, seed=8)
    np.testing.assert_array_equal(a.train, b.train)
    assert not np.array_equal(a.train, c.train)
    assert np.intersect1d(a.train, a.test).size == 0
    labelled = np.flatnonzero(scene.gt.ravel() > 0)
    np.testing.assert_array_equal(np.union1d(a.train, a.test), labelled)
    flat = scene.gt.ravel()
    for k in range(1, 5):
        n = (flat == k).sum()
        assert (flat[a.train] == k).sum() == round(0.25 * n)
    with pytest.raises(ValueError, match="train_ratio=1.5"):
        random_split(scene.gt, 1.5)


def test_fixed_split_caps_tiny_classes_with_a_warning():
    gt = np.zeros((10, 10), dtype=np.int64)
    gt[:5] = 1  # 50 pixels
    gt[9, :4] = 2  # 4 pixels: fewer than requested
    with pytest.warns(UserWarning, match="class 2 has only 4 labelled pixels"):
        split = fixed_split(gt, 10, seed=0)
    flat = gt.ravel()
    assert (flat[split.train] == 1).sum() == 10
    assert (flat[split.train] == 2).sum() == 2 and (flat[split.test] == 2).sum() == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed_split(gt, 3, seed=0)  # no class is tiny: no warning


@pytest.mark.parametrize("patch", [3, 5, 9])
def test_disjoint_split_no_training_patch_covers_a_test_pixel(scene, patch):
    split = disjoint_split(scene.gt, 0.3, patch, seed=2)
    assert split.train.size > 0 and split.test.size > 0
    r = patch // 2
    h, w = scene.gt.shape
    test_mask = np.zeros(h * w, bool)
    test_mask[split.test] = True
    test_mask = test_mask.reshape(h, w)
    for idx in split.train:
        row, col = divmod(int(idx), w)
        window = test_mask[max(0, row - r) : row + r + 1, max(0, col - r) : col + r + 1]
        assert not window.any(), f"training patch at {(row, col)} covers a test pixel"
    # A random split of the same scene does leak, so the check above has teeth.
    rnd = random_split(scene.gt, 0.3, seed=2)
    rnd_test = np.zeros(h * w, bool)
    rnd_test[rnd.test] = True
    row, col = divmod(int(rnd.train[len(rnd.train) // 2]), w)
    assert rnd_test.reshape(h, w)[
        max(0, row - r) : row + r + 1, max(0, col - r) : col + r + 1
    ].any()


def test_disjoint_split_takes_the_ratio_of_every_class_and_names_its_guard_band():
    s = make_synthetic_scene(96, 96, 8, 3, seed=0, regions_per_class=6)
    split = disjoint_split(s.gt, 0.3, 5, seed=0)
    flat = s.gt.ravel()
    for k in range(1, 4):
        assert (flat[split.train] == k).sum() == round(0.3 * (flat == k).sum()), k
    # Every labelled pixel is in exactly one of train, test and the guard band, and the
    # guard band is what lies within 2 pixels of training: no more is thrown away.
    parts = [split.train, split.test, split.guard]
    assert sum(p.size for p in parts) == (flat > 0).sum() == np.unique(np.concatenate(parts)).size
    train = np.zeros(flat.size, bool)
    train[split.train] = True
    from scipy import ndimage

    near = ndimage.maximum_filter(train.reshape(s.gt.shape), size=5, mode="constant").ravel()
    assert near[split.guard].all() and not near[split.test].any()
    assert split.meta["guard_radius"] == 2 and split.meta["train_only"] == []


def test_split_round_trips_through_an_index_file(scene, tmp_path):
    split = make_split("random", scene.gt, train_ratio=0.1, seed=4)
    path = save_split(split, tmp_path / "split.npz")
    back = load_split(path, scene.gt)
    np.testing.assert_array_equal(back.train, split.train)
    np.testing.assert_array_equal(back.test, split.test)
    assert back.meta == {"kind": "random", "train_ratio": 0.1, "seed": 4}
    with pytest.raises(ValueError, match="is for shape"):
        load_split(path, np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="needs per_class"):
        make_split("fixed", scene.gt)


def test_random_split_of_real_indian_pines_takes_ten_percent_of_every_class(indian_pines_gt):
    split = random_split(indian_pines_gt, 0.1, seed=0)
    flat = indian_pines_gt.ravel()
    counts = np.bincount(flat[flat > 0], minlength=17)[1:]
    train_counts = np.bincount(flat[split.train], minlength=17)[1:]
    np.testing.assert_array_equal(train_counts, np.maximum(1, np.round(0.1 * counts)))
    assert split.train.size == 1025 and split.train.size + split.test.size == 10249
    # Patches of a random split do overlap test pixels: the reason the disjoint split exists.
    assert _covers_test_pixel(split.train, split.test, indian_pines_gt.shape, 25).mean() > 0.9


@pytest.mark.parametrize("patch", range(5, 26, 2))
def test_disjoint_split_of_real_indian_pines_works_at_every_patch_and_never_overlaps(
    indian_pines_gt, patch
):
    """Issue 23: every class trains; one too small to test beyond the guard is named."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split = disjoint_split(indian_pines_gt, 0.1, patch, seed=0)
    assert not _covers_test_pixel(split.train, split.test, indian_pines_gt.shape, patch).any()
    flat = indian_pines_gt.ravel()
    counts = np.bincount(flat[flat > 0], minlength=17)[1:]
    trained = np.bincount(flat[split.train], minlength=17)[1:]
    tested = np.bincount(flat[split.test], minlength=17)[1:]
    np.testing.assert_array_equal(trained, np.maximum(1, np.round(0.1 * counts)))
    untested = [c for c in range(1, 17) if tested[c - 1] == 0]
    assert split.meta["train_only"] == untested
    named = sorted(int(str(w.message).split()[3]) for w in caught)
    assert named == untested and all("is not tested" in str(w.message) for w in caught)
    # The small fields of Indian Pines: grass-pasture-mowed (7x4 pixels) is tested up to
    # patch 11; the big classes always are.
    assert (7 in untested) == (patch > 11)
    # The guard band grows with the patch: 8,377 test pixels at 5, 2,185 at 25 (of 10,249).
    assert len(untested) <= 4 and split.test.size > 2000


def test_the_patch_a_warning_suggests_is_smaller_and_tests_the_class(indian_pines_gt):
    # Once a bound on the class alone: "35 or less" at patch 29 (larger, and still
    # untested), "261 or less" on a scene 145 wide. Other classes' training pixels guard it too.
    import re

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        disjoint_split(indian_pines_gt, 0.1, 29, seed=0)
    suggested = {
        int(str(w.message).split()[3]): int(re.search(r"--patch-size (\d+)", str(w.message))[1])
        for w in caught
    }
    assert suggested and all(p < 29 for p in suggested.values()), suggested
    for c, patch in suggested.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            split = disjoint_split(indian_pines_gt, 0.1, patch, seed=0)
        assert c not in split.meta["train_only"], (c, patch)


def test_largest_testable_patch_is_the_last_patch_that_tests_a_class_alone():
    from hyperspectral.disjoint import largest_testable_patch

    strip = np.zeros((40, 40), dtype=np.int64)
    strip[3:13, 5:7] = 1  # 10x2, like Indian Pines' oats: 2 train pixels at one end
    strip[25:, 25:] = 2  # a field far enough away to keep test pixels at these patches
    largest = largest_testable_patch(strip == 1, 0.1)
    assert largest == 17
    for patch, tested in ((largest, True), (largest + 2, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            split = disjoint_split(strip, 0.1, patch, seed=0)
        assert (strip.ravel()[split.test] == 1).any() == tested
        assert split.meta["train_only"] == ([] if tested else [1])
        assert bool(caught) != tested
        if not tested:
            assert "--patch-size 17 would test it" in str(caught[0].message)
    assert largest_testable_patch(strip == 0, 0.5) is not None
    single = np.zeros((5, 5), bool)
    single[2, 2] = True
    assert largest_testable_patch(single, 0.1) is None


def test_a_class_whose_field_slices_leave_it_untested_is_cut_as_one_slice(scene, monkeypatch):
    """At patch 25 a slice in every field of a class can guard all of it; one slice of the
    whole class leaves its far fields clear, and is kept when it tests more."""
    from hyperspectral import disjoint

    def untested() -> list[int]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            split = disjoint_split(scene.gt, 0.3, 25, seed=0)
        assert not _covers_test_pixel(split.train, split.test, scene.gt.shape, 25).any()
        return split.meta["train_only"]

    with_fallback = untested()
    monkeypatch.setattr(disjoint, "ONE_SLICE_FALLBACK", False)
    try:
        without = untested()
    except ValueError:  # then no class at all keeps a test pixel
        without = [1, 2, 3, 4]
    assert len(with_fallback) < len(without), (with_fallback, without)


def test_a_guard_band_that_leaves_no_test_pixel_is_one_line():
    gt = np.zeros((12, 12), dtype=np.int64)
    gt[2:6, 2:6], gt[6:10, 6:10] = 1, 2
    with pytest.raises(ValueError) as err:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            disjoint_split(gt, 0.1, 25, seed=0)
    message = str(err.value)
    assert "\n" not in message and "leaves no test pixels" in message
    assert "--patch-size" in message and "--split random" in message


def test_load_split_errors_are_one_clear_line(scene, tmp_path):
    with pytest.raises(ValueError, match="cannot read split file .*nope.npz.*earlier run"):
        load_split(tmp_path / "nope.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="cannot read split file"):
        load_split(tmp_path / "junk.npz")
    split = random_split(scene.gt, 0.2, seed=0)
    other = np.zeros_like(scene.gt)
    path = save_split(split, tmp_path / "s.npz")
    with pytest.raises(ValueError, match="unlabelled pixels; was it written for another scene"):
        load_split(path, other)


def test_damaged_or_inconsistent_split_files_are_one_clear_line(scene, tmp_path):
    split = random_split(scene.gt, 0.2, seed=0)
    whole = save_split(split, tmp_path / "whole.npz").read_bytes()
    (tmp_path / "half.npz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="cannot read split file"):
        load_split(tmp_path / "half.npz")
    shared = type(split)(split.train, np.concatenate([split.test, split.train[:1]]), split.shape)
    path = save_split(shared, tmp_path / "shared.npz")
    with pytest.raises(ValueError, match="both train and test"):
        load_split(path, scene.gt)
    # Once accepted: a pixel trained twice, one scored twice, float pixel numbers.
    for name, train, test in (
        ("train", np.concatenate([split.train, split.train[:3]]), split.test),
        ("test", split.train, np.concatenate([split.test, split.test[:1]])),
    ):
        path = save_split(type(split)(train, test, split.shape), tmp_path / f"twice-{name}.npz")
        with pytest.raises(ValueError, match=f"some {name} pixels are listed twice"):
            load_split(path, scene.gt)
    floats = type(split)(split.train.astype(float), split.test, split.shape)
    with pytest.raises(ValueError, match="train indices are float64, not integers"):
        load_split(save_split(floats, tmp_path / "floats.npz"), scene.gt)


def test_disjoint_split_file_refuses_a_bigger_patch(scene, tmp_path):
    from hyperspectral.datasets import get_scene
    from hyperspectral.pipeline import prepare, split_scene
    from hyperspectral.workload import build

    path = save_split(disjoint_split(scene.gt, 0.3, 3, seed=0), tmp_path / "d.npz")
    with pytest.raises(ValueError, match="made for patch 3.*--patch-size is 7"):
        split_scene(scene, "random", split_file=str(path), patch_size=7)
    same = split_scene(scene, "random", split_file=str(path), patch_size=3)
    assert same.meta["kind"] == "disjoint"
    assert prepare(scene, same, 3, None).train_set[0][0].shape[-2:] == (3, 3)
    # The same through the workload, on the generated scene it can load by name.
    gt = get_scene("synthetic").gt
    path = save_split(disjoint_split(gt, 0.3, 3, seed=0), tmp_path / "s.npz")
    options = {"dataset": "synthetic", "model": "hamida", "split_file": str(path), "map": False}
    with pytest.raises(ValueError, match="made for patch 3.*--patch-size is 7"):
        build(patch_size=7, **options)
    assert build(patch_size=3, **options).sample_shape[1:] == (3, 3)
