"""Where `lbtrain train` (and `profile`) write: the folder named, never mixed with another run.

In-process with the tiny workload of tests/fixtures/faulty.py (about a second a run), and the
hyperspectral workload on its synthetic scene where its own files (split.npz, map.png) count.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from lbtrain import SingleProcessCommunicator, plan_batches
from lbtrain.cli.entry import main
from lbtrain.trainer.config import load_toml
from lbtrain.trainer.run_folder import hold_run_folder, release_run_folder

BASE = [
    "train", "--workload", "tests.fixtures.faulty:plugin", "--global-batch", "40",
    "--threads", "1", "--time-budget", "0.5", "--quiet", "--epochs", "1", "--no-curves",
]  # fmt: skip
SCENE = [
    "train", "--workload", "hyperspectral", "--dataset", "synthetic", "--model", "hu",
    "--global-batch", "64", "--threads", "1", "--time-budget", "0.5", "--quiet", "--epochs", "1",
]  # fmt: skip


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args), comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(code: int, err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_folder_that_is_not_empty_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "results"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    code, stdout, err = _run(capsys, *BASE, "--out", str(out))
    _one_error(code, err, f"--out '{out}'", "notes.txt", "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and not stdout


def test_overwrite_replaces_the_earlier_run_and_leaves_other_files(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = _run(capsys, *SCENE, "--out", str(out))
    assert code == 0, err
    assert (out / "map.png").is_file() and (out / "split.npz").is_file()
    (out / "notes.txt").write_text("mine\n")
    # As if the earlier run had gone further: a checkpoint this run will never write.
    (out / "checkpoints" / "step-000000999.pt").write_bytes(b"old")

    code, _, err = _run(capsys, *SCENE, "--out", str(out))
    _one_error(code, err, "already holds a run", "--resume", "--overwrite")

    # The new run draws no map: the old map.png must not stay beside its metrics.
    code, _, err = _run(capsys, *SCENE, "--out", str(out), "--overwrite", "--no-map", "--seed", "1")
    assert code == 0, err
    assert not (out / "map.png").exists()
    assert (out / "notes.txt").read_text() == "mine\n"
    assert (out / "split.npz").is_file() and (out / "metrics.txt").is_file()
    assert load_toml(out / "config.toml")["seed"] == 1
    assert "step-000000999.pt" not in [p.name for p in (out / "checkpoints").iterdir()]


def test_a_folder_another_run_is_writing_is_refused_before_any_work(tmp_path, capsys):
    """A resume (or an overwrite) of a run that is still going would write one folder from
    two processes: refused while the folder's lock is held, as a live run holds it."""
    out = tmp_path / "run"
    code, _, err = _run(capsys, *BASE, "--out", str(out))
    assert code == 0, err
    before = sorted(p.name for p in out.rglob("*"))
    lock = hold_run_folder(out, str(out))  # as the running process would
    try:
        for extra in (["--resume", str(out), "--epochs", "2"], ["--out", str(out), "--overwrite"]):
            code, stdout, err = _run(capsys, *BASE, *extra)
            _one_error(code, err, f"run folder '{out}' is in use", f"(pid {os.getpid()})", "--out")
            assert not stdout and sorted(p.name for p in out.rglob("*")) == before
    finally:
        release_run_folder(lock)
    code, _, err = _run(capsys, *BASE, "--resume", str(out), "--epochs", "2")
    assert code == 0, err


def test_a_lock_held_for_an_instant_is_waited_for_and_a_held_one_refused(tmp_path, monkeypatch):
    """`lbtrain show` (and another start's check) takes the lock for an instant: a run that
    starts then must try again, not be refused as if a run were writing there."""
    import fcntl

    from lbtrain.trainer import run_folder

    real, busy = fcntl.flock, []

    def flock(handle, operation):
        if operation & fcntl.LOCK_EX and busy and busy.pop():
            raise BlockingIOError(errno.EWOULDBLOCK, "held")
        return real(handle, operation)

    monkeypatch.setattr(run_folder.fcntl, "flock", flock)
    monkeypatch.setattr(run_folder.time, "sleep", lambda seconds: None)
    busy[:] = [True] * (run_folder.LOCK_TRIES - 1)  # held for all tries but the last
    release_run_folder(hold_run_folder(tmp_path, str(tmp_path)))
    assert not busy
    busy[:] = [True] * run_folder.LOCK_TRIES  # held throughout: a run is writing there
    with pytest.raises(ValueError, match="is in use"):
        hold_run_folder(tmp_path, str(tmp_path))


def test_a_plan_file_records_its_policy_and_keeps_a_min_batch_it_meets(tmp_path, capsys):
    """Re-plans follow the plan's own policy and smallest batch: config.toml says so, and a
    --min-batch the plan meets is carried into it, so that re-plans keep it too."""
    plan = tmp_path / "plan.json"
    plan.write_text(plan_batches([1.0], 40, "proportional").to_json())
    out = tmp_path / "run"
    code, _, err = _run(capsys, *BASE, "--plan", str(plan), "--min-batch", "3", "--out", str(out))
    assert code == 0, err
    recipe = load_toml(out / "config.toml")
    assert (recipe["policy"], recipe["min_batch"]) == ("proportional", 3)
    assert json.loads((out / "plan.json").read_text())["min_batch"] == 3
    code, _, err = _run(capsys, *BASE, "--plan", str(plan), "--policy", "equal",
                        "--out", str(tmp_path / "other"))  # fmt: skip
    _one_error(code, err, "made by the proportional policy", "not --policy 'equal'")


