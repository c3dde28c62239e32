"""Exactness through the whole `lbtrain train` command line under `mpiexec -n 3`.

Three real processes with unequal batches, and with a zero share, must end where one
process ends on the same global batches (float32 rounding, about 1e-8); the naive 1/P
average must miss. The plans are fixed (`--plan`), since what is tested is the update, not
the planner; profiling, the policies and overlap off run on in-process ranks in
tests/unit/test_train_exactness_ranks.py, against the same one-process run.
"""

from __future__ import annotations

import pytest

from lbtrain import SingleProcessCommunicator
from lbtrain.cli.main import main
from tests.fixtures.exact_runs import (
    COMMON,
    max_difference,
    trained,
    unequal_plan,
    zero_share_plan,
)
from tests.mpi.launch import run_mpi


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    assert main([*COMMON, "--out", str(out)], comm=SingleProcessCommunicator()) == 0
    return trained(out)[0]


def _three_ranks(out, *extra: str):
    result = run_mpi("lbtrain", 3, *COMMON, "--out", str(out), *extra, module=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return trained(out)


def test_three_unequal_ranks_match_one_process_and_the_naive_average_does_not(
    one_process, tmp_path
):
    # Emulated 1x, 2x, 4x devices, overlapped buckets on real Iallreduce.
    plan = str(unequal_plan(tmp_path))
    slow = ("--emulate-slowdown", "1,2,4", "--plan", plan, "--overlap", "on", "--replan", "off")
    model, sizes = _three_ranks(tmp_path / "run", *slow)
    assert sizes == [6, 11, 23]
    assert max_difference(model, one_process) < 1e-5
    naive, _ = _three_ranks(tmp_path / "naive", *slow, "--weighting", "uniform")
    assert max_difference(naive, one_process) > 1e-3


def test_a_rank_with_a_zero_share_keeps_the_update_exact(one_process, tmp_path):
    """Rank 1 gets no samples: it skips compute, adds zeros, and the job still matches."""
    plan = str(zero_share_plan(tmp_path))
    model, sizes = _three_ranks(tmp_path / "run", "--plan", plan, "--replan", "off")
    assert sizes == [26, 0, 14]
    assert max_difference(model, one_process) < 1e-5
