"""`lbtrain train` under mpiexec when things go wrong: failures, kills, signals, bad input.

Every job runs the console script as a user does (``mpiexec -n N lbtrain train ...``) with
the fault-injecting workload of tests/fixtures/faulty.py, and under a timeout that kills
mpiexec's process group and every rank the job announced, so a hang fails the test instead
of freezing the suite. Hydra starts each rank in a session of its own, so a signal sent to
mpiexec's process group reaches mpiexec alone, which forwards SIGINT to the ranks (what a
user's Ctrl-C does); a signal for one rank goes to that rank's pid.

Most jobs use a plan file instead of profiling: it saves time and keeps the batches fixed.
With 200 training samples and a global batch of 40, an epoch is 5 steps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from lbtrain.balancer import plan_batches
from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint
from lbtrain.trainer.config import load_toml
from tests.mpi.launch import REPO, lbtrain_command, mpiexec_path

FAULTY = "tests.fixtures.faulty:plugin"
BATCH = 40  # 200 training samples: 5 steps per epoch
# A schedule that depends on the step alone, not on --epochs, so a run stopped after epoch
# 2 and extended to 4 follows the same rates as a run of 4 epochs in one go; a lost
# scheduler state would still show.
SCHEDULE = ("--lr-schedule", "step", "--lr-step-epochs", "1", "--lr-gamma", "0.5")


def _plan(folder: Path, throughputs: list[float]) -> Path:
    path = folder / f"plan-{len(throughputs)}.json"
    path.write_text(plan_batches(throughputs, BATCH, "proportional").to_json())
    return path


def _faulty(*args: str) -> list[str]:
    # --replan off: resumed runs are compared bit for bit, and a re-plan (timing-driven)
    # would split the batches differently, which changes the float rounding. --min-batch 1:
    # a fault injected on a rank fires only if that rank computes, and on this sub-ms
    # workload `cost` may well leave a rank without samples.
    return [
        "--workload", FAULTY, "--global-batch", str(BATCH), "--threads", "1", "--replan",
        "off", "--min-batch", "1", *args,
    ]  # fmt: skip


class Job:
    """`mpiexec -n ranks lbtrain VERB args` started in a new session, output to files."""

    def __init__(
        self,
        folder: Path,
        ranks: int,
        args: list[str],
        pid_dir: Path | None = None,
        verb: str = "train",
    ):
        self.pid_dir = pid_dir
        folder.mkdir(parents=True, exist_ok=True)
        self.stdout_path = folder / f"stdout-{time.monotonic_ns()}.txt"
        self.stderr_path = self.stdout_path.with_name("stderr" + self.stdout_path.name[6:])
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        command = [mpiexec_path(), "-n", str(ranks), *lbtrain_command(), verb, *args]
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=err, env=env, cwd=folder, start_new_session=True
            )
        self.command = command

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def rank_pids(self) -> dict[int, int]:
        """Pids the ranks wrote into pid_dir (the faulty workload's pid_dir option)."""
        if self.pid_dir is None:
            return {}
        return {
            int(path.name.split("-")[1].split(".")[0]): int(path.read_text())
            for path in self.pid_dir.glob("rank-*.pid")
        }

    def kill(self) -> None:
        """SIGKILL mpiexec's process group and every rank that announced its pid."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in self.rank_pids().values():  # Hydra starts each rank in its own session
            if _is_rank(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def wait_for(self, path: Path, timeout: float) -> None:
        """Poll until `path` exists; fail (and kill the job) if the job ends or time runs out."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                self.process.wait()
                raise AssertionError(f"{path.name} never appeared\n{self.output()}")
            time.sleep(0.05)

    def finish(self, timeout: float) -> int:
        """The exit status, within `timeout` seconds, or kill everything and fail."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()
            raise AssertionError(f"no exit within {timeout} s (a hang?)\n{self.output()}") from None

    def output(self) -> str:
        return f"{' '.join(self.command)}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def run(folder: Path, ranks: int, *args: str, timeout: float = 60) -> tuple[int, Job]:
    job = Job(folder, ranks, list(args))
    return job.finish(timeout), job


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


def _model(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _is_rank(pid: int) -> bool:
    """Whether `pid` is still one of our lbtrain ranks (not a recycled pid)."""
    try:
        return b"lbtrain" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): it has exited, its parent has not reaped it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------------------------------
# A rank fails


def test_an_exception_on_one_rank_mid_epoch_ends_the_job_with_its_message(tmp_path):
    # Profiling runs first here (it also calls the loss): the fault still fires at training
    # step 3 of rank 1, as the message says.
    message = "injected fault on rank 1 at step 3"
    for attempt in range(2):
        out = tmp_path / f"run-{attempt}"
        code, job = run(
            tmp_path, 3,
            *_faulty("--fault", "raise", "--fault-rank", "1", "--fault-step", "3"),
            "--time-budget", "1", "--epochs", "3", "--out", str(out),
            timeout=30,
        )  # fmt: skip
        assert code != 0, job.output()
        assert not (out / "metrics.json").exists()
        # About 1 job in 100, Hydra's abort overtakes its forwarding of the aborting rank's
        # stderr and drops all of it, MPICH's own "MPI_Abort" line included (measured with a
        # bare mpi4py script: print, then Abort). Only then is the job run once more.
        if "MPI_Abort" in job.stderr:
            break
    assert job.stderr.count(message) == 1, job.output()


def test_kill_9_of_one_rank_mid_epoch_ends_the_job_and_leaves_no_rank(tmp_path):
    pids = tmp_path / "pids"
    job = Job(
        tmp_path, 3,
        [*_faulty("--fault-step", "3", "--step-sleep", "0.2", "--pid-dir", str(pids)),
         "--plan", str(_plan(tmp_path, [1.0, 1.0, 1.0])), "--epochs", "20", "--quiet",
         "--out", str(tmp_path / "run")],
        pid_dir=pids,
    )  # fmt: skip
    job.wait_for(pids / "rank-1.step-3", timeout=60)
    ranks = job.rank_pids()
    assert sorted(ranks) == [0, 1, 2], ranks
    os.kill(ranks[1], signal.SIGKILL)
    code = job.finish(timeout=30)
    assert code != 0, job.output()
    deadline = time.monotonic() + 5  # the launcher reaps its children as it exits
    while any(_alive(pid) for pid in ranks.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [rank for rank, pid in ranks.items() if _alive(pid)]
    if left:
        job.kill()
    assert not left, f"ranks {left} outlived the job\n{job.output()}"


def test_a_nan_loss_on_one_rank_stops_every_rank_and_keeps_the_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    code, job = run(
        tmp_path, 3,
        *_faulty("--fault", "nan", "--fault-rank", "2", "--fault-step", "7"),
        "--plan", str(_plan(tmp_path, [1.0, 1.0, 1.0])), "--epochs", "4",
        "--checkpoint-every", "1", "--out", str(out),
        timeout=30,
    )  # fmt: skip
    assert code == 1, job.output()
    errors = _error_lines(job.stderr)
    assert len(errors) == 1, job.output()  # every rank stopped; one reported
    assert errors[0].startswith("lbtrain: error: ")
    assert "epoch 2, step 2" in errors[0] and "non-finite" in errors[0], errors[0]
    assert "Traceback" not in job.stderr and "BAD TERMINATION" not in job.stdout, job.output()
    saved = list_checkpoints(out / "checkpoints")
    assert [path.name for path in saved] == ["step-000000005.pt"], saved
    state = load_checkpoint(saved[0])
    assert (state["epoch"], state["step"], state["global_step"]) == (1, 0, 5)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert not (out / "metrics.json").exists()


# ---------------------------------------------------------------------------------------
# Resuming gives the run that was never stopped (same world size, fixed plan, no dropout)


@pytest.fixture(scope="module")
def one_go(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final model of 4 epochs on 2 ranks with batches 10 and 30, in one go."""
    folder = tmp_path_factory.mktemp("one-go")
    code, job = run(
        folder, 2, *_faulty(*SCHEDULE), "--plan", str(_plan(folder, [1.0, 3.0])),
        "--epochs", "4", "--quiet", "--out", str(folder / "run"),
    )  # fmt: skip
    assert code == 0, job.output()
    saved = list_checkpoints(folder / "run" / "checkpoints")
    assert load_checkpoint(saved[-1])["global_step"] == 20
    return _model(saved[-1])


def test_resume_after_epoch_2_ends_exactly_where_one_go_does(tmp_path, one_go):
    out = tmp_path / "run"
    plan = _plan(tmp_path, [1.0, 3.0])
    first, job = run(
        tmp_path, 2, *_faulty(*SCHEDULE), "--plan", str(plan), "--epochs", "2", "--quiet",
        "--out", str(out),
    )  # fmt: skip
    assert first == 0, job.output()
    after_two = load_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    assert after_two["global_step"] == 10
    second, job = run(tmp_path, 2, "--resume", str(out), "--epochs", "4", "--quiet")
    assert second == 0, job.output()
    assert (out / "metrics.json").exists()
    resumed = list_checkpoints(out / "checkpoints")[-1]
    assert load_checkpoint(resumed)["global_step"] == 20
    assert _same(_model(resumed), one_go)

    # The comparison can fail: the same resume without the optimizer's state (Adam's
    # moments) ends elsewhere.
    after_two["optimizer"]["state"] = {}
    forgetful = tmp_path / "forgetful.pt"
    torch.save(after_two, forgetful)
    code, job = run(
        tmp_path, 2, "--resume", str(forgetful), "--epochs", "4", "--quiet",
        "--out", str(tmp_path / "forgetful"),
    )  # fmt: skip
    assert code == 0, job.output()
    assert not _same(_model(list_checkpoints(tmp_path / "forgetful" / "checkpoints")[-1]), one_go)


# ---------------------------------------------------------------------------------------
# Signals


def test_sigterm_to_one_rank_checkpoints_exits_143_and_resume_completes_the_run(tmp_path, one_go):
    out, pids = tmp_path / "run", tmp_path / "pids"
    job = Job(
        tmp_path, 2,
        [*_faulty(*SCHEDULE, "--fault-step", "7", "--step-sleep", "0.3", "--pid-dir", str(pids)),
         "--plan", str(_plan(tmp_path, [1.0, 3.0])), "--epochs", "4", "--out", str(out)],
        pid_dir=pids,
    )  # fmt: skip
    job.wait_for(pids / "rank-1.step-7", timeout=60)  # rank 1 is in epoch 2, step 2
    os.kill(job.rank_pids()[1], signal.SIGTERM)
    code = job.finish(timeout=30)
    assert code == 143, job.output()
    # The ranks stopped on their own (a rank killed by the signal would read 143 too).
    assert "BAD TERMINATION" not in job.stdout + job.stderr, job.output()
    saved = list_checkpoints(out / "checkpoints")
    assert saved, job.output()
    assert f"checkpoint {saved[-1]}" in job.stdout and f"--resume {out}" in job.stdout
    state = load_checkpoint(saved[-1])
    assert 7 <= state["global_step"] < 20, state["global_step"]  # stopped mid-run
    assert (state["epoch"], state["step"]) == divmod(state["global_step"], 5)
    assert not (out / "metrics.json").exists()

    code, job = run(tmp_path, 2, "--resume", str(out), "--step-sleep", "0", "--quiet")
    assert code == 0, job.output()
    assert (out / "metrics.json").exists()
    final = list_checkpoints(out / "checkpoints")[-1]
    assert load_checkpoint(final)["global_step"] == 20
    assert _same(_model(final), one_go)  # a mid-epoch resume is exact too


def test_sigint_to_the_launcher_stops_every_rank_with_a_checkpoint_and_exit_130(tmp_path):
    # What Ctrl-C in a terminal does: SIGINT to the foreground process group, which holds
    # mpiexec alone; Hydra forwards it to the ranks, which stop after the step together.
    out, pids = tmp_path / "run", tmp_path / "pids"
    job = Job(
        tmp_path, 2,
        [*_faulty("--fault-step", "3", "--step-sleep", "0.3", "--pid-dir", str(pids)),
         "--plan", str(_plan(tmp_path, [1.0, 3.0])), "--epochs", "10", "--out", str(out)],
        pid_dir=pids,
    )  # fmt: skip
    job.wait_for(pids / "rank-1.step-3", timeout=60)
    os.killpg(job.process.pid, signal.SIGINT)
    code = job.finish(timeout=30)
    assert code == 130, job.output()
    saved = list_checkpoints(out / "checkpoints")
    assert saved and f"checkpoint {saved[-1]}" in job.stdout, job.output()
    assert "stopped by a signal" in job.stdout
    assert load_checkpoint(saved[-1])["global_step"] < 50
    assert "Traceback" not in job.stderr, job.output()


@pytest.mark.parametrize("after", [1.0, 6.0], ids=["starting", "profiling"])
def test_ctrl_c_outside_training_is_one_line_for_the_whole_job_and_exit_130(tmp_path, after):
    # Every rank gets the SIGINT (Hydra forwards it): while they start up (importing torch)
    # or while they profile, the job prints one line, not one per rank, and no traceback.
    job = Job(
        tmp_path, 2,
        ["--workload", "toy", "--threads", "1", "--time-budget", "60", "-o",
         str(tmp_path / "p.json")],
        verb="profile",
    )  # fmt: skip
    time.sleep(after)  # where the interrupt lands; the outcome must not depend on it
    os.killpg(job.process.pid, signal.SIGINT)
    code = job.finish(timeout=60)
    assert code == 130, job.output()
    assert job.stderr.count("lbtrain: interrupted") == 1, job.output()
    assert "Traceback" not in job.stderr and not (tmp_path / "p.json").exists(), job.output()


# ---------------------------------------------------------------------------------------
# Bad input: exit 2, one error line (not one per rank), before any real work


def _bad_out(tmp_path: Path) -> str:
    (tmp_path / "file.txt").write_text("not a folder\n")
    return str(tmp_path / "file.txt" / "run")


def _full_out(tmp_path: Path) -> str:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine\n")
    return str(tmp_path / "full")


def _held_out(tmp_path: Path) -> str:
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "config.toml").write_text('workload = "hyperspectral"\n')
    return str(tmp_path / "held")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--global-batch", "1"], "--global-batch 1"),
        (["--model", "nope"], "--model"),
        (["--dataset", "nope"], "--dataset"),
        (["--patch-size", "4"], "--patch-size 4"),
        (["--patch-size", "301"], "--patch-size 301"),
        (["--train-ratio", "1.5"], "--train-ratio 1.5"),
        (["--epochs", "0"], "--epochs"),
        (["--resume", "{tmp}/missing"], "does not exist"),
        (["--out", _bad_out], "cannot be written"),
        (["--out", _held_out], "already holds a run"),
        (["--out", _full_out], "is not empty (it holds notes.txt)"),
        # /proc takes no new folders, even from root.
        (["--out", "/proc/lbtrain-no-such-run"], "--out '/proc/lbtrain-no-such-run' cannot"),
        (["--dataset", "indian_pines", "--data-dir", "{tmp}/typo"], "typo' does not exist"),
        (["--model", "hu", "--patch-size", "5"], "--model hu reads only the centre"),
    ],
    ids=[
        "batch-below-world", "model", "dataset", "even-patch", "patch-too-large",
        "train-ratio", "epochs-0", "missing-resume", "out-unwritable", "out-holds-run",
        "out-not-empty", "out-uncreatable", "data-dir-typo", "hu-patch",
    ],
)  # fmt: skip
def test_a_bad_setting_under_mpiexec_is_one_error_line_and_exit_2(tmp_path, args, needle):
    args = [a(tmp_path) if callable(a) else a.replace("{tmp}", str(tmp_path)) for a in args]
    defaults = ["--dataset", "synthetic", "--time-budget", "1", "--epochs", "1", "--threads", "1"]
    if "--out" not in args:
        defaults += ["--out", str(tmp_path / "run")]
    code, job = run(tmp_path, 2, *defaults, *args, timeout=30)
    assert code == 2, job.output()
    errors = _error_lines(job.stderr)
    assert len(errors) == 1, job.output()
    assert errors[0].startswith(("lbtrain: error:", "lbtrain train: error:")), errors[0]
    assert needle in errors[0], (needle, errors[0])
    assert "Traceback" not in job.stderr and not job.stdout.strip(), job.output()


