"""``python -m hyperspectral train`` run the way a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hyperspectral.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(
    *args: str, timeout: float = 120, cache: Path | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
        env.pop("LBTRAIN_DATA", None)
    return subprocess.run(
        [sys.executable, "-m", "hyperspectral", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_help_documents_every_option_with_its_default():
    res = _run("train", "--help")
    assert res.returncode == 0, res.stderr
    for flag in (
        "--scene",
        "--data-dir",
        "--model",
        "--patch-size",
        "--pca",
        "--train-ratio",
        "--train-per-class",
        "--split",
        "--epochs",
        "--batch-size",
        "--lr",
        "--seed",
        "--out",
        "--threads",
        "--dropout",
        "--no-map",
        "--no-download",
        "--split-file",
    ):
        assert flag in res.stdout, flag
    assert "(default: 64)" in res.stdout and "hybridsn" in res.stdout
    # On-off flags and None defaults would read "(default: True)" / "(default: None)".
    assert "(default: True)" not in res.stdout and "(default: None)" not in res.stdout


def test_tiny_training_run_on_a_synthetic_scene(tmp_path):
    out = tmp_path / "run"
    res = _run(
        "train",
        "--scene",
        "synthetic",
        "--model",
        "hamida",
        "--patch-size",
        "3",
        "--epochs",
        "15",
        "--batch-size",
        "32",
        "--lr",
        "0.003",
        "--threads",
        "1",
        "--train-ratio",
        "0.2",
        "--seed",
        "1",
        "--out",
        str(out),
    )
    assert res.returncode == 0, res.stderr + res.stdout
    assert "epoch  15/15" in res.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    # Learned something: far above the 4-class chance level.
    assert metrics["oa"] > 0.6 and len(metrics["per_class_accuracy"]) == 4
    assert (out / "metrics.txt").read_text().startswith("  #  class")
    assert (out / "map.png").read_bytes()[:4] == b"\x89PNG"
    with np.load(out / "split.npz") as split:
        assert split["train"].size == metrics["train_pixels"]


def test_short_run_on_real_indian_pines(tmp_path):
    """The real scene end to end: $LBTRAIN_DATA's .mat files when set, tensorly's copy else."""
    out = tmp_path / "ip"
    res = _run(
        "train",
        "--scene",
        "IndianPines",
        "--model",
        "hu",
        "--epochs",
        "20",
        "--batch-size",
        "64",
        "--lr",
        "0.003",
        "--threads",
        "2",
        "--no-download",
        "--out",
        str(out),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_pixels"] == 1025 and metrics["test_pixels"] == 9224
    assert len(metrics["per_class_accuracy"]) == 16 and "Stone-Steel-Towers" in res.stdout
    # A spectral-only model after 20 short epochs (about 64%): far above chance (1/16).
    assert metrics["oa"] > 0.5
    env = os.environ.get("LBTRAIN_DATA")
    if env and (Path(env) / "Indian_pines_corrected.mat").is_file():
        assert metrics["source"] == str(Path(env))
    else:
        assert "tensorly" in metrics["source"]
    assert (out / "map.png").stat().st_size > 20_000


def test_user_errors_exit_with_a_one_line_message(tmp_path):
    res = _run(
        "train",
        "--scene",
        "PaviaU",
        "--data-dir",
        str(tmp_path),
        "--no-download",
        "--out",
        str(tmp_path / "o"),
        cache=tmp_path / "xdg",
    )
    assert res.returncode == 2
    assert res.stderr.startswith("error: PaviaU.mat for scene PaviaU not found in")
    res = _run("train", "--scene", "synthetic", "--model", "nope")
    assert res.returncode == 2 and "invalid choice: 'nope'" in res.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--patch-size", "4"], "--patch-size 4 must be a positive odd number"),
        (["--pca", "500"], "pca_components=500 is out of range"),
        (["--threads", "0"], "threads=0 must be >= 1"),
        (["--split", "fixed"], "split 'fixed' needs per_class (--train-per-class)"),
        (["--split-file", "/nonexistent/split.npz"], "cannot read split file"),
        (["--dropout", "1"], "dropout=1.0 must be in [0, 1)"),
    ],
)
def test_bad_values_give_one_line_and_status_2(args, message, tmp_path, capsys):
    status = main(
        [
            "train",
            "--scene",
            "synthetic",
            "--model",
            "hu",
            "--epochs",
            "1",
            "--no-map",
            "--out",
            str(tmp_path),
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_warnings_are_one_line_and_a_saved_split_is_reused(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    common = ["train", "--scene", "synthetic", "--model", "hu", "--epochs", "2", "--no-map"]
    # The 48x48 synthetic scene has a few hundred pixels per class: 2000 caps them all.
    assert (
        main(
            [
                *common,
                "--split",
                "fixed",
                "--train-per-class",
                "2000",
                "--seed",
                "3",
                "--out",
                str(first),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert err.startswith("warning: class 1 has only") and "UserWarning" not in err
    # A different seed and split kind, but the split file wins: the same pixels are used.
    assert (
        main(
            [*common, "--split-file", str(first / "split.npz"), "--seed", "9", "--out", str(second)]
        )
        == 0
    )
    with np.load(first / "split.npz") as a, np.load(second / "split.npz") as b:
        np.testing.assert_array_equal(a["train"], b["train"])
        np.testing.assert_array_equal(a["test"], b["test"])
    metrics = json.loads((second / "metrics.json").read_text())
    assert metrics["config"]["split_file"] == str(first / "split.npz")
