"""Launch a script under mpiexec with a timeout, so a hang fails a test instead of CI."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["SCRIPTS", "lbtrain_command", "mpiexec_path", "run_mpi"]

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
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    full_env.update(env or {})
    # A new session lets the timeout kill mpiexec and every rank it started together.
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
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise AssertionError(
                f"{' '.join(command)} did not finish within {timeout}s (a hang?)\n"
                f"stdout:\n{stdout}\nstderr:\n{stderr}"
            ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