# ---------------------------------------------------------------------------------------
# --config


def test_a_config_file_supplies_settings_and_a_flag_overrides_one(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        f'workload = "{FAULTY}"\nepochs = 1\nglobal_batch = {BATCH}\nlr = 0.01\n'
        'lr_schedule = "constant"\nthreads = 1\n'
        "[workload_options]\nfault_step = 2\nstep_sleep = 0.0\n"
    )
    out = tmp_path / "run"
    code, job = run(
        tmp_path, 2, "--config", str(config), "--lr", "0.005", "--fault-step", "4",
        "--plan", str(_plan(tmp_path, [1.0, 3.0])), "--quiet", "--out", str(out),
    )  # fmt: skip
    assert code == 0, job.output()
    written = load_toml(out / "config.toml")
    assert written["workload"] == FAULTY and written["epochs"] == 1
    assert written["global_batch"] == BATCH and written["lr_schedule"] == "constant"
    assert written["lr"] == 0.005  # the flag beats the file
    assert written["workload_options"]["fault_step"] == 4
    assert written["workload_options"]["step_sleep"] == 0.0


def test_an_unknown_key_in_the_config_file_is_one_error_line_and_exit_2(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f'workload = "{FAULTY}"\nepochs = 1\nbogus_setting = 3\n')
    code, job = run(
        tmp_path, 2, "--config", str(config), "--out", str(tmp_path / "run"), timeout=30
    )
    assert code == 2, job.output()
    errors = _error_lines(job.stderr)
    assert len(errors) == 1 and errors[0].startswith("lbtrain: error:"), job.output()
    assert "bogus_setting" in errors[0], errors[0]
    assert not (tmp_path / "run").exists()
