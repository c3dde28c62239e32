"""Scene registry, loaders, error messages and the synthetic generator."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hyperspectral.datasets import (
    SCENES,
    DatasetError,
    get_scene_info,
    load_scene,
    make_synthetic_scene,
    search_dirs,
)
from hyperspectral.datasets import loader as loader_mod
from hyperspectral.datasets import matfile as matfile_mod
from hyperspectral.datasets.download import git_blob_sha1, sha256_of
from hyperspectral.splits import random_split

from .hs_fixtures import empty_dir, fake_info, write_fake_scene

# The shared data folder next to the repository (../shared/datasets), wherever it is checked out.
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Point the user cache at an empty temporary folder and forget LBTRAIN_DATA."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def test_registry_lists_the_six_scenes_with_consistent_metadata():
    assert set(SCENES) == {"IndianPines", "PaviaU", "Salinas", "PaviaC", "KSC", "Botswana"}
    for info in SCENES.values():
        assert info.cube.url.startswith("http") and info.gt.url.endswith(info.gt.filename)
        assert all(0 <= b < info.shape[2] for b in info.rgb_bands), info.name
    assert SCENES["IndianPines"].num_classes == 16 and SCENES["PaviaU"].num_classes == 9
    assert get_scene_info("paviau") is SCENES["PaviaU"]
    with pytest.raises(DatasetError, match="unknown scene 'Nowhere'.*IndianPines"):
        get_scene_info("Nowhere")


def test_registry_checksums_match_the_shared_files():
    if not SHARED.is_dir():
        pytest.skip(f"no {SHARED} here")
    sums = dict(line.split()[::-1] for line in (SHARED / "SHA256SUMS").read_text().splitlines())
    known = {f.filename: f.sha256 for info in SCENES.values() for f in (info.cube, info.gt)}
    for name, digest in sums.items():
        assert known[name] == digest


def test_registry_git_blob_ids_match_the_shared_files():
    """The blob ids (what ``git hash-object`` prints) are the check for files with no sha256."""
    if not SHARED.is_dir():
        pytest.skip(f"no {SHARED} here")
    files = {f.filename: f for info in SCENES.values() for f in (info.cube, info.gt)}
    for path in SHARED.glob("*.mat"):
        assert files[path.name].git_sha1 == git_blob_sha1(path), path.name
        assert files[path.name].size == path.stat().st_size
    # The cubes we cannot hold still carry an id, so a download of them is verified.
    assert files["PaviaU.mat"].git_sha1 and files["Salinas_corrected.mat"].git_sha1
    for name in ("IndianPines", "PaviaU", "Salinas"):
        assert all(f.sha256 or f.git_sha1 for f in (SCENES[name].cube, SCENES[name].gt))


def test_real_indian_pines_loads_from_lbtrain_data_or_tensorly():
    """Reads $LBTRAIN_DATA when set (e.g. ../shared/datasets), tensorly's copy otherwise."""
    env = os.environ.get("LBTRAIN_DATA")
    scene = load_scene("IndianPines", download=False, progress=None)
    assert scene.cube.shape == (145, 145, 200) and scene.cube.dtype == np.float32
    assert scene.num_classes == 16
    assert int((scene.gt > 0).sum()) == 10249
    assert scene.class_counts().tolist()[:4] == [46, 1428, 830, 237]
    if env and (Path(env) / "Indian_pines_corrected.mat").is_file():
        assert scene.source == str(Path(env))
    else:
        assert "tensorly" in scene.source


def test_mat_files_and_tensorly_copy_agree(monkeypatch):
    if not (SHARED / "Indian_pines_gt.mat").is_file():
        pytest.skip("no shared Indian Pines .mat files")
    from_mat = load_scene("IndianPines", SHARED, download=False, progress=None)
    assert from_mat.source == str(SHARED)
    # An empty data dir forces the tensorly fallback.
    monkeypatch.delenv("LBTRAIN_DATA", raising=False)
    from_npy = load_scene("IndianPines", download=False, progress=None)
    assert "tensorly" in from_npy.source
    np.testing.assert_array_equal(from_mat.cube, from_npy.cube)
    np.testing.assert_array_equal(from_mat.gt, from_npy.gt)


