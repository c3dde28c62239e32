"""Multi-rank exactness and failure handling, each run under mpiexec with a timeout."""

from __future__ import annotations

import pytest

from tests.mpi.launch import SCRIPTS, run_mpi


@pytest.mark.parametrize(
    ("ranks", "sizes", "mode"),
    [
        (3, "5,11,48", "function"),
        (2, "1,30", "function"),
        (3, "20,0,44", "function"),
        (2, "1,30", "overlap"),
        (3, "20,0,44", "overlap"),
        (3, "20,0,44", "staged"),
    ],
)
def test_unequal_shares_match_one_process_and_naive_average_does_not(ranks, sizes, mode):
    result = run_mpi(SCRIPTS / "exactness.py", ranks, sizes, mode, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exactness ok" in result.stdout


def test_an_exception_on_one_rank_aborts_every_rank_with_its_message():
    result = run_mpi(SCRIPTS / "abort_on_error.py", 3, timeout=60)
    assert result.returncode != 0
    assert "boom on rank 1: this message must reach the user" in result.stderr


def test_communicator_operations_on_real_ranks():
    result = run_mpi(SCRIPTS / "comm_ops.py", 3, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "comm ops ok on 3 ranks" in result.stdout
