"""Under mpiexec, a command-line mistake is printed once for the job, not by every rank.

Each rank parses its own command line before any communicator exists; only the launcher's
rank variable keeps the others quiet, so this needs real processes. The rest (every verb's
mistakes, several ranks agreeing on errors) runs in-process: tests/unit/test_cli_first_hour.py
and tests/unit/test_profiling_ranks.py.
"""

from __future__ import annotations

from tests.mpi.launch import run_lbtrain_mpi


def test_a_command_line_mistake_is_two_lines_for_the_whole_job():
    # As typed: the error naming the flag, then where help is; not once per rank, and not
    # after the 25-line usage block.
    result = run_lbtrain_mpi(2, "train", "--epochs", "x", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert not result.stdout, result.stdout
    assert result.stderr.splitlines() == [
        "lbtrain train: error: argument --epochs: 'x' is not a whole number",
        "see lbtrain train --help",
    ], result.stderr
