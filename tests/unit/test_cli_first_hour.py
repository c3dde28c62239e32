"""What a new user meets after the demo (issue 21), run in-process.

- A usage mistake in any verb is one line naming the flag, then where help is; printed once
  when the ranks are many.
- `config.toml` is a recipe: `--config` of a resumed run starts afresh, and lands on the
  weights the resumed run reached; the provenance is in summary.json; resuming says where
  it continues in one line.
- `lbtrain profile` takes the training workload's own options, and `train --profiles`
  refuses profiles of another model or sample shape in one line naming both.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from lbtrain import SingleProcessCommunicator
from lbtrain.cli.common import given_workload_options
from lbtrain.cli.entry import main
from lbtrain.cli.parser import build_parser
from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint
from lbtrain.workloads import WorkloadOption, WorkloadPlugin, register_workload, toy_workload
from tests.ranks import lbtrain_ranks


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv), comm=SingleProcessCommunicator())
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------
# Usage errors: one line and a hint, for every verb


MISTAKES = {
    "train": {
        "bad type": (["--epochs", "x"], "--epochs", "'x' is not a whole number"),
        "bad choice": (["--policy", "fair"], "--policy", "invalid choice: 'fair'"),
        "missing value": (["--epochs"], "--epochs", "expected one argument"),
        "unknown flag": (["--epoks", "3"], "--epoks", "unrecognized arguments"),
    },
    "profile": {
        "bad type": (["--time-budget", "soon"], "--time-budget", "'soon' is not a number"),
        "bad choice": (["--backend", "tcp"], "--backend", "invalid choice: 'tcp'"),
        "missing value": (["--output"], "--output", "expected one argument"),
        "unknown flag": (["--budget", "3"], "--budget", "unrecognized arguments"),
    },
    "balance-report": {
        "bad type": (["--global-batch", "many"], "--global-batch", "not a whole number"),
        "bad choice": (["--format", "html"], "--format", "invalid choice: 'html'"),
        "missing value": (["--profiles"], "--profiles", "expected one argument"),
        "unknown flag": (["--batchsize", "3"], "--batchsize", "unrecognized arguments"),
    },
    "env": {"unknown flag": (["--all"], "--all", "unrecognized arguments")},
    "show": {
        "missing value": ([], "RUN", "the following arguments are required"),
        "unknown flag": (["--epochs", "r"], "--epochs", "unrecognized arguments"),
    },
    "compare": {
        "bad choice": (["--format", "html", "r"], "--format", "invalid choice: 'html'"),
        "missing value": (["--format"], "--format", "expected one argument"),
        "unknown flag": (["--sort", "r"], "--sort", "unrecognized arguments"),
    },
}
CASES = [(verb, kind, *case) for verb, kinds in MISTAKES.items() for kind, case in kinds.items()]


@pytest.mark.parametrize(
    "verb,kind,args,flag,problem", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
def test_a_usage_mistake_is_one_line_and_a_hint(capsys, verb, kind, args, flag, problem):
    code, out, err = _cli(capsys, verb, *args)
    assert code == 2 and not out, (out, err)
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith(f"lbtrain {verb}: error: ") and flag in lines[0], err
    assert problem in lines[0], err
    assert lines[1] == f"see lbtrain {verb} --help", err


def test_an_unknown_verb_or_top_level_flag_points_at_the_top_help(capsys):
    for argv, needle in ((["trian"], "invalid choice: 'trian'"), (["--bogus"], "--bogus")):
        code, _, err = _cli(capsys, *argv)
        assert code == 2 and err.splitlines() == [
            err.splitlines()[0],
            "see lbtrain --help",
        ], err
        assert err.startswith("lbtrain: error: ") and needle in err, err


def test_a_usage_mistake_is_printed_once_by_many_ranks():
    job = lbtrain_ranks(2, "train", "--epochs", "x")
    assert job.codes == [2, 2], job.output()
    assert job.stderr.splitlines() == [
        "lbtrain train: error: argument --epochs: 'x' is not a whole number",
        "see lbtrain train --help",
    ], job.output()


def test_flags_are_spelt_out_not_abbreviated(capsys):
    code, _, err = _cli(capsys, "train", "--epoch", "3")
    assert code == 2 and "unrecognized arguments: --epoch 3" in err, err


def test_a_misspelt_workload_is_named_rather_than_its_options(capsys):
    code, _, err = _cli(capsys, "profile", "--workload", "hyperspectrl", "--model", "hamida")
    assert code == 2 and err.splitlines()[0].startswith("lbtrain profile: error: "), err
    assert "--workload 'hyperspectrl' is unknown" in err and "unrecognized" not in err, err


COLLIDING = WorkloadPlugin(
    build=lambda seed=0, **options: toy_workload(),
    options=(
        WorkloadOption("warmup", 7, "an option named like profile's own flag", type=int),
        WorkloadOption("width", 8, "an option no verb has", type=int),
    ),
)


def test_a_workload_option_named_like_a_verbs_flag_leaves_the_verb_its_flag(capsys):
    register_workload("colliding", COLLIDING)
    for verb in ("train", "profile", "balance-report"):
        parser = build_parser([verb, "--workload", "colliding"])  # no clash, no traceback
        args = parser.parse_args([verb, "--workload", "colliding", "--warmup", "3"])
        assert args.warmup == 3  # train: the workload's option; profile: its own flag
        args = parser.parse_args([verb, "--workload", "colliding", "--width", "4"])
        assert args.width == 4
    args = build_parser(["profile"]).parse_args(["profile", "--workload", "colliding"])
    assert given_workload_options(args, "colliding") == {}  # profile's --warmup is its own


def test_balance_report_refuses_workload_options_beside_a_profiles_file(capsys):
    profiles = str(Path(__file__).parents[1] / "fixtures" / "profiles_3ranks.json")
    code, _, err = _cli(capsys, "balance-report", "--profiles", profiles, "--model", "hamida")
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "--model describes the workload to profile now" in lines[0], lines


# ---------------------------------------------------------------------------------------
# config.toml as a recipe; provenance; the resume line

FAULTY = [
    "train", "--workload", "tests.fixtures.faulty:plugin", "--global-batch", "40",
    "--threads", "1", "--time-budget", "0.5",
]  # fmt: skip


def _final_weights(folder) -> dict[str, torch.Tensor]:
    return load_checkpoint(list_checkpoints(folder / "checkpoints")[-1])["model"]


def test_config_of_a_resumed_run_starts_afresh_and_reaches_the_same_weights(tmp_path, capsys):
    r1, r2, r3 = tmp_path / "r1", tmp_path / "r2", tmp_path / "r3"
    # A constant rate: a cosine schedule spans the epochs asked for, so two epochs then a
    # third are not three from the start; with it the resumed run is exactly a 3-epoch one.
    constant = ["--lr-schedule", "constant"]
    code, _, err = _cli(capsys, *FAULTY, *constant, "--epochs", "2", "--out", str(r1))
    assert code == 0, err
    written = sorted((r1 / "checkpoints").iterdir())
    code, out, err = _cli(capsys, *FAULTY, "--resume", str(r1), "--epochs", "3", "--out", str(r2))
    assert code == 0, err
    # One line: where it continues (epoch e of E, global step s) and what is left.
    steps = json.loads((r1 / "summary.json").read_text())["steps"]
    resumed = [line for line in out.splitlines() if line.startswith("resumed")]
    assert len(resumed) == 1 and "training 3 epochs" not in out, out
    assert f"epoch 3 of 3, global step {steps}; 1 epoch left" in resumed[0], resumed
    recipe = tomllib.loads((r2 / "config.toml").read_text())
    assert not {"resume", "out", "overwrite"} & set(recipe), recipe
    assert recipe["epochs"] == 3
    provenance = json.loads((r2 / "summary.json").read_text())["resumed_from"]
    assert provenance["epoch"] == 2 and provenance["global_step"] == steps, provenance
    assert provenance["checkpoint"].startswith(str(r1)), provenance

    code, out, err = _cli(capsys, "train", "--config", str(r2 / "config.toml"), "--out", str(r3))
    assert code == 0, err
    assert "resumed from" not in out and "training 3 epochs" in out, out
    assert json.loads((r3 / "summary.json").read_text())["resumed_from"] is None
    assert sorted((r1 / "checkpoints").iterdir()) == written  # r1 was left alone
    theirs, ours = _final_weights(r2), _final_weights(r3)
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)


# ---------------------------------------------------------------------------------------
# One workload from profile to train

SCENE = ["--dataset", "synthetic", "--pca", "0", "--no-map", "--threads", "1"]
PROFILE = ["--batch-sizes", "4,8", "--repeats", "2", "--warmup", "0", "--no-memory-cap"]


@pytest.fixture(scope="module")
def hamida_profiles(tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "hamida.json"
    argv = ["profile", *SCENE, *PROFILE, "--model", "hamida", "--patch-size", "5", "-o", str(path)]
    assert main(argv, comm=SingleProcessCommunicator()) == 0
    return path


def test_profile_times_the_training_workload_with_its_options(hamida_profiles):
    (profile,) = json.loads(hamida_profiles.read_text())["profiles"]
    assert profile["workload"] == "hyperspectral"
    assert profile["model"].startswith("HamidaEtAl (")
    assert profile["sample_shape"][-2:] == [5, 5]


def test_train_takes_profiles_of_its_model_and_refuses_another_in_one_line(
    hamida_profiles, tmp_path, capsys
):
    same = [*SCENE, "--model", "hamida", "--patch-size", "5", "--profiles", str(hamida_profiles)]
    code, out, err = _cli(capsys, "train", *same, "--epochs", "1", "--out", str(tmp_path / "ok"))
    assert code == 0, err
    assert "profiling" not in out.lower().split("wall time")[0], out  # no profiling of its own
    for args, ours in (
        (["--model", "hamida", "--patch-size", "7"], "with samples "),
        (["--model", "hu"], "Hu"),
    ):
        run = tmp_path / args[-1]
        code, out, err = _cli(
            capsys, "train", *SCENE, *args, "--profiles", str(hamida_profiles), "--out", str(run)
        )
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1, err
        assert f"--profiles '{hamida_profiles}'" in lines[0], lines
        assert "measured on HamidaEtAl (" in lines[0] and ours in lines[0], lines
        assert "x5x5" in lines[0], lines  # the profiled sample shape, named
        assert not run.exists()


class _BrokenEntryPoint:
    """An entry point whose package lacks a dependency, as an install without an extra."""

    def __init__(self, dist: str) -> None:
        self.name, self.value = "hyperspectral", "hyperspectral.workload:plugin"
        self.dist = type("Dist", (), {"name": dist})()

    def load(self):
        raise ModuleNotFoundError("No module named 'scipy'")


@pytest.mark.parametrize(
    "dist,fix",
    [("lbtrain", "pip install 'lbtrain[hyperspectral]'"), ("theirs", "fix or reinstall")],
)
def test_a_workload_missing_its_extra_says_which_extra_to_install(monkeypatch, capsys, dist, fix):
    monkeypatch.setattr("lbtrain.workloads.entry_points", lambda group: [_BrokenEntryPoint(dist)])
    code, _, err = _cli(capsys, "profile", "-o", "p.json")
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "No module named 'scipy'" in lines[0] and fix in lines[0], lines
