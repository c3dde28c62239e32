"""Launch a script under mpiexec or torchrun with a timeout, so a hang fails a test, not CI."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

__all__ = [
    "SCRIPTS",
    "kill_job",
    "lbtrain_command",
    "mpiexec_path",
    "run_lbtrain_mpi",
    "run_mpi",
    "run_torchrun",
    "torchrun_command",
]

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


def mpiexec_path() -> str:
    """The mpiexec next to this Python (the mpich wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found: run `make venv` (it installs the mpich wheel)")
    return found


def lbtrain_command() -> list[str]:
    """The installed `lbtrain` console script, as a user runs it, else `python -m lbtrain`."""
    script = Path(sys.executable).parent / "lbtrain"
    if script.exists():
        return [str(script)]
    found = shutil.which("lbtrain")
    return [found] if found else [sys.executable, "-m", "lbtrain"]


def torchrun_command(ranks: int) -> list[str]:
    """`torchrun --nproc-per-node ranks --standalone` (a free port) next to this Python."""
    beside = Path(sys.executable).parent / "torchrun"
    launcher = [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return [*launcher, "--nproc-per-node", str(ranks), "--standalone"]


def run_mpi(
    script: str | Path,
    ranks: int,
    *args: str,
    timeout: float = 120,
    module: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `script` (or `-m module` when module=True) on `ranks` ranks and capture output.

    `python -m mpi4py` wraps scripts so that an unhandled exception on any rank aborts all
    ranks; the timeout catches whatever hang is left.
    """
    target = ["-m", str(script)] if module else [str(script)]
    command = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "mpi4py", *target, *args]
    return _run(command, timeout, env)


def run_lbtrain_mpi(
    ranks: int, *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`mpiexec -n ranks lbtrain args...` with the console script, exactly as a user types it
    (no `python -m mpi4py` wrapper, whose own abort message would add a line)."""
    return _run([mpiexec_path(), "-n", str(ranks), *lbtrain_command(), *args], timeout, env)


def run_torchrun(
    script: str | Path,
    ranks: int,
    *args: str,
    timeout: float = 120,
    module: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `script` (or `-m module`) under `torchrun --nproc-per-node ranks`, as run_mpi does.

    An unhandled exception ends its worker, and torchrun's agent then ends the others.
    """
    target = ["-m", str(script)] if module else [str(script)]
    return _run([*torchrun_command(ranks), *target, *args], timeout, env)


def _run(
    command: list[str], timeout: float, env: dict[str, str] | None
) -> subprocess.CompletedProcess[str]:
    # faulthandler: a rank that hangs prints its stack when the timeout aborts it.
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
                "PYTHONFAULTHANDLER": "1"}  # fmt: skip
    full_env.update(env or {})
    # A new session lets the timeout kill the launcher and every rank it started together.
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=REPO,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            family = abort_job(process.pid)
            try:  # until the launcher has passed the stacks on
                stdout, stderr = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                stdout = stderr = ""
            kill_job(process.pid, family)
            more = process.communicate()
            stdout, stderr = stdout + more[0], stderr + more[1]
            raise AssertionError(
                f"{' '.join(command)} did not finish within {timeout}s (a hang?)\n"
                f"stdout:\n{stdout}\nstderr:\n{stderr}"
            ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def abort_job(pid: int) -> list[int]:
    """SIGABRT the Python processes below the launcher `pid` (the ranks; torchrun's agent),
    so that each prints its stack where PYTHONFAULTHANDLER is set; the processes found
    below it, for `kill_job` once the launcher has passed the stacks on."""
    family = _descendants(pid)
    for member in family:
        try:
            if b"python" in Path(f"/proc/{member}/cmdline").read_bytes():
                os.kill(member, signal.SIGABRT)
        except (OSError, ProcessLookupError):
            pass
    return family


def kill_job(pid: int, family: list[int] | None = None) -> None:
    """SIGKILL the launcher `pid`, its process group and every process descended from it
    (and `family`, found before: a rank whose launcher has ended is no longer below it).

    Hydra and torchrun start each rank in a session of its own, out of the launcher's
    process group, so the ranks are found through their parents.
    """
    family = sorted({*_descendants(pid), *(family or [])})
    for member in [*family, pid]:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found
