"""`lbtrain train` under torchrun when things go wrong: a failing rank, a killed rank, Ctrl-C.

torchrun starts each worker in a session of its own and watches them: when one exits with an
error its agent sends SIGTERM to the others (SIGKILL 30 s later). A worker blocked in a gloo
collective with a rank that is gone fails at once (the connection closes); lbtrain's
communicator then leaves quietly when the failing rank left its status in the rendezvous
store (it said why), and when none did (a rank killed outright) exactly one survivor says
so. A terminal's Ctrl-C reaches torchrun alone, which sends SIGINT on to every worker.

Every job runs the console module as a user does (``torchrun --nproc-per-node N -m lbtrain
train ...``) with the fault-injecting workload of tests/fixtures/faulty.py, under a
timeout that kills torchrun and every worker, so a hang fails the test. torchrun's own
report of the failure (its traceback and summary) is not lbtrain's to shorten; the tests
count lbtrain's lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.fixtures.faulty_runs import faulty, plan_file
from tests.mpi.launch import REPO, kill_job, torchrun_command


class Job:
    """`torchrun --nproc-per-node ranks -m lbtrain train args` in a new session."""

    def __init__(self, folder: Path, ranks: int, args: list[str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.stdout_path, self.stderr_path = folder / "stdout.txt", folder / "stderr.txt"
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.command = [*torchrun_command(ranks), "-m", "lbtrain", *faulty(*args)]
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=err, env=env, cwd=folder, start_new_session=True
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def output(self) -> str:
        return (
            f"{' '.join(self.command)}\nstdout:\n{self.stdout_path.read_text()}\n"
            f"stderr:\n{self.stderr}"
        )

    def wait_for(self, path: Path, timeout: float = 60) -> None:
        """Poll until `path` exists; fail (and kill the job) if the job ends or time runs out."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                kill_job(self.process.pid)
                self.process.wait()
                raise AssertionError(f"{path.name} never appeared\n{self.output()}")
            time.sleep(0.05)

    def finish(self, timeout: float) -> int:
        """The exit status within `timeout` seconds, or kill everything and fail."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_job(self.process.pid)
            self.process.wait()
            raise AssertionError(f"no exit within {timeout} s (a hang?)\n{self.output()}") from None


def _pids(folder: Path) -> dict[int, int]:
    return {
        int(path.name.split("-")[1].split(".")[0]): int(path.read_text())
        for path in folder.glob("rank-*.pid")
    }


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_exception_on_one_rank_ends_the_job_with_its_message_alone(tmp_path):
    message = "injected fault on rank 1 at step 3"
    out = tmp_path / "run"
    job = Job(
        tmp_path, 3,
        ["--fault", "raise", "--fault-rank", "1", "--fault-step", "3",
         "--plan", str(plan_file(tmp_path, [1.0, 1.0, 1.0])), "--epochs", "3", "--out", str(out)],
    )  # fmt: skip
    job.wait_for(out / "plan.json")  # the ranks have met: what follows is bounded by 30 s
    assert job.finish(timeout=30) != 0, job.output()
    assert job.stderr.count(message) == 1, job.output()
    assert "InjectedFault" in job.stderr and not (out / "metrics.json").exists()
    # The others left quietly: no second report, no gloo error text.
    assert "lost contact" not in job.stderr and "Connection" not in job.stderr, job.output()


def test_kill_9_of_one_rank_is_reported_once_and_leaves_no_rank(tmp_path):
    pids = tmp_path / "pids"
    job = Job(
        tmp_path, 3,
        ["--fault-step", "3", "--step-sleep", "0.2", "--pid-dir", str(pids),
         "--plan", str(plan_file(tmp_path, [1.0, 1.0, 1.0])), "--epochs", "20", "--quiet",
         "--out", str(tmp_path / "run")],
    )  # fmt: skip
    job.wait_for(pids / "rank-1.step-3")
    ranks = _pids(pids)
    assert sorted(ranks) == [0, 1, 2], ranks
    os.kill(ranks[1], signal.SIGKILL)
    assert job.finish(timeout=30) != 0, job.output()
    errors = [line for line in job.stderr.splitlines() if line.startswith("lbtrain: error:")]
    assert len(errors) == 1 and "lost contact with another rank" in errors[0], job.output()
    left = [rank for rank, pid in ranks.items() if _alive(pid)]
    assert not left, f"ranks {left} outlived the job\n{job.output()}"


def test_ctrl_c_while_profiling_is_one_line_for_the_whole_job(tmp_path):
    # What Ctrl-C in a terminal does: SIGINT to torchrun's process group, which holds
    # torchrun alone; it sends SIGINT to each worker. The slowdown makes profiling outlast
    # any wait, whatever the machine's speed.
    out, pids = tmp_path / "run", tmp_path / "pids"
    job = Job(
        tmp_path, 2,
        ["--pid-dir", str(pids), "--emulate-slowdown", "1000", "--time-budget", "600",
         "--epochs", "1", "--out", str(out)],
    )  # fmt: skip
    job.wait_for(pids / "rank-1.pid")
    job.wait_for(pids / "rank-0.pid")
    os.killpg(job.process.pid, signal.SIGINT)
    assert job.finish(timeout=30) != 0, job.output()  # torchrun's own status: 1
    assert job.stderr.count("lbtrain: interrupted") == 1, job.output()
    assert f"{os.sep}lbtrain{os.sep}" not in job.stderr, job.output()  # no lbtrain traceback
    assert not (out / "profiles.json").exists()