def test_a_trace_in_a_subfolder_of_the_run_is_written_there(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = _run(capsys, *BASE, "--trace", "traces/step.json", "--out", str(out))
    assert code == 0, err
    assert json.loads((out / "traces" / "step.json").read_text())["traceEvents"]


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    """A Slurm array starts its tasks in one second, in one folder: each default folder is
    made as it is named, so the second run takes the next name."""
    from datetime import datetime

    from lbtrain.trainer.config import TrainConfig
    from lbtrain.trainer.run_folder import discard_reserved, prepare_out

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 26, 14, 0, 0)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("lbtrain.trainer.run_folder.datetime", Frozen)
    first, _ = prepare_out(TrainConfig(), None)
    second, _ = prepare_out(TrainConfig(), None)
    assert (first, second) == ("runs/20261126-140000", "runs/20261126-140000.1")
    assert (tmp_path / first).is_dir() and (tmp_path / second).is_dir()
    discard_reserved()  # the second, as a run refused while it starts would
    assert not (tmp_path / second).exists() and (tmp_path / first).is_dir()


def test_a_run_refused_after_naming_its_default_folder_leaves_none(tmp_path, capsys, monkeypatch):
    profiles = tmp_path / "p.json"
    monkeypatch.chdir(tmp_path)
    made = ["profile", "--workload", "tests.fixtures.faulty:plugin", "--threads", "1"]
    code, _, err = _run(capsys, *made, "--time-budget", "0.5", "--output", str(profiles))
    assert code == 0, err
    data = json.loads(profiles.read_text())
    data["profiles"][0]["slowdown"] = 4.0  # refused once read, after the folder was named
    profiles.write_text(json.dumps(data))
    code, _, err = _run(capsys, *BASE, "--profiles", str(profiles))
    _one_error(code, err, "emulated slowdown of 4")
    assert not (tmp_path / "runs").exists()


def test_a_file_system_without_locks_warns_and_trains(tmp_path, capsys, monkeypatch):
    """NFS without lockd or Lustre mounted noflock: flock fails with ENOLCK or ENOSYS. The
    run goes on unlocked, as before there was a lock, and says so."""

    def no_locks(*_):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr("lbtrain.trainer.run_folder.fcntl.flock", no_locks)
    out = tmp_path / "run"
    code, _, err = _run(capsys, *BASE, "--out", str(out))
    assert code == 0, err
    assert f"lbtrain: warning: run folder '{out}' cannot be locked" in err, err
    assert (out / "summary.json").is_file()


def test_an_overwriting_run_that_fails_leaves_none_of_the_old_run(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = _run(capsys, *BASE, "--out", str(out))
    assert code == 0, err
    assert (out / "metrics.json").exists()
    code, _, err = _run(
        capsys, *BASE, "--out", str(out), "--overwrite", "--fault", "nan", "--fault-step", "2"
    )
    assert code == 1 and "loss" in err, err
    # The old metrics are gone: nobody can take them for this run's.
    assert not (out / "metrics.json").exists() and not (out / "summary.json").exists()
    assert (out / "config.toml").exists()


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (lambda tmp: str(tmp / "f" / "run"), ("cannot be written", "a file, not a folder")),
        (lambda tmp: str(tmp / ("x" * 300)), ("cannot be written", "shorter name")),
        (lambda tmp: "", ("--out ''", "name one")),
        (lambda tmp: str(tmp / "f"), ("is a file, not a folder",)),
    ],
    ids=["under-a-file", "name-too-long", "empty", "a-file"],
)
def test_an_out_that_cannot_be_a_folder_is_one_line_naming_it(tmp_path, capsys, make, needles):
    (tmp_path / "f").write_text("")
    given = make(tmp_path)
    code, stdout, err = _run(capsys, *BASE, "--out", given)
    _one_error(code, err, "--out", *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"] and not stdout


def test_a_read_only_out_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: have the check see what a user would
        monkeypatch.setattr("lbtrain.trainer.run_folder.os.access", lambda *a, **k: False)
    try:
        code, _, err = _run(capsys, *BASE, "--out", str(folder))
    finally:
        folder.chmod(0o700)
    _one_error(code, err, f"--out '{folder}'", "not writable")
    assert not list(folder.iterdir())


def _disk_full_for(stem: str, monkeypatch) -> None:
    """Make every atomic write of a file whose name starts with `stem` fail: a full disk."""
    import lbtrain.outputs as outputs

    real = outputs.tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        if kwargs.get("prefix", "").startswith(f".{stem}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(outputs.tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize(
    ("stem", "written"),
    [("metrics", "metrics.json"), ("config", "config.toml"), ("step-", "checkpoints/step-")],
)
def test_a_write_failing_mid_run_names_the_option_the_real_file_and_a_fix(
    tmp_path, capsys, monkeypatch, stem, written
):
    out = tmp_path / "run"
    _disk_full_for(stem, monkeypatch)
    code, _, err = _run(capsys, *BASE, "--out", str(out))
    line = _one_error(code, err, f"--out '{out}' cannot be written", "No space left on device")
    assert f"{out}/{written}" in line and ".tmp" not in line and "free some space" in line, line


def test_profile_output_failing_names_its_option(tmp_path, capsys, monkeypatch):
    _disk_full_for("profiles", monkeypatch)
    target = tmp_path / "profiles.json"
    code, _, err = _run(
        capsys, "profile", "--workload", "tests.fixtures.faulty:plugin", "--threads", "1",
        "--time-budget", "0.5", "--output", str(target),
    )  # fmt: skip
    _one_error(code, err, f"--output '{target}' cannot be written", "No space left on device")
    assert not target.exists()
