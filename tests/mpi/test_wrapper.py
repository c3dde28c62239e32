"""`BalancedDataParallel` on real MPI ranks: a user's loop against one process, stock DDP with
`weighted_allreduce_hook` (over a gloo group beside MPI) against one process, and a model
mismatch that ends the job with one line per rank naming the parameter.

One job runs the exactness cases and then the mismatch (which ends it). The same checks
run on in-process ranks, for every mode, in tests/unit/test_parallel.py.
"""

from __future__ import annotations

from tests.mpi.launch import SCRIPTS, run_mpi

CASES = ("5,11,48:overlap", "20,0,44:accumulate", "20,0,44:plain", "20,0,44:ddp-hook")


def test_a_users_loop_is_exact_and_a_model_mismatch_ends_the_job_naming_the_parameter():
    result = run_mpi(SCRIPTS / "wrapper_exactness.py", 3, *CASES, "mismatch", timeout=180)
    assert result.returncode != 0, result.stdout + result.stderr
    assert result.stdout.count("wrapper exactness ok") == len(CASES), result.stdout + result.stderr
    for rank in range(3):
        assert f"rank {rank}: the ranks built different models: parameter '0.weight'" in (
            result.stdout
        ), result.stdout + result.stderr
