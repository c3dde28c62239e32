"""Exactness through the whole `lbtrain train` command line under `mpiexec -n 3`.

Three real processes with unequal batches, and with a zero share, must end where one
process ends on the same global batches (float32 rounding, about 1e-8); the naive 1/P
average must miss. Under `torchrun --nproc-per-node 3` (torch.distributed over gloo) the
same command must end where the mpiexec job ends. The plans are fixed (`--plan`), since
what is tested is the update, not the planner; profiling, the policies and overlap off run
on in-process ranks in tests/unit/test_train_exactness_ranks.py, against the same
one-process run.
"""

from __future__ import annotations

import pytest

from tests.fixtures.exact_runs import (
    COMMON,
    max_difference,
    trained,
    unequal_plan,
    zero_share_plan,
)
from tests.fixtures.shared_runs import shared_run
from tests.mpi.launch import run_mpi, run_torchrun


def _three_ranks(out, *extra: str, launch=run_mpi):
    result = launch("lbtrain", 3, *COMMON, "--out", str(out), *extra, module=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return trained(out)


def _unequal(folder) -> tuple[str, ...]:
    # Emulated 1x, 2x, 4x devices, overlapped buckets on real nonblocking allreduces.
    plan = str(unequal_plan(folder))
    return ("--emulate-slowdown", "1,2,4", "--plan", plan, "--overlap", "on", "--replan", "off")


@pytest.fixture(scope="module")
def unequal_mpi(tmp_path_factory):
    """The unequal run under mpiexec, made once for the tests that compare with it (on
    whichever xdist workers they run)."""
    folder = shared_run(
        tmp_path_factory, "unequal-mpi", lambda f: _three_ranks(f / "run", *_unequal(f))
    )
    return trained(folder / "run")


def test_three_unequal_ranks_match_one_process_and_the_naive_average_does_not(
    one_process, unequal_mpi, tmp_path
):
    model, sizes = unequal_mpi
    assert sizes == [6, 11, 23]
    assert max_difference(model, one_process) < 1e-5
    naive, _ = _three_ranks(tmp_path / "naive", *_unequal(tmp_path), "--weighting", "uniform")
    assert max_difference(naive, one_process) > 1e-3


def test_torchrun_trains_the_parameters_mpiexec_trains(one_process, unequal_mpi, tmp_path):
    """The same command and plan under torchrun (gloo) ends where mpiexec's job ends."""
    model, sizes = _three_ranks(tmp_path / "run", *_unequal(tmp_path), launch=run_torchrun)
    assert sizes == unequal_mpi[1] == [6, 11, 23]
    # Only the order of the sums differs between the engines: float32 rounding (7e-9 seen).
    assert max_difference(model, unequal_mpi[0]) < 1e-6
    assert max_difference(model, one_process) < 1e-5


def test_a_rank_with_a_zero_share_keeps_the_update_exact(one_process, tmp_path):
    """Rank 1 gets no samples: it skips compute, adds zeros, and the job still matches."""
    plan = str(zero_share_plan(tmp_path))
    model, sizes = _three_ranks(tmp_path / "run", "--plan", plan, "--replan", "off")
    assert sizes == [26, 0, 14]
    assert max_difference(model, one_process) < 1e-5
