"""The hyperspectral workload plug-in, on the generated scene (fast, no data files)."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from hyperspectral import artifacts as hs_artifacts
from hyperspectral import workload as hs_workload
from hyperspectral.datasets import get_scene
from hyperspectral.metrics import confusion_matrix, metrics_from_confusion
from hyperspectral.models import MODELS, Ensemble
from hyperspectral.patches import PatchDataset, pad_cube
from hyperspectral.pipeline import canonical_scene
from hyperspectral.splits import load_split, save_split
from hyperspectral.workload import plugin
from lbtrain.workloads import (
    ArtifactContext,
    ConfusionEvaluator,
    Workload,
    available_workloads,
    get_plugin,
    keep_batch,
)

# hamida: random initial weights, a 5x5 patch and no PCA, so a build takes milliseconds.
FAST = {"dataset": "synthetic", "model": "hamida", "map": False}


def _build(seed: int = 0, **options) -> Workload:
    return plugin.make(seed, {**FAST, **options})


def _option(name: str):
    return next(o for o in plugin.options if o.name == name)


def test_options_and_their_defaults():
    assert plugin.defaults() == {
        "dataset": "indian_pines",
        "data_dir": None,
        "download": True,
        "model": "hybridsn",
        "patch_size": None,
        "pca": None,
        "split": "random",
        "train_ratio": 0.1,
        "train_per_class": None,
        "split_file": None,
        "dropout": None,
        "ensemble": 1,
        "ensemble_batches": "own",
        "map": True,
    }
    assert _option("download").type is bool and _option("map").type is bool
    assert _option("model").choices == tuple(MODELS)
    assert _option("split").choices == ("random", "fixed", "disjoint")
    assert _option("patch_size").flag == "--patch-size"
    assert all(o.help for o in plugin.options) and plugin.fetch is not None
    if "hyperspectral" not in available_workloads():
        pytest.skip("the package is not installed, so its entry point is not registered")
    assert get_plugin("hyperspectral") is plugin


@pytest.mark.parametrize(
    ("given", "registry"),
    [
        ("indian_pines", "IndianPines"),
        ("IndianPines", "IndianPines"),
        ("indianpines", "IndianPines"),
        ("INDIAN-PINES", "IndianPines"),
        ("pavia_u", "PaviaU"),
        ("PaviaU", "PaviaU"),
        ("salinas", "Salinas"),
        ("pavia_c", "PaviaC"),
        ("ksc", "KSC"),
        ("Botswana", "Botswana"),
        ("synthetic", "synthetic"),
    ],
)
def test_dataset_names_are_case_and_underscore_insensitive(given, registry):
    assert _option("dataset").type(given) == registry
    assert canonical_scene(given) == registry


def test_unknown_dataset_is_one_line_listing_the_valid_names():
    with pytest.raises(ValueError) as err:
        _option("dataset").type("pavia_x")
    message = str(err.value)
    assert "\n" not in message and "--dataset 'pavia_x'" in message
    assert "indian_pines" in message and "pavia_u" in message and "synthetic" in message


def test_converters_take_strings_and_toml_values():
    patch, pca, ratio = _option("patch_size").type, _option("pca").type, _option("train_ratio").type
    assert patch("25") == 25 and patch(7) == 7 and patch("none") is None
    assert pca("0") == 0 and pca(30) == 30
    assert ratio("0.25") == 0.25 and ratio(0.5) == 0.5
    assert _option("model").type("HybridSN") == "hybridsn"
    assert _option("dropout").type("0") == 0.0
    for convert, bad in ((patch, True), (patch, "x"), (patch, 5.0), (pca, "-1"), (ratio, "a")):
        with pytest.raises(ValueError, match="^--"):
            convert(bad)


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        ({"patch_size": 4}, ("--patch-size 4", "odd")),
        ({"patch_size": 49}, ("--patch-size 49", "48x48", "up to 47")),
        ({"train_ratio": 0}, ("--train-ratio 0", "(0, 1)")),
        ({"train_ratio": 1.5}, ("--train-ratio 1.5", "(0, 1)")),
        ({"pca": 40}, ("--pca 40", "32 bands")),
        ({"model": "hybridsn", "patch_size": 7}, ("--model hybridsn", "patch_size >= 9")),
        ({"split": "fixed"}, ("--split fixed", "--train-per-class")),
        # Ignored, yet recorded in config.toml as the run's recipe:
        ({"split": "disjoint", "train_per_class": 30}, ("--train-per-class 30", "--split fixed")),
        ({"train_per_class": 10}, ("--train-per-class 10", "--split random", "none")),
        ({"split_file": "/nonexistent/split.npz"}, ("--split-file", "no such file")),
        ({"ensemble": 0}, ("--ensemble 0", ">= 1")),
        # Once built until the kernel killed the job, with no message.
        (
            {"ensemble": 10**12},
            ("--ensemble 1,000,000,000,000", "GiB", "weights alone", "use far fewer members"),
        ),
        ({"split_file": ""}, ("--split-file ''", "is empty", "leave the option out")),
        ({"data_dir": " "}, ("--data-dir ' '", "is empty")),
        ({"ensemble": "two"}, ("--ensemble 'two'", "a whole number")),
        (
            {"ensemble_batches": "shared"},
            (
                "--ensemble-batches shared applies to an ensemble",
                "--ensemble is 1",
                "--ensemble N with N >= 2",
            ),
        ),
        # hu reads the centre pixel only: a larger patch would be silently ignored.
        ({"model": "hu", "patch_size": 5}, ("--patch-size 5", "--model hu", "hamida")),
    ],
)
def test_bad_options_are_one_line_errors_naming_the_flag(options, needles):
    with pytest.raises(ValueError) as err:
        _build(**options)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_a_disjoint_split_trains_every_class_and_names_those_it_cannot_test(tmp_path):
    """Issue 23: hybridsn's patch 25 on the 48x48 scene now splits; at 41 classes 3 and 4
    are too close to their own training pixels to test: they train, untested, and the run
    says so."""
    work = _build(split="disjoint", model="hybridsn")
    assert "in a guard band of 12 px)" in work.description
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        work = _build(split="disjoint", model="hamida", patch_size=41)
    named = [str(w.message) for w in caught]
    assert len(named) == 2 and all(" is not tested" in m for m in named), named
    assert "classes 3, 4 trained, not tested" in work.description
    work.artifacts(ArtifactContext(tmp_path, metrics_from_confusion(np.eye(4) * 2), None))
    counts = json.loads((tmp_path / "split.json").read_text())
    assert counts["kind"] == "disjoint" and counts["guard_radius"] == 20
    assert counts["train_only"] == [3, 4]
    for entry in counts["classes"]:
        untested = entry["class"] in (3, 4)
        assert entry["train"] > 0 and (entry["test"] == 0) == untested
        assert f"class {entry['class']} (" in " ".join(named) or not untested
    assert sum(c["train"] + c["test"] + c["guard"] for c in counts["classes"]) == sum(
        c["pixels"] for c in counts["classes"]
    )
    # Reusing the file says again which classes it does not test.
    with pytest.warns(UserWarning, match="classes 3, 4 train but are not tested"):
        _build(split_file=str(tmp_path / "split.npz"), patch_size=41)
    # A split file that leaves a class untested without saying so is still refused.
    split = load_split(tmp_path / "split.npz")
    split.meta = {**split.meta, "train_only": [4]}
    save_split(split, tmp_path / "quiet.npz")
    with pytest.raises(ValueError, match="no test pixels for class 3 ") as err:
        _build(split_file=str(tmp_path / "quiet.npz"), patch_size=41)
    assert "\n" not in str(err.value)


def test_build_is_consistent_with_the_scene_and_its_datasets():
    pytest.importorskip("matplotlib")
    work = _build(patch_size=7, map=True)
    scene = get_scene("synthetic")
    h, w = scene.shape
    assert work.name == "hyperspectral"
    assert work.sample_shape == (scene.bands, 7, 7)
    assert work.num_classes == scene.num_classes == 4
    x, y = work.train_set[0]
    assert tuple(x.shape) == work.sample_shape and 0 <= int(y) < work.num_classes
    labelled = int((scene.gt > 0).sum())
    assert len(work.train_set) + len(work.eval_set) == labelled
    assert len(work.predict_set) == h * w and work.predict_unit == w
    assert work.collate_fn is keep_batch
    assert isinstance(work.evaluator, ConfusionEvaluator)
    assert work.evaluator.headline == ("oa", "aa", "kappa")
    digest = work.signature.pop("split_digest")
    assert work.signature == {
        "dataset": "synthetic",
        "model": "hamida",
        "patch_size": 7,
        "bands": 32,
        "num_classes": 4,
        "split": "random",
    }
    # Another split (here: another seed) of the same scene has another fingerprint.
    other = _build(seed=1, patch_size=7, map=True)
    assert other.signature["split_digest"] != digest
    assert "synthetic" in work.description and "patch 7" in work.description
    logits = work.build_model()(work.train_set.batch(torch.arange(3))[0])
    assert logits.shape == (3, work.num_classes)
    assert work.loss_fn(logits, torch.zeros(3, dtype=torch.int64)).ndim == 0


def test_model_reference_sizes_apply_when_unset():
    # hybridsn's reference: 30 PCA components (fitted on training pixels) and 25x25 patches.
    assert _build(model="hybridsn").sample_shape == (30, 25, 25)


def test_an_ensemble_is_built_and_signed_only_when_asked_for():
    one = _build(model="hamida", patch_size=5)
    two = _build(model="hamida", patch_size=5, ensemble=2)
    assert not isinstance(one.build_model(), Ensemble) and "ensemble" not in one.signature
    assert isinstance(two.build_model(), Ensemble) and two.signature["ensemble"] == 2
    assert "model hamida x2," in two.description
    # By default each member reads its own batches: a training sample is a patch a member.
    x, y = two.train_set.__getitems__([0, 1, 2])
    channels = one.sample_shape[0]
    assert two.sample_shape == (2, channels, 5, 5) and x.shape == (3, 2, channels, 5, 5)
    assert y.shape == (3, 2) and two.signature["ensemble_batches"] == "own"
    assert two.build_model().own_batches and len(two.train_set) == len(one.train_set)
    # Shared batches: every member reads the one patch, as ensembles did before the option.
    shared = _build(model="hamida", patch_size=5, ensemble=2, ensemble_batches="shared")
    assert shared.sample_shape == one.sample_shape
    assert shared.signature["ensemble_batches"] == "shared"
    assert shared.train_set.__getitems__([0, 1, 2])[0].shape == (3, channels, 5, 5)
    assert not shared.build_model().own_batches


def test_pca_zero_keeps_the_bands():
    assert _build(model="hybridsn", pca=0, patch_size=9).sample_shape == (32, 9, 9)


def test_same_seed_same_split_and_batches_and_build_leaves_torch_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b = _build(seed=5), _build(seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(a.train_set.indices, b.train_set.indices)
    assert torch.equal(a.eval_set.indices, b.eval_set.indices)
    first = torch.arange(16)
    for (xa, ya), (xb, yb) in ((a.train_set.batch(first), b.train_set.batch(first)),):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a.train_set.indices, _build(seed=6).train_set.indices)


def test_build_model_does_not_reseed():
    work = _build()
    torch.manual_seed(7)
    one, other = work.build_model(), work.build_model()
    torch.manual_seed(7)
    again = work.build_model()
    weights = [next(m.parameters()) for m in (one, other, again)]
    assert torch.equal(weights[0], weights[2])  # the caller's seed decides the weights
    assert not torch.equal(weights[0], weights[1])  # and the factory does not reseed


def test_evaluator_matches_hyperspectral_metrics():
    evaluator = _build().get_evaluator()
    cm = np.array([[5, 1, 0, 0], [2, 3, 0, 0], [0, 0, 4, 0], [0, 0, 1, 2]])
    got, want = evaluator.summarize(cm), metrics_from_confusion(cm)
    for key in ("oa", "aa", "kappa"):
        assert got[key] == pytest.approx(want[key])
    rng = np.random.default_rng(0)
    targets = torch.as_tensor(rng.integers(0, 4, 50))
    logits = torch.as_tensor(rng.normal(size=(50, 4)))
    state = evaluator.new_state()
    evaluator.update(state, logits[:20], targets[:20])
    evaluator.update(state, logits[20:], targets[20:])
    expected = confusion_matrix(targets.numpy(), logits.argmax(1).numpy(), 4)
    np.testing.assert_array_equal(state, expected)


def test_artifacts_write_metrics_split_and_map(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    work = _build(map=True, ensemble=2)
    h, w = get_scene("synthetic").shape
    predictions = np.arange(h * w) % work.num_classes
    metrics = metrics_from_confusion(np.diag([3, 4, 5, 6]) + 1)
    ctx = ArtifactContext(tmp_path, metrics, predictions, title="hyperspectral, 1 rank")
    titles = []
    drawn = hs_artifacts.save_map
    monkeypatch.setattr(
        hs_artifacts, "save_map", lambda *a, **k: titles.append(k["title"]) or drawn(*a, **k)
    )
    written = work.artifacts(ctx)
    # The map names the scene and the model: the trainer's title names only the job.
    assert titles == [
        f"synthetic, hamida x2, patch 5 (hyperspectral, 1 rank): OA {100 * metrics['oa']:.2f}%  "
        f"AA {100 * metrics['aa']:.2f}%  kappa {metrics['kappa']:.4f}"
    ]
    names = ["map.png", "metrics.txt", "split.json", "split.npz"]
    assert sorted(p.name for p in written) == sorted(p.name for p in tmp_path.iterdir()) == names
    counts = json.loads((tmp_path / "split.json").read_text())
    assert counts["kind"] == "random" and counts["guard"] == 0
    assert counts["train"] == len(work.train_set) and counts["test"] == len(work.eval_set)
    assert [c["name"] for c in counts["classes"]] == list(get_scene("synthetic").class_names)
    text = (tmp_path / "metrics.txt").read_text()
    assert "class_1" in text and f"\nkappa {metrics['kappa']:.4f}\n" in text
    assert "x 100" not in text
    assert (tmp_path / "map.png").read_bytes()[:4] == b"\x89PNG"
    saved = load_split(tmp_path / "split.npz")
    np.testing.assert_array_equal(saved.train, work.train_set.indices.numpy())
    # The saved split is what --split-file reuses, even with another seed.
    reused = _build(seed=9, split_file=str(tmp_path / "split.npz"))
    assert torch.equal(reused.train_set.indices, work.train_set.indices)


def test_artifacts_without_map(tmp_path):
    work = _build()
    metrics = metrics_from_confusion(np.eye(4, dtype=np.int64) * 2)
    written = work.artifacts(ArtifactContext(tmp_path, metrics, np.zeros(48 * 48, np.int64)))
    assert sorted(p.name for p in written) == ["metrics.txt", "split.json", "split.npz"]
    assert work.predict_set is None  # nothing to predict the whole scene for


def test_fetch_checks_options_then_loads_registry_scenes_and_skips_synthetic(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(hs_workload, "load_scene", lambda *a, **k: calls.append((a, k)))
    plugin.fetch(**plugin.resolve_options({**FAST}))
    assert calls == []
    # Checked against the published 610x340 shape before anything is downloaded.
    with pytest.raises(ValueError, match="--patch-size 611"):
        plugin.fetch(**plugin.resolve_options({**FAST, "dataset": "pavia_u", "patch_size": 611}))
    assert calls == []
    # A mistyped --data-dir is refused before anything is read, not replaced by the cache.
    with pytest.raises(ValueError, match="--data-dir '.*typo' does not exist"):
        plugin.fetch(
            **plugin.resolve_options({**FAST, "dataset": "pavia_u", "data_dir": tmp_path / "typo"})
        )
    # The generated scene reads no files: a --data-dir there would be silently ignored.
    with pytest.raises(ValueError, match="--data-dir .* is not used by the synthetic scene"):
        plugin.fetch(**plugin.resolve_options({**FAST, "data_dir": str(tmp_path)}))
    assert calls == []
    plugin.fetch(**plugin.resolve_options({**FAST, "dataset": "pavia_u", "data_dir": tmp_path}))
    assert calls == [(("PaviaU", str(tmp_path)), {"download": True})]


def test_dataloader_with_getitems_and_keep_batch_equals_batch():
    rng = np.random.default_rng(0)
    padded = pad_cube(rng.normal(size=(6, 5, 3)).astype(np.float32), 3)
    labels = rng.integers(1, 4, (6, 5))
    data = PatchDataset(padded, rng.permutation(30)[:17], 3, 5, labels)
    sampler = BatchSampler(SequentialSampler(range(len(data))), batch_size=5, drop_last=False)
    batches = list(DataLoader(data, batch_sampler=sampler, collate_fn=keep_batch))
    assert len(batches) == 4
    for positions, (x, y) in zip(sampler, batches, strict=True):
        want_x, want_y = data.batch(torch.as_tensor(positions))
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
        assert x.shape == (len(positions), 3, 3, 3)
    x, y = data.__getitems__([])
    assert x.shape == (0, 3, 3, 3) and y.shape == (0,)


def test_the_map_counts_errors_on_the_splits_test_pixels_and_names_the_bands(monkeypatch, tmp_path):
    seen = {}

    def record(path, rgb, gt, prediction, class_names, **kwargs):
        seen.update(kwargs, rgb=rgb)
        path.write_bytes(b"png")
        return path

    monkeypatch.setattr(hs_artifacts, "save_map", record)
    work = _build(map=True)
    scene = get_scene("synthetic")
    metrics = metrics_from_confusion(np.eye(4, dtype=np.int64) * 2)
    work.artifacts(ArtifactContext(tmp_path, metrics, np.zeros(48 * 48, np.int64)))
    # The test pixels are the evaluation's, never the training pixels.
    assert np.array_equal(np.flatnonzero(seen["test"]), np.sort(work.eval_set.indices.numpy()))
    assert not seen["test"].ravel()[work.train_set.indices.numpy()].any()
    assert seen["bands"] == scene.rgb_bands
    np.testing.assert_array_equal(seen["rgb"], scene.cube[..., list(scene.rgb_bands)])


def test_map_without_matplotlib_is_one_line_before_training(monkeypatch, capsys, tmp_path):
    from lbtrain import SingleProcessCommunicator
    from lbtrain.cli.entry import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "run"
    argv = ["train", "--dataset", "synthetic", "--model", "hamida", "--epochs", "1"]
    code = main([*argv, "--threads", "1", "--out", str(out)], comm=SingleProcessCommunicator())
    stdout, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("lbtrain: error: "), err
    assert "pip install 'lbtrain[hyperspectral]'" in lines[0] and "--no-map" in lines[0]
    # Stopped while setting up: nothing profiled, trained or written.
    assert not any(out.rglob("*.pt")) and not (out / "profiles.json").exists()
    assert not (out / "metrics.json").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--scene", "indian_pines", "--dataset", "salinas"],
        ["--batch-size=32", "--global-batch", "64"],
    ],
)
def test_an_old_flag_beside_its_new_name_is_refused(argv, capsys):
    # argparse kept the later one without a word.
    from hyperspectral.cli import main

    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert "is the older name of" in err and "give one of them" in err, err


def test_a_split_file_overrides_a_recorded_train_per_class():
    # A fixed run's config.toml replayed with its split.npz (the docs' way to compare runs
    # on the same pixels) carries --train-per-class: the split file wins, as its help says.
    from hyperspectral.checks import check_split_options

    for split in ("fixed", "random"):
        check_split_options({"split_file": "run/split.npz", "split": split, "train_per_class": 30})
