"""`lbtrain balance-report` and `profile` refusals and reports, run in-process.

The command line's `main` with a one-rank communicator: what a user sees (exit status, one
line on stderr, nothing on stdout) without starting a program that imports torch again.
tests/e2e/test_lbtrain_cli.py runs the installed program for what needs one (pipes, mpiexec).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lbtrain import SingleProcessCommunicator
from lbtrain.cli.entry import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "profiles_3ranks.json"
GPU_CPU = ROOT / "tests" / "fixtures" / "profiles_gpu_cpu.json"


def _cli(capsys, argv: list[str]) -> SimpleNamespace:
    """`lbtrain argv...` in this process: its status and what it printed."""
    code = main(argv, comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def test_balance_report_from_a_profiles_file(capsys):
    result = _cli(capsys, ["balance-report", "--profiles", str(FIXTURE),
                           "--global-batch", "300", "--format", "json"])  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # T* = (B + sum alpha/beta) / sum(1/beta), in ms: every rank's share is positive.
    t_star = (300 + 10 / 0.9 + 30 / 1.7 + 40 / 3.6) / (1 / 0.9 + 1 / 1.7 + 1 / 3.6) * 1e-3
    assert data["ideal"]["step"] == pytest.approx(t_star)
    assert data["notes"] == [] and "throughput_ratio" not in data
    cost = data["policies"]["cost"]
    assert [r["batch_size"] for r in cost["ranks"]] == [180, 84, 36]
    assert cost["predicted_step_time"] == pytest.approx(0.1728)
    assert cost["efficiency"] == pytest.approx(t_star / 0.1728)
    table = _cli(capsys, ["balance-report", "--profiles", str(FIXTURE)])
    assert table.returncode == 0, table.stderr
    assert "policy cost" in table.stdout and "speedup vs equal" in table.stdout
    assert "ratio" not in table.stdout


def test_balance_report_leaves_out_ranks_whose_fixed_cost_outlasts_the_step(capsys):
    base = ["balance-report", "--profiles", str(GPU_CPU)]
    table = _cli(capsys, [*base, "--global-batch", "1024"])
    assert table.returncode == 0, table.stderr
    assert "note: ranks 1, 2, 3 get no samples" in table.stdout
    assert "ratio" not in table.stdout
    # --min-batch 1 turns zero shares off; the note says what they would save.
    result = _cli(capsys, [*base, "--global-batch", "1024", "--min-batch", "1", "--format", "json"])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    cost = data["policies"]["cost"]
    assert [r["batch_size"] for r in cost["ranks"]] == [1021, 1, 1, 1]
    assert cost["predicted_step_time"] == pytest.approx(2.6e-3 + 65e-6)  # rank 3, one sample
    assert all(p["efficiency"] <= 1 for p in data["policies"].values())
    (note,) = data["notes"]
    assert "ranks 1, 2, 3 could get no samples" in note and "--min-batch 0" in note
    # A library error names the flags here, not the library's parameters.
    small = _cli(capsys, [*base, "--global-batch", "3"])
    assert small.returncode == 2
    assert "--global-batch 3" in small.stderr and "--min-batch 0" in small.stderr
    assert "min_batch=" not in small.stderr and "Traceback" not in small.stderr


def test_missing_profiles_file_is_one_line_and_exit_2(capsys, tmp_path):
    missing = tmp_path / "nope.json"
    result = _cli(capsys, ["balance-report", "--profiles", str(missing)])
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and str(missing) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("plot", "needle"),
    [
        ("{tmp}", "is a folder; name an image file in it"),
        ("{tmp}/report", "has no extension"),
        ("{tmp}/report.xyz", "has extension .xyz"),
        ("{tmp}/missing/report.png", "does not exist; create it first"),
    ],
)
def test_a_plot_path_that_cannot_be_the_named_image_is_refused_before_any_work(
    capsys, tmp_path, plot, needle
):
    plot = plot.format(tmp=tmp_path)
    result = _cli(capsys, ["balance-report", "--profiles", str(FIXTURE),
                   "--plot", plot])  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""  # refused before the report, not after it
    assert needle in result.stderr and result.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written anywhere


def test_min_batch_too_large_is_refused_before_profiling(capsys):
    result = _cli(capsys, ["balance-report", "--min-batch", "600",
                   "--global-batch", "512"])  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--min-batch 600 on 1 rank needs --global-batch >= 600" in result.stderr
    assert "profil" not in result.stdout.lower()  # no profiling output came first


def test_profile_output_that_is_a_folder_is_refused_before_profiling(capsys, tmp_path):
    result = _cli(capsys, ["profile", "--output", str(tmp_path)])
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"--output {str(tmp_path)!r} is a folder" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""  # no profiling table
    assert list(tmp_path.iterdir()) == []  # no temporary file left either


def test_reference_batch_with_a_profiles_file_is_refused_not_ignored(capsys):
    result = _cli(capsys, ["balance-report", "--profiles", str(FIXTURE),
                   "--reference-batch", "32"])  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--reference-batch 32 applies only when profiling now" in result.stderr
    assert result.stdout == ""


def test_profiling_flags_with_a_profiles_file_are_refused_not_ignored(capsys):
    """The file's ranks ran at their own slowdowns: a new --emulate-slowdown would not apply."""
    result = _cli(capsys, ["balance-report", "--profiles", str(FIXTURE),
                   "--emulate-slowdown", "1,2", "--time-budget", "3"])  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--emulate-slowdown --time-budget shape profiling now" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    # The defaults, given or not, change nothing: the file is read as before.
    result = _cli(capsys, ["balance-report", "--profiles", str(FIXTURE), "--time-budget", "10"])
    assert result.returncode == 0, result.stdout + result.stderr
    # --seed seeds only the batches profiling would draw.
    result = _cli(capsys, ["balance-report", "--profiles", str(FIXTURE), "--seed", "9"])
    assert result.returncode == 2 and "--seed shapes profiling now" in result.stderr


def test_a_workload_beside_a_profiles_file_is_refused_not_ignored(capsys):
    """The report is of the file's profiles: a --workload names what profiling now would
    time, as --model does."""
    result = _cli(capsys, ["balance-report", "--profiles", str(FIXTURE), "--workload", "toy"])
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--workload shapes profiling now" in result.stderr and result.stdout == ""
