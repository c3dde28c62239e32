"""Profiling under mpiexec: a command-line mistake is printed once, not by every rank.

Each rank parses its own command line before any communicator exists; only the launcher's
rank variable keeps the others quiet, so this needs real processes. The rest of profiling on
several ranks (the job-wide sync time, errors agreed by every rank) runs on in-process
ranks in tests/unit/test_profiling_ranks.py.
"""

from __future__ import annotations

from pathlib import Path

from tests.mpi.launch import run_mpi

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles_3ranks.json"


def _assert_one_line_error(result, *needles):
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("lbtrain: error:")]
    assert len(errors) == 1, result.stderr  # reported once, not once per rank
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


def test_a_command_line_mistake_is_reported_once_not_per_rank():
    result = run_mpi(
        "lbtrain", 3, "balance-report", "--global-batch", "0", module=True, timeout=120
    )
    assert result.returncode != 0
    assert result.stderr.count("error: argument --global-batch: 0 must be >= 1") == 1
    assert result.stderr.count("usage: lbtrain balance-report") == 1
