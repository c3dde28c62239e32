"""Exactness through the whole `lbtrain train` command line.

Three ranks with unequal batches (emulated 1x, 2x and 4x devices) must end where one process
ends on the same global batches: the same seed gives the same split, initial weights and
permutations, and the weighted sync makes every update the single-process update. DDP's 1/P
average, run the same way, must not match, so the test is known to be able to fail.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lbtrain.trainer.checkpoint import find_checkpoint, load_checkpoint
from tests.mpi.launch import REPO, run_mpi

# A small synthetic scene, a plain 3-D CNN, dropout 0 (deterministic), SGD.
COMMON = (
    "--dataset synthetic --model hamida --patch-size 3 --dropout 0 --epochs 2 "
    "--global-batch 40 --time-budget 1 --threads 1 --optimizer sgd --lr 0.05 --quiet --no-map"
).split()


def _final_model(out) -> dict:
    return load_checkpoint(find_checkpoint(out))["model"]


def _max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    result = subprocess.run(
        [sys.executable, "-m", "lbtrain", "train", *COMMON, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return _final_model(out)


def _three_ranks(out, *extra: str):
    result = run_mpi(
        "lbtrain",
        3,
        "train",
        *COMMON,
        "--emulate-slowdown",
        "1,2,4",
        "--out",
        str(out),
        *extra,
        module=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    checkpoint = load_checkpoint(find_checkpoint(out))
    return checkpoint["model"], checkpoint["plan"]["batch_sizes"]


@pytest.mark.parametrize(
    ("policy", "overlap"), [("proportional", "on"), ("cost", "on"), ("cost", "off")]
)
def test_three_unequal_ranks_match_one_process(policy, overlap, one_process, tmp_path):
    model, sizes = _three_ranks(tmp_path / "run", "--policy", policy, "--overlap", overlap)
    assert len(set(sizes)) > 1, f"the plan {sizes} should be unequal under 1,2,4 slowdowns"
    assert _max_difference(model, one_process) < 1e-5


def test_the_naive_average_does_not_match(one_process, tmp_path):
    model, sizes = _three_ranks(tmp_path / "run", "--policy", "cost", "--weighting", "uniform")
    assert len(set(sizes)) > 1
    assert _max_difference(model, one_process) > 1e-3


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_a_rank_with_a_zero_share_keeps_the_update_exact(overlap, one_process, tmp_path):
    """Rank 1 gets no samples: it skips compute, adds zeros, and the job still matches."""
    from lbtrain.balancer import BalancePlan, ReplicaSpeed

    speeds = (ReplicaSpeed(100.0), ReplicaSpeed(1.0, alpha=1.0), ReplicaSpeed(50.0))
    plan = BalancePlan("cost", 40, (26, 0, 14), speeds)
    (tmp_path / "plan.json").write_text(plan.to_json(), encoding="utf-8")
    # --replan off keeps the plan for both epochs (auto could hand rank 1 samples again).
    model, sizes = _three_ranks(
        tmp_path / "run",
        *("--plan", str(tmp_path / "plan.json"), "--replan", "off", "--overlap", overlap),
    )
    assert sizes == [26, 0, 14]
    assert _max_difference(model, one_process) < 1e-5
