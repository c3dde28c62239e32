"""Exactness through the whole `lbtrain train` command line under `mpiexec -n 3`.

Three real processes with unequal batches under mpiexec, and with a zero share under
`torchrun --nproc-per-node 3` (torch.distributed over gloo), must end where one process ends
on the same global batches (float32 rounding, about 1e-8). The plans are fixed (`--plan`),
since what is tested is the update, not the planner. The negative control (the naive 1/P
average misses), profiling, the policies and overlap off run on in-process ranks in
tests/unit/test_train_exactness_ranks.py, against the same one-process run: the weights are
applied before any engine's sum, so a launch per case would test the engine again, not the
weighting (tests/mpi/test_exactness.py runs every case of the wrapper in one job per engine).
"""

from __future__ import annotations

from tests.fixtures.exact_runs import (
    COMMON,
    max_difference,
    trained,
    unequal_plan,
    zero_share_plan,
)
from tests.mpi.launch import run_mpi, run_torchrun


def _three_ranks(out, *extra: str, launch=run_mpi):
    result = launch("lbtrain", 3, *COMMON, "--out", str(out), *extra, module=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return trained(out)


def _unequal(folder) -> tuple[str, ...]:
    # Emulated 1x, 2x, 4x devices, overlapped buckets on real nonblocking allreduces.
    plan = str(unequal_plan(folder))
    return ("--emulate-slowdown", "1,2,4", "--plan", plan, "--overlap", "on", "--replan", "off")


def test_three_unequal_ranks_under_mpiexec_match_one_process(one_process, tmp_path):
    model, sizes = _three_ranks(tmp_path / "run", *_unequal(tmp_path))
    assert sizes == [6, 11, 23]
    assert max_difference(model, one_process) < 1e-5


def test_torchrun_with_a_zero_share_matches_one_process(one_process, tmp_path):
    """Rank 1 gets no samples: it skips compute, adds zeros, and the job still matches; the
    same command under torchrun (gloo) as under mpiexec."""
    plan = str(zero_share_plan(tmp_path))
    model, sizes = _three_ranks(
        tmp_path / "run", "--plan", plan, "--replan", "off", launch=run_torchrun
    )
    assert sizes == [26, 0, 14]
    assert max_difference(model, one_process) < 1e-5
