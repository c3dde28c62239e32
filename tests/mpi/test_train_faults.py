"""`lbtrain train` under mpiexec when things go wrong: failures, kills, signals, bad input.

Every job runs the console script as a user does (``mpiexec -n N lbtrain train ...``) with
the fault-injecting workload of tests/fixtures/faulty.py, and under a timeout that kills
mpiexec's process group and every rank the job announced, so a hang fails the test instead
of freezing the suite. Hydra starts each rank in a session of its own, so a signal sent to
mpiexec's process group reaches mpiexec alone, which forwards SIGINT to the ranks (what a
user's Ctrl-C does); a signal for one rank goes to that rank's pid.

Most jobs use a plan file instead of profiling: it saves time and keeps the batches fixed.
With 200 training samples and a global batch of 40, an epoch is 5 steps. What needs several
ranks but no real processes (bad settings, a NaN, resume, --config) is checked in-process,
in tests/unit/test_train_ranks.py; one bad setting here shows it is printed once under
mpiexec too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint
from tests.fixtures.faulty_runs import SCHEDULE, final_model, plan_file, same
from tests.fixtures.faulty_runs import faulty as _train_args
from tests.mpi.launch import REPO, abort_job, lbtrain_command, mpiexec_path
from tests.ranks import lbtrain_ranks


def _faulty(*args: str) -> list[str]:
    return _train_args(*args)[1:]  # without the verb: Job adds it


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
        # faulthandler: a rank that hangs prints its stack when `finish` gives up on it.
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "PYTHONFAULTHANDLER": "1"}  # fmt: skip
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
            self._dump_stacks()
            self.kill()
            self.process.wait()
            raise AssertionError(f"no exit within {timeout} s (a hang?)\n{self.output()}") from None

    def _dump_stacks(self) -> None:
        """SIGABRT the ranks of a hung job: each prints where it is (faulthandler) on its
        stderr, which mpiexec forwards before it ends (waited for, up to 10 s)."""
        family = abort_job(self.process.pid)
        for pid in self.rank_pids().values():  # a rank its launcher no longer holds
            if pid not in family and _is_rank(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def output(self) -> str:
        return f"{' '.join(self.command)}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def run(folder: Path, ranks: int, *args: str, timeout: float = 60) -> tuple[int, Job]:
    job = Job(folder, ranks, list(args))
    return job.finish(timeout), job


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


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
    message = "injected fault on rank 1 at step 3"
    for attempt in range(2):
        out = tmp_path / f"run-{attempt}"
        code, job = run(
            tmp_path, 3,
            *_faulty("--fault", "raise", "--fault-rank", "1", "--fault-step", "3"),
            "--plan", str(plan_file(tmp_path, [1.0, 1.0, 1.0])), "--epochs", "3",
            "--out", str(out),
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
         "--plan", str(plan_file(tmp_path, [1.0, 1.0, 1.0])), "--epochs", "20", "--quiet",
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


@pytest.fixture(scope="module")
def one_go(tmp_path_factory) -> dict[str, torch.Tensor]:
    """4 epochs on 2 ranks with batches 10 and 30 in one go, on in-process ranks.

    Two ranks sum a + b in either engine, so a run under mpiexec must match it bit for bit.
    """
    folder = tmp_path_factory.mktemp("one-go")
    job = lbtrain_ranks(
        2, *_train_args(*SCHEDULE), "--plan", str(plan_file(folder, [1.0, 3.0])),
        "--epochs", "4", "--quiet", "--out", str(folder / "run"),
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    return final_model(folder / "run")


# ---------------------------------------------------------------------------------------
# Signals


def test_sigterm_to_one_rank_checkpoints_exits_143_and_resume_completes_the_run(tmp_path, one_go):
    out, pids = tmp_path / "run", tmp_path / "pids"
    job = Job(
        tmp_path, 2,
        [*_faulty(*SCHEDULE, "--fault-step", "7", "--step-sleep", "0.3", "--pid-dir", str(pids)),
         "--plan", str(plan_file(tmp_path, [1.0, 3.0])), "--epochs", "4", "--out", str(out)],
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

    # The resume itself needs no real processes: on in-process ranks it continues what the
    # mpiexec job saved (two ranks sum a + b in either engine), one launch fewer.
    resumed = lbtrain_ranks(2, "train", "--resume", str(out), "--step-sleep", "0", "--quiet")
    assert resumed.codes == [0, 0], resumed.output()
    assert (out / "metrics.json").exists()
    final = list_checkpoints(out / "checkpoints")[-1]
    assert load_checkpoint(final)["global_step"] == 20
    assert same(final_model(out), one_go)  # a mid-epoch resume is exact too


def test_sigint_to_the_launcher_stops_every_rank_with_a_checkpoint_and_exit_130(tmp_path):
    # What Ctrl-C in a terminal does: SIGINT to the foreground process group, which holds
    # mpiexec alone; Hydra forwards it to the ranks, which stop after the step together.
    out, pids = tmp_path / "run", tmp_path / "pids"
    job = Job(
        tmp_path, 2,
        [*_faulty("--fault-step", "3", "--step-sleep", "0.3", "--pid-dir", str(pids)),
         "--plan", str(plan_file(tmp_path, [1.0, 3.0])), "--epochs", "10", "--out", str(out)],
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
    # Rank 0 alone says what a second Ctrl-C would do: one line for the job.
    assert job.stderr.count("Ctrl-C again stops at once, without one") == 1, job.output()


def _rank_pids(marker: str) -> list[int]:
    """Pids of the lbtrain processes whose command line holds `marker` (this job's ranks)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"lbtrain" in command and marker.encode() in command and b"mpiexec" not in command:
                pids.append(int(entry.name))
    return pids


def _loads_torch(pid: int) -> bool:
    """Whether the process has begun importing torch, i.e. lbtrain's own code runs in it."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _launcher_rank(pid: int) -> int | None:
    """The rank Hydra gave process `pid` (its PMI_RANK), None if unknown."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(item[9:]) for item in environ if item.startswith(b"PMI_RANK=")]
    return ranks[0] if ranks else None


@pytest.mark.parametrize("phase", ["starting", "one-rank-starting", "profiling"])
def test_ctrl_c_outside_training_is_one_line_for_the_whole_job_and_exit_130(tmp_path, phase):
    # Every rank gets the SIGINT (Hydra forwards it): while they start up (importing torch)
    # or while they profile, the job prints one line, not one per rank, and no traceback.
    # The test waits for the phase to begin (torch loading in both ranks; both ranks'
    # workload built, which comes right before profiling), and the emulated slowdown makes
    # profiling last far longer than any wait, whatever the machine's speed.
    # "one-rank-starting" interrupts rank 1 alone while it loads torch: before MPI started
    # ahead of torch, that rank ended before MPI_Init and rank 0 waited in MPI_Init forever.
    out, pids = tmp_path / "run", tmp_path / "pids"
    job = Job(
        tmp_path, 2,
        [*_faulty("--pid-dir", str(pids)), "--emulate-slowdown", "1000", "--time-budget", "600",
         "--epochs", "1", "--out", str(out)],
        pid_dir=pids,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        targets: list[int] = []
        if phase == "starting":
            ranks = _rank_pids(str(out))
            ready = len(ranks) == 2 and all(_loads_torch(pid) for pid in ranks)
        elif phase == "one-rank-starting":
            targets = [p for p in _rank_pids(str(out)) if _launcher_rank(p) == 1]
            ready = len(targets) == 1 and _loads_torch(targets[0])
        else:
            ready = len(job.rank_pids()) == 2
        if ready:
            break
        if job.process.poll() is not None or time.monotonic() > deadline:
            job.kill()
            raise AssertionError(f"the {phase} phase never began\n{job.output()}")
        time.sleep(0.01)
    if targets:
        os.kill(targets[0], signal.SIGINT)
    else:
        os.killpg(job.process.pid, signal.SIGINT)
    code = job.finish(timeout=60)
    assert code == 130, job.output()
    assert job.stderr.count("lbtrain: interrupted") == 1, job.output()
    assert "Traceback" not in job.stderr and not (out / "profiles.json").exists(), job.output()


def test_sigterm_while_the_ranks_start_is_one_line_and_exit_143(tmp_path):
    """A scheduler's SIGTERM while every rank still loads torch: one line and 143, not the
    default action's status 15 and MPICH's "BAD TERMINATION" banner."""
    out = tmp_path / "run"
    job = Job(tmp_path, 2, [*_faulty(), "--epochs", "1", "--out", str(out)])
    deadline = time.monotonic() + 60
    while not ((ranks := _rank_pids(str(out))) and len(ranks) == 2
               and all(_loads_torch(pid) for pid in ranks)):  # fmt: skip
        if job.process.poll() is not None or time.monotonic() > deadline:
            job.kill()
            raise AssertionError(f"the ranks never began to start\n{job.output()}")
        time.sleep(0.01)
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    code = job.finish(timeout=60)
    assert code == 143, job.output()
    assert job.stderr.count("lbtrain: terminated (SIGTERM)") == 1, job.output()
    assert "Traceback" not in job.stderr and "BAD TERMINATION" not in job.stdout, job.output()


@pytest.mark.parametrize("phase", ["profiling", "evaluate", "draw"])
def test_sigterm_in_any_phase_ends_the_job_with_143_and_a_resumable_checkpoint(tmp_path, phase):
    # What a scheduler does at the end of a job's time: SIGTERM to every process. Outside
    # the training steps there is no step to wait for: the job ends at once with one line
    # and 143; once training has run, its last checkpoint lets a resume finish the run.
    # The faulty workload holds in the phase (and says so in a marker file), and profiling
    # is made to last (--emulate-slowdown 1000), so the signal lands there on any machine.
    out, pids = tmp_path / "run", tmp_path / "pids"
    args = [*_faulty("--pid-dir", str(pids)), "--epochs", "2", "--out", str(out)]
    if phase == "profiling":
        args += ["--emulate-slowdown", "1000", "--time-budget", "600"]
    else:
        args += ["--plan", str(plan_file(tmp_path, [1.0, 3.0])), "--hold", phase]
    job = Job(tmp_path, 2, args, pid_dir=pids)
    if phase == "profiling":
        job.wait_for(pids / "rank-1.pid", timeout=60)
        job.wait_for(pids / "rank-0.pid", timeout=60)
    else:
        job.wait_for(pids / f"rank-0.hold-{phase}", timeout=60)
    for pid in job.rank_pids().values():
        os.kill(pid, signal.SIGTERM)
    code = job.finish(timeout=30)
    assert code == 143, job.output()
    assert job.stderr.count("lbtrain: terminated (SIGTERM)") == 1, job.output()
    assert "Traceback" not in job.stderr, job.output()
    saved = list_checkpoints(out / "checkpoints")
    if phase == "profiling":
        assert not saved, job.output()
        return
    assert saved and load_checkpoint(saved[-1])["global_step"] == 10, job.output()
    if phase == "draw":
        return  # the same checkpoint as in "evaluate", whose resume is checked there
    # The resume needs no real processes (one launch fewer); under torchrun's agent a real
    # restart resumes in tests/mpi/test_torchrun_elastic.py.
    resumed = lbtrain_ranks(2, "train", "--resume", str(out), "--hold", "none", "--quiet")
    assert resumed.codes == [0, 0], resumed.output()
    assert (out / "metrics.json").exists()


# ---------------------------------------------------------------------------------------
# Bad input: exit 2, one error line (not one per rank), before any real work. Each check
# is in tests/unit/test_train_ranks.py on in-process ranks; under mpiexec, one checked by
# every rank and one by rank 0 alone show the line is printed once by real processes too.


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "hu", "--patch-size", "5"], "--model hu reads only the centre"),
        (["--out", "/proc/lbtrain-no-such-run"], "--out '/proc/lbtrain-no-such-run' cannot"),
    ],
    ids=["hu-patch", "out-uncreatable"],
)
def test_a_bad_setting_under_mpiexec_is_one_error_line_and_exit_2(tmp_path, args, needle):
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