def test_tensorly_copy_is_read_as_package_data():
    folder = loader_mod.tensorly_data_dir()
    if folder is None:
        pytest.skip("tensorly is not installed")
    assert folder.joinpath("Indian_pines_gt.npy").is_file()
    with folder.joinpath("Indian_pines_gt.npy").open("rb") as fh:
        assert np.load(fh).shape == (145, 145)


def test_corrupt_tensorly_copy_is_a_clear_error(tmp_path, monkeypatch):
    np.save(tmp_path / "Indian_pines_corrected.npy", np.zeros((2, 2, 2)))
    (tmp_path / "Indian_pines_gt.npy").write_bytes(b"\x93NUMPY junk")
    monkeypatch.setattr(loader_mod, "tensorly_data_dir", lambda: tmp_path)
    monkeypatch.delenv("LBTRAIN_DATA", raising=False)
    with pytest.raises(DatasetError, match="tensorly's copy .*Indian_pines_gt.npy is corrupt"):
        load_scene("IndianPines", empty_dir(tmp_path), download=False)


def test_one_local_file_is_never_paired_with_the_tensorly_copy(tmp_path, monkeypatch):
    if not (SHARED / "Indian_pines_gt.mat").is_file():
        pytest.skip("no shared Indian Pines .mat files")
    half = tmp_path / "half"
    half.mkdir()
    (half / "Indian_pines_gt.mat").write_bytes((SHARED / "Indian_pines_gt.mat").read_bytes())
    with pytest.raises(
        DatasetError,
        match="Indian_pines_corrected.mat for scene IndianPines not found in .*half.*uploads/6/67",
    ):
        load_scene("IndianPines", half, download=False)


def test_loader_search_order_data_dir_then_env_then_cache(tmp_path, monkeypatch):
    """Three folders hold different copies of the same scene; the first in order wins."""
    places = {"arg": tmp_path / "arg", "env": tmp_path / "env", "cache": tmp_path / "xdg/lbtrain"}
    for i, folder in enumerate(places.values()):
        write_fake_scene(folder)
        cube_file = folder / "fake_cube.mat"
        import scipy.io

        scipy.io.savemat(cube_file, {"cube": np.full((6, 5, 4), i, dtype=np.uint16)})
    monkeypatch.setenv("LBTRAIN_DATA", str(places["env"]))
    first = lambda *a: float(load_scene(fake_info(), *a, download=False).cube[0, 0, 0])  # noqa: E731
    assert first(places["arg"]) == 0  # --data-dir beats LBTRAIN_DATA
    assert first() == 1  # LBTRAIN_DATA beats the cache
    monkeypatch.delenv("LBTRAIN_DATA")
    assert first() == 2  # then the user cache
    # A file missing from --data-dir is still found in the cache (downloads land there).
    (places["arg"] / "fake_cube.mat").unlink()
    assert first(places["arg"]) == 2


