"""The `lbtrain` command line in-process: help texts, user errors, report and env output."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import pytest

from lbtrain import SingleProcessCommunicator
from lbtrain.cli.entry import main
from lbtrain.cli.parser import build_parser

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles_3ranks.json"
VERBS = ("train", "profile", "balance-report", "env", "what-if")


def run(argv, capsys):
    code = main(argv, comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    return code, out, err


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("verb", VERBS)
def test_every_option_is_explained_with_its_default(verb, capsys):
    with pytest.raises(SystemExit) as info:
        main([verb, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    parser = _subparsers(build_parser())[verb]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{verb} {action.option_strings} has no help"
        assert "(default:" in action.help, f"{verb} {action.option_strings} hides its default"
        assert action.option_strings[0] in text
    # store_true flags state what happens without them, not a bare "(default: False/True)".
    assert "(default: False)" not in text and "(default: True)" not in text


def test_balance_report_help_names_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["balance-report", "--help"])
    # argparse wraps lines, also after a hyphen ("patch-" / "cnn").
    text = re.sub(r"-\s+", "-", " ".join(capsys.readouterr().out.split()))
    for needle in (
        "(default: 1024)",
        "(default: all)",
        "(default: table)",
        "(default: hyperspectral)",
        "(default: auto)",
        "(default: 10.0)",
        "(default: find the cap)",
    ):
        assert needle in text, needle


def test_no_command_prints_usage_and_fails(capsys):
    code, _, err = run([], capsys)
    assert code == 2 and "usage: lbtrain" in err


def test_report_from_fixture_in_every_format(capsys, tmp_path):
    code, out, err = run(
        ["balance-report", "--profiles", str(FIXTURE), "--global-batch", "300", "--format", "json"],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["policies"]["cost"]["ranks"][2]["batch_size"] == 36
    assert data["policies"]["proportional"]["speedup_over_equal"] == pytest.approx(0.4 / 0.1948)
    code, out, _ = run(
        [
            "balance-report",
            "--profiles",
            str(FIXTURE),
            "--global-batch",
            "300",
            "--policy",
            "proportional",
            "--format",
            "markdown",
        ],
        capsys,
    )
    assert code == 0 and "### policy proportional" in out and "### policy cost" not in out
    plot = tmp_path / "r.png"
    code, out, _ = run(
        [
            "balance-report",
            "--profiles",
            str(FIXTURE),
            "--global-batch",
            "300",
            "--plot",
            str(plot),
        ],
        capsys,
    )
    assert code == 0 and f"plot written to {plot}" in out
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_is_a_one_line_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run(
        ["balance-report", "--profiles", str(FIXTURE), "--plot", str(tmp_path / "r.png")],
        capsys,
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--plot needs matplotlib" in err and "pip install" in err


def _one_line_error(code, err, *needles):
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lbtrain: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        (None, ("does not exist", "lbtrain profile")),
        ("{oops", ("is not valid JSON", "regenerate")),
        (
            '{"format": "lbtrain-profiles", "version": 1, "world_size": 1, "profiles": [{}]}',
            ("profiles[0] is invalid", "regenerate"),
        ),
    ],
)
def test_bad_profile_files(content, needles, capsys, tmp_path):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    code, _, err = run(["balance-report", "--profiles", str(path)], capsys)
    _one_line_error(code, err, str(path), *needles)


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--devices", "tpu"], ("--devices", "unknown device 'tpu'", "auto")),
        (["--devices", "cuda:3"], ("cuda:3", "--devices cpu or auto")),
        (["--devices", "cuda"], ("CUDA is not available",)),
        (["--emulate-slowdown", "1,2"], ("--emulate-slowdown", "2 factors", "the job has 1 rank;")),
        (["--emulate-slowdown", "0"], ("--emulate-slowdown", "not positive")),
        (["--emulate-slowdown", "-1"], ("--emulate-slowdown", "not positive")),
        (["--threads", "100000000"], ("--threads 100,000,000", "at most 4,096")),
        # One rung fits no line: alpha came out 0, and cost planned as proportional does.
        (["--batch-sizes", "16"], ("--batch-sizes 16 is one size", "--batch-sizes 16,32")),
        (["--workload", "nosuch"], ("--workload 'nosuch' is unknown", "patch-cnn")),
    ],
)
def test_bad_profiling_options_fail_before_profiling(argv, needles, capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    output = tmp_path / "p.json"
    code, _, err = run(["profile", "-o", str(output), *argv], capsys)
    _one_line_error(code, err, *needles)
    assert not output.exists()


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["profile", "-o", "{missing}/p.json"], ("--output", "does not exist")),
        (["balance-report", "--save-profiles", "{missing}/p.json"], ("--save-profiles",)),
        (["balance-report", "--plot", "{missing}/r.png"], ("--plot", "does not exist")),
        (["profile", "-o", ""], ("--output ''", "is empty")),
        (["profile", "-o", "{long}.json"], ("--output", "File name too long", "shorter name")),
        (["balance-report", "--plot", "{long}.png"], ("--plot", "shorter name")),
        (["balance-report", "--save-profiles", "{long}.json"], ("--save-profiles", "shorter")),
        (["profile", "-o", "{file}/p.json"], ("--output", "is a file, not a folder")),
        (
            ["balance-report", "--plot", "{same}", "--save-profiles", "./{same}"],
            ("--plot", "--save-profiles", "name the same file"),
        ),
    ],
)
def test_unwritable_outputs_fail_before_profiling(argv, needles, capsys, monkeypatch, tmp_path):
    # Every profile is taken there (the trainer, `lbtrain profile`, balance-report, plan_for).
    from lbtrain.profiling import measured_plan

    def must_not_profile(*args, **kwargs):
        raise AssertionError("profiled although the output cannot be written")

    monkeypatch.setattr(measured_plan, "profile_all", must_not_profile)
    missing = tmp_path / "no-such-folder"
    (tmp_path / "file").write_text("")
    names = {"missing": missing, "long": tmp_path / ("x" * 300), "file": tmp_path / "file",
             "same": "same.png"}  # fmt: skip
    monkeypatch.chdir(tmp_path)
    code, _, err = run([arg.format(**names) for arg in argv], capsys)
    _one_line_error(code, err, *needles)


def test_save_profiles_beside_profiles_is_refused_not_ignored(capsys, tmp_path):
    saved = tmp_path / "again.json"
    code, out, err = run(
        ["balance-report", "--profiles", str(FIXTURE), "--save-profiles", str(saved)], capsys
    )
    _one_line_error(code, err, "--save-profiles", "drop --save-profiles")
    assert not saved.exists() and not out


def test_cuda_index_beyond_two_gpus(capsys, monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    code, _, err = run(["profile", "-o", str(tmp_path / "p.json"), "--devices", "cuda:3"], capsys)
    _one_line_error(code, err, "cuda:3", "2 CUDA device(s)")


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["balance-report", "--global-batch", "0"], ("--global-batch", "must be >= 1")),
        # Once silently "not given" (an unset variable): no profiles saved, or profiling
        # where a file was meant, or no plot.
        (["balance-report", "--save-profiles", ""], ("--save-profiles: ''", "is empty")),
        (["balance-report", "--profiles", " "], ("--profiles: ' '", "is empty")),
        (["what-if", "--cluster", "2x h100", "--plot", ""], ("--plot: ''", "is empty")),
    ],
)
def test_argument_type_errors_name_the_option(argv, needles, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert all(needle in err for needle in needles) and "Traceback" not in err, err


def test_profile_writes_the_file_single_process(capsys, tmp_path):
    output = tmp_path / "p.json"
    code, out, err = run(
        [
            "profile",
            "-o",
            str(output),
            "--workload",
            "toy",
            "--batch-sizes",
            "8,16",
            "--time-budget",
            "0.5",
            "--repeats",
            "3",
            "--threads",
            "1",
            "--no-memory-cap",
        ],
        capsys,
    )
    assert code == 0, err
    data = json.loads(output.read_text())
    assert data["world_size"] == 1
    (profile,) = data["profiles"]
    assert profile["batch_sizes"] == [8, 16] and profile["threads"] == 1
    assert profile["workload"] == "toy" and profile["reference_batch"] == 16
    assert profile["cap_source"] == "disabled"
    assert f"wrote 1 profiles to {output}" in out


def test_env_prints_what_a_bug_report_needs(capsys):
    code, out, _ = run(["env"], capsys)
    assert code == 0
    for needle in (
        "lbtrain:",
        "torch:",
        "mpi4py:",
        "MPI library:",
        "world size:",
        "rank 0:",
        "default threads",
        "CUDA available:",
    ):
        assert needle in out, needle


def test_ctrl_c_before_a_run_starts_is_one_line_and_status_130(monkeypatch, capsys):
    """While torch imports or arguments parse, no run has its own handler yet."""
    from lbtrain.cli import entry

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(entry, "_run", interrupted)
    assert entry.main() == 130
    assert capsys.readouterr().err == "lbtrain: interrupted\n"


def test_a_full_standard_output_is_one_line_saying_so(capsys, monkeypatch):
    import errno
    import io

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sys, "stdout", Full())
    code = main(["balance-report", "--profiles", str(FIXTURE)], comm=SingleProcessCommunicator())
    err = capsys.readouterr().err
    _one_line_error(code, err, "standard output cannot be written", "No space left on device")


def test_an_unknown_key_in_a_config_file_lists_the_keys_as_a_file_spells_them(capsys, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("foo = 3\nglobal_batch = 32\n", encoding="utf-8")
    code, out, err = run(["train", "--config", str(config)], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert "unknown setting(s) foo" in line
    keys = line.split("a config file takes the keys ")[1]
    assert "global_batch" in keys and "time_budget" in keys and "[workload_options]" in keys
    assert "--" not in keys  # snake case, as in the file: not the flags' names


@pytest.mark.parametrize("seed", ["-1", "8589934592", '"7"'])
def test_a_config_files_seed_is_checked_as_the_flag_is(capsys, tmp_path, seed):
    """--seed takes 0 to 2^32 - 1; a file's seed above went through, one below failed in
    numpy with a line that named neither the setting nor the file."""
    config = tmp_path / "run.toml"
    config.write_text(f"seed = {seed}\nglobal_batch = 32\n", encoding="utf-8")
    code, out, err = run(["train", "--config", str(config)], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert f"in {config} must be a whole number from 0 to 4294967295" in line, line


def test_help_of_a_workload_that_does_not_load_says_why_its_options_are_missing(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--workload", "no_such_module_here:workload", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "workload 'no_such_module_here:workload': not loaded, so its options are not" in text
    assert "No module named 'no_such_module_here'" in text
