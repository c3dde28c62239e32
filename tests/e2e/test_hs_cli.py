"""``python -m hyperspectral``, an alias of ``lbtrain train --workload hyperspectral``.

Run the way a user runs it, with the flags of the former single-process command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from hyperspectral.cli import PROG, main, translate_argv
from tests.fixtures.run_files import epoch_records

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


def _error_line(err: str) -> str:
    """The one error line of a failed run's stderr, after checking that it is the only one.

    lbtrain's own errors are that line alone; argparse's are followed by where help is.
    """
    assert "Traceback" not in err and err.endswith("\n"), err
    lines = err.splitlines()
    assert [line for line in lines if "error:" in line] == lines[:1], err
    if len(lines) == 2:
        assert lines[0].startswith("lbtrain train: error: "), err
        assert lines[1] == "see lbtrain train --help", err
    else:
        assert len(lines) == 1 and lines[0].startswith("lbtrain: error: "), err
    return lines[0]


def _trained_pixels(out: Path) -> tuple[int, int]:
    """(training, test) pixels of a finished run, from metrics.jsonl and metrics.json."""
    metrics = json.loads((out / "metrics.json").read_text())
    return epoch_records(out)[-1]["samples"], metrics["total"]


def test_help_documents_every_option_with_its_default():
    res = _run("train", "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: lbtrain train ")
    for flag in (
        "--dataset",
        "--data-dir",
        "--model",
        "--patch-size",
        "--pca",
        "--train-ratio",
        "--train-per-class",
        "--split",
        "--epochs",
        "--global-batch",
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
    assert "--download, --no-download" in res.stdout and "--map, --no-map" in res.stdout


def test_legacy_flags_are_translated_and_other_commands_refused(capsys):
    assert translate_argv(["--scene", "PaviaU", "--batch-size=8", "--out", "x"]) == [
        "--dataset",
        "PaviaU",
        "--global-batch=8",
        "--out",
        "x",
    ]
    assert translate_argv(["--scene=synthetic", "--batch-size", "4"]) == [
        "--dataset=synthetic",
        "--global-batch",
        "4",
    ]
    for argv in ([], ["evaluate"], ["--scene", "synthetic"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"usage: {PROG} train [OPTIONS]"), err


# Both short runs: one thread (beside the suite's other worker, two OpenMP threads spinning
# on two cores took 58 s here against 7.5 s for one), a short profile, one checkpoint at the end.
SHORT_RUN = ["--lr", "0.003", "--threads", "1", "--time-budget", "1", "--checkpoint-every", "0"]


def test_tiny_training_run_on_a_synthetic_scene(tmp_path, capsys):
    """In-process: the entry point itself runs as a program in the tests above and below."""
    out = tmp_path / "run"
    status = main(["train", "--scene", "synthetic", "--model", "hamida", "--patch-size", "3",
                   "--epochs", "15", "--batch-size", "32", "--train-ratio", "0.2", "--seed", "1",
                   *SHORT_RUN, "--out", str(out)])  # fmt: skip
    res = capsys.readouterr()
    assert status == 0, res.err + res.out
    assert "epoch 15/15" in res.out
    # The legacy flags reached lbtrain train under their new names.
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["global_batch"] == 32 and config["workload_options"]["dataset"] == "synthetic"
    metrics = json.loads((out / "metrics.json").read_text())
    # Learned something: far above the 4-class chance level.
    assert metrics["oa"] > 0.6 and len(metrics["per_class_accuracy"]) == 4
    assert (out / "metrics.txt").read_text().startswith("  #  class")
    assert (out / "map.png").read_bytes()[:4] == b"\x89PNG"
    train_pixels, test_pixels = _trained_pixels(out)
    with np.load(out / "split.npz") as split:
        assert split["train"].size == train_pixels and split["test"].size == test_pixels
    assert f"{train_pixels} train / {test_pixels} test pixels" in res.out


def test_short_run_on_real_indian_pines(tmp_path, capsys):
    """The real scene end to end: $LBTRAIN_DATA's .mat files when set, tensorly's copy else.
    In-process, as the synthetic run above."""
    out = tmp_path / "ip"
    status = main(["train", "--scene=IndianPines", "--model", "hu", "--epochs", "12",
                   "--batch-size=64", "--no-download", *SHORT_RUN, "--out", str(out)])  # fmt: skip
    res = capsys.readouterr()
    assert status == 0, res.err + res.out
    metrics = json.loads((out / "metrics.json").read_text())
    assert _trained_pixels(out) == (1025, 9224)
    assert len(metrics["per_class_accuracy"]) == 16 and "Stone-Steel-Towers" in res.out
    # A spectral-only model after 12 short epochs (about 60%): far above chance (1/16).
    assert metrics["oa"] > 0.5
    # The workload's first line names the data it read: "hyperspectral: IndianPines
    # (145, 145, 200) from SOURCE: 1025 train / 9224 test pixels, ...".
    first = next(line for line in res.out.splitlines() if line.startswith("hyperspectral:"))
    assert "1025 train / 9224 test pixels" in first
    env = os.environ.get("LBTRAIN_DATA")
    if env and (Path(env) / "Indian_pines_corrected.mat").is_file():
        assert f" from {Path(env)}: " in first, first
    else:
        assert "tensorly" in first.split(" from ", 1)[1], first
    assert (out / "map.png").stat().st_size > 20_000


def test_user_errors_exit_with_a_one_line_message(tmp_path, capsys):
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
    line = _error_line(res.stderr)
    assert line.startswith("lbtrain: error: PaviaU.mat for scene PaviaU not found in"), line
    assert main(["train", "--scene", "synthetic", "--model", "nope"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "--model 'nope' is unknown; choose one of hu, hamida, hybridsn, ssftt" in line, line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--patch-size", "4"], "--patch-size 4 is invalid; give an odd whole number >= 1"),
        (["--pca", "500"], "--pca 500 is more than the 32 bands of synthetic"),
        (["--threads", "0"], "argument --threads: 0 must be >= 1"),
        (["--split", "fixed"], "--split fixed needs --train-per-class N"),
        (["--split-file", "/no/split.npz"], "--split-file /no/split.npz: no such file"),
        (["--dropout", "1"], "--dropout 1 is out of range; give a number in [0, 1)"),
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
    assert message in _error_line(err), err


def test_warnings_are_one_line_and_a_saved_split_is_reused(tmp_path, capsys, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    common = ["train", "--scene", "synthetic", "--model", "hu", "--epochs", "2", "--no-map"]
    common += ["--threads", "1", "--time-budget", "1", "--quiet"]
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
    assert err.startswith("lbtrain: warning: class 1 (") and "UserWarning" not in err
    # In the command line's words: the flag, not the library's per_class=.
    assert "fewer than --train-per-class 2000;" in err.splitlines()[0], err
    assert all(line.startswith("lbtrain: warning: class ") for line in err.splitlines()), err
    # A different seed and split kind, but the split file wins: the same pixels are used.
    # (--plan: the first run's batch plan, so this run skips profiling.)
    # The split file named relative to the working directory: the run records where it is,
    # so a resume or --config from elsewhere reads the same file.
    monkeypatch.chdir(tmp_path)
    again = ["--split-file", "a/split.npz", "--plan", str(first / "plan.json")]
    assert main([*common, *again, "--seed", "9", "--out", str(second)]) == 0
    with np.load(first / "split.npz") as a, np.load(second / "split.npz") as b:
        np.testing.assert_array_equal(a["train"], b["train"])
        np.testing.assert_array_equal(a["test"], b["test"])
    config = tomllib.loads((second / "config.toml").read_text())
    assert config["workload_options"]["split_file"] == str(first / "split.npz")
