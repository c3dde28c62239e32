"""Multi-rank exactness and failure handling on real MPI ranks, under mpiexec with a timeout.

One job checks every Communicator operation and then the cases that need real MPI: unequal
shares, a zero share, overlap on real Iallreduce requests and host staging (the GPU path).
The same checks run on in-process ranks, for 2 and 3 ranks and every mode, in
tests/unit/test_exactness_ranks.py.
"""

from __future__ import annotations

from tests.mpi.launch import SCRIPTS, run_mpi

CASES = ("ops", "5,11,48:function", "20,0,44:overlap", "20,0,44:staged")


def test_unequal_shares_match_one_process_and_naive_average_does_not():
    result = run_mpi(SCRIPTS / "exactness.py", 3, *CASES, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "comm ops ok on 3 ranks" in result.stdout, result.stdout
    assert result.stdout.count("exactness ok") == len(CASES) - 1, result.stdout


def test_an_exception_on_one_rank_aborts_every_rank_with_its_message():
    result = run_mpi(SCRIPTS / "abort_on_error.py", 3, timeout=60)
    assert result.returncode != 0
    assert "boom on rank 1: this message must reach the user" in result.stderr