def test_search_order_prefers_explicit_dir_then_env_then_cache(tmp_path, monkeypatch):
    cache = tmp_path / "xdg" / "lbtrain"
    monkeypatch.delenv("LBTRAIN_DATA", raising=False)
    assert search_dirs() == [cache]
    for name in ("env", "arg"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("LBTRAIN_DATA", str(tmp_path / "env"))
    assert search_dirs() == [tmp_path / "env", cache]
    assert search_dirs(tmp_path / "arg") == [tmp_path / "arg", cache]


def test_a_mistyped_data_folder_is_refused_not_replaced_by_another_copy(tmp_path, monkeypatch):
    monkeypatch.delenv("LBTRAIN_DATA", raising=False)
    with pytest.raises(DatasetError, match="--data-dir .*nope' does not exist"):
        search_dirs(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(DatasetError, match="--data-dir .*file' is a file"):
        load_scene("IndianPines", tmp_path / "file", download=False)
    monkeypatch.setenv("LBTRAIN_DATA", str(tmp_path / "typo"))
    with pytest.raises(DatasetError, match="LBTRAIN_DATA=.*typo' does not exist"):
        search_dirs()


def test_fake_scene_round_trip(tmp_path):
    cube, gt = write_fake_scene(tmp_path / "d")
    scene = load_scene(fake_info(), tmp_path / "d", download=False)
    np.testing.assert_array_equal(scene.cube, cube.astype(np.float32))
    np.testing.assert_array_equal(scene.gt, gt)
    assert scene.gt.dtype == np.int64


def test_missing_file_says_where_it_looked_and_where_to_get_it(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_scene(fake_info(), empty_dir(tmp_path), download=False)
    msg = str(err.value)
    assert "fake_cube.mat" in msg and str(tmp_path / "empty") in msg
    assert "http://127.0.0.1:9/fake_cube.mat" in msg and "\n" not in msg


def test_wrong_key_lists_the_keys_present(tmp_path):
    write_fake_scene(tmp_path, cube_key="something_else")
    with pytest.raises(DatasetError, match=r"no variable 'cube'.*\['something_else'\]"):
        load_scene(fake_info(), tmp_path, download=False)


def test_shape_mismatch_between_cube_and_ground_truth(tmp_path):
    write_fake_scene(tmp_path, gt_shape=(6, 4))
    expected = r"cube shape \(6, 5, 4\) and ground truth shape \(6, 4\)"
    with pytest.raises(DatasetError, match=expected):
        load_scene(fake_info(), tmp_path, download=False)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_or_truncated_file(tmp_path, damage):
    write_fake_scene(tmp_path)
    path = tmp_path / "fake_cube.mat"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00junk" * 50)
    with pytest.raises(DatasetError, match="corrupt or truncated"):
        load_scene(fake_info(), tmp_path, download=False)


def test_checksum_mismatch_of_a_local_file(tmp_path):
    write_fake_scene(tmp_path)
    good = sha256_of(tmp_path / "fake_gt.mat")
    load_scene(fake_info(gt_sha=good), tmp_path, download=False)  # right sum passes
    with pytest.raises(DatasetError, match="checksum mismatch.*fake_gt.mat.*download it again"):
        load_scene(fake_info(gt_sha="0" * 64), tmp_path, download=False)


def test_git_blob_id_is_checked_when_no_sha256_is_known(tmp_path):
    import dataclasses

    write_fake_scene(tmp_path)
    info = fake_info()
    good = dataclasses.replace(
        info,
        cube=dataclasses.replace(info.cube, git_sha1=git_blob_sha1(tmp_path / "fake_cube.mat")),
    )
    load_scene(good, tmp_path, download=False)
    bad = dataclasses.replace(info, cube=dataclasses.replace(info.cube, git_sha1="1" * 40))
    with pytest.raises(DatasetError, match="checksum mismatch.*git blob sha1 .*expected 1111"):
        load_scene(bad, tmp_path, download=False)


def test_matlab_v73_file_asks_for_h5py(tmp_path, monkeypatch):
    write_fake_scene(tmp_path)
    # A v7.3 file is an HDF5 file whose superblock starts after a 512-byte MATLAB header.
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64".ljust(512, b" ")
    (tmp_path / "fake_cube.mat").write_bytes(header + b"\x89HDF\r\n\x1a\n" + b"\x00" * 64)
    monkeypatch.setattr(matfile_mod, "_h5py_available", lambda: False)
    with pytest.raises(DatasetError, match=r"v7\.3.*pip install h5py"):
        load_scene(fake_info(), tmp_path, download=False)


def test_labels_out_of_range_are_reported(tmp_path):
    import scipy.io

    write_fake_scene(tmp_path)
    scipy.io.savemat(tmp_path / "fake_gt.mat", {"gt": np.full((6, 5), 7, dtype=np.uint8)})
    with pytest.raises(DatasetError, match=r"labels 7\.\.7; expected 0\.\.3"):
        load_scene(fake_info(), tmp_path, download=False)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_pixels_are_refused_with_the_scene_and_their_count(tmp_path, bad):
    """A NaN pixel would make every loss NaN once training began: refuse it at load."""
    import scipy.io

    write_fake_scene(tmp_path)
    cube = np.random.default_rng(0).random((6, 5, 4))
    cube[2, 3, 1] = bad
    cube[4, 0, :] = bad  # one pixel, every band: still one pixel
    scipy.io.savemat(tmp_path / "fake_cube.mat", {"cube": cube})
    with pytest.raises(DatasetError) as err:
        load_scene(fake_info(), tmp_path, download=False)
    message = str(err.value)
    assert "fake" in message.lower() and "2 pixel(s) with NaN or infinite" in message
    assert "row 2, column 3" in message and "\n" not in message


def test_synthetic_scene_is_deterministic_and_configurable():
    a = make_synthetic_scene(20, 24, 10, 3, seed=5)
    b = make_synthetic_scene(20, 24, 10, 3, seed=5)
    c = make_synthetic_scene(20, 24, 10, 3, seed=6)
    np.testing.assert_array_equal(a.cube, b.cube)
    np.testing.assert_array_equal(a.gt, b.gt)
    assert not np.array_equal(a.cube, c.cube)
    assert a.cube.shape == (20, 24, 10) and a.num_classes == 3
    assert set(np.unique(a.gt)) == {0, 1, 2, 3}
    with pytest.raises(DatasetError, match="bands=1"):
        make_synthetic_scene(bands=1)


def test_synthetic_classes_are_distinct_but_overlapping_and_coherent():
    s = make_synthetic_scene(48, 48, 32, 4, seed=0)
    pix, lab = s.cube.reshape(-1, 32), s.gt.ravel()
    means = np.stack([pix[lab == k].mean(0) for k in range(1, 5)])
    spread = np.mean([pix[lab == k].std(0).mean() for k in range(1, 5)])
    gaps = [np.abs(means[i] - means[j]).mean() for i in range(4) for j in range(i + 1, 4)]
    # Classes differ on average, yet single-band values overlap (gap not >> spread).
    assert min(gaps) > 0.05 * spread and max(gaps) < 10 * spread
    # Spatial coherence: most labelled right-neighbours share the label.
    left, right = s.gt[:, :-1], s.gt[:, 1:]
    both = (left > 0) & (right > 0)
    assert (left[both] == right[both]).mean() > 0.9


def _nearest_mean_accuracy(cube: np.ndarray, gt: np.ndarray) -> float:
    split = random_split(gt, 0.2, seed=0)
    x, y = cube.reshape(-1, cube.shape[2]), gt.ravel()
    means = np.stack([x[split.train][y[split.train] == k].mean(0) for k in range(1, 5)])
    dist = ((x[split.test][:, None] - means[None]) ** 2).sum(-1)
    return float((dist.argmin(1) + 1 == y[split.test]).mean())


def test_synthetic_task_is_learnable_not_trivial_and_rewards_spatial_context():
    from scipy import ndimage

    s = make_synthetic_scene(seed=0)
    pixel = _nearest_mean_accuracy(s.cube, s.gt)
    neighbourhood = _nearest_mean_accuracy(ndimage.uniform_filter(s.cube, (3, 3, 1)), s.gt)
    assert 0.4 < pixel < 0.9  # well above chance (0.25), far from solved by one spectrum
    assert neighbourhood > pixel + 0.05  # patches carry information single pixels lack
