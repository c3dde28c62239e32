"""Exactness through the whole `lbtrain train` command line, on in-process ranks.

Three ranks with unequal batches must end where one process ends on the same global
batches, to float32 rounding; DDP's 1/P average, run the same way, must not match, so the
comparison is known to be able to fail. The ranks are threads (tests/ranks.py); the same
runs under `mpiexec -n 3` are in tests/mpi/test_train_exactness.py.
"""

from __future__ import annotations

import json

import pytest

from tests.fixtures.exact_runs import (
    COMMON,
    max_difference,
    trained,
    unequal_plan,
    zero_share_plan,
)
from tests.ranks import lbtrain_ranks


def _three_ranks(out, *extra: str):
    job = lbtrain_ranks(3, *COMMON, "--out", str(out), *extra)
    assert job.codes == [0, 0, 0], job.output()
    return trained(out)


def test_profiled_unequal_ranks_match_one_process(one_process, tmp_path):
    # The whole path: profile ranks emulating 1x, 2x and 4x devices, plan by cost, train.
    model, sizes = _three_ranks(tmp_path / "run", "--emulate-slowdown", "1,2,4", "--policy", "cost")
    assert len(set(sizes)) > 1, f"the plan {sizes} should be unequal under 1,2,4 slowdowns"
    assert max_difference(model, one_process) < 1e-5


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_unequal_shares_match_one_process_and_the_naive_average_does_not(
    overlap, one_process, tmp_path
):
    plan = str(unequal_plan(tmp_path))
    model, sizes = _three_ranks(
        tmp_path / "run", "--plan", plan, "--overlap", overlap, "--replan", "off"
    )
    assert sizes == [6, 11, 23]
    assert max_difference(model, one_process) < 1e-5
    naive, _ = _three_ranks(
        tmp_path / "naive",
        "--plan",
        plan,
        "--overlap",
        overlap,
        "--replan",
        "off",
        "--weighting",
        "uniform",
    )
    assert max_difference(naive, one_process) > 1e-3


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_a_rank_with_a_zero_share_keeps_the_update_exact(overlap, one_process, tmp_path):
    """Rank 1 gets no samples: it skips compute, adds zeros, and the job still matches."""
    # --replan off keeps the plan for both epochs (auto could hand rank 1 samples again).
    model, sizes = _three_ranks(
        tmp_path / "run",
        *("--plan", str(zero_share_plan(tmp_path)), "--replan", "off", "--overlap", overlap),
    )
    assert sizes == [26, 0, 14]
    assert max_difference(model, one_process) < 1e-5


@pytest.mark.parametrize("batches", ["own", "shared"])
def test_an_ensemble_on_unequal_ranks_with_a_zero_share_matches_one_process(tmp_path, batches):
    """A deep ensemble's (N, K, M) outputs and its members' mean loss keep the update exact,
    whether each member reads its own batches (of samples picked by index) or all share."""
    from lbtrain import SingleProcessCommunicator
    from lbtrain.cli.entry import main

    ensemble = ("--ensemble", "2", "--ensemble-batches", batches)
    alone = tmp_path / "one"
    assert main([*COMMON, *ensemble, "--out", str(alone)], comm=SingleProcessCommunicator()) == 0
    reference = trained(alone)[0]
    assert any(k.startswith("members.1.") for k in reference), sorted(reference)[:3]
    for name, plan in (("unequal", unequal_plan), ("zero", zero_share_plan)):
        model, _ = _three_ranks(
            tmp_path / name, *ensemble, "--plan", str(plan(tmp_path)), "--replan", "off"
        )
        assert max_difference(model, reference) < 1e-5, name


def _plan_file(path, sizes: list[int]) -> str:
    from lbtrain.balancer import BalancePlan, ReplicaSpeed

    speeds = tuple(ReplicaSpeed(float(max(s, 1)), alpha=float(s == 0)) for s in sizes)
    path.write_text(BalancePlan("cost", sum(sizes), tuple(sizes), speeds).to_json())
    return str(path)


def test_ssftt_with_batchnorm_matches_one_process_and_per_rank_statistics_do_not(tmp_path):
    """SSFTT holds BatchNorm3d and BatchNorm2d: synchronised (the default), three ranks end
    where one process ends, with a zero share too; with `--sync-batchnorm off` they do not.
    (Batches of 41: the 163 training pixels leave a tail of 40, which per-rank BatchNorm can
    take; a tail of 3 cut 1/1/1 it cannot.)"""
    from lbtrain import SingleProcessCommunicator
    from lbtrain.cli.entry import main

    ssftt = [*COMMON, "--model", "ssftt", "--patch-size", "5", "--global-batch", "41"]
    assert main([*ssftt, "--out", str(tmp_path / "one")], comm=SingleProcessCommunicator()) == 0
    alone, _ = trained(tmp_path / "one")
    runs = {"sync": ([27, 0, 14], "on"), "sync2": ([6, 11, 24], "on"), "own": ([6, 11, 24], "off")}
    models = {}
    for out, (sizes, sync) in runs.items():
        plan = _plan_file(tmp_path / f"{out}.json", sizes)
        job = lbtrain_ranks(3, *ssftt, "--plan", plan, "--replan", "off", "--sync-batchnorm",
                            sync, "--out", str(tmp_path / out))  # fmt: skip
        assert job.codes == [0, 0, 0], job.output()
        models[out], planned = trained(tmp_path / out)
        assert planned == sizes
    assert max_difference(models["sync"], alone) < 1e-5
    assert max_difference(models["sync2"], alone) < 1e-5
    assert max_difference(models["own"], alone) > 1e-3


def test_a_tail_with_fewer_samples_than_ranks_is_one_process_step(tmp_path):
    """Batches of 23 leave the 163 training pixels a tail of 2, a step of its own as in one
    process: ranks with shares 4/7/12 cut it 0/1/1, and rank 0 adds zeros there. (Once the
    tail joined the step before on 3 ranks and not on one: 7 steps an epoch against 8.)"""
    from lbtrain import SingleProcessCommunicator
    from lbtrain.cli.entry import main

    args = [*COMMON, "--global-batch", "23"]
    assert main([*args, "--out", str(tmp_path / "one")], comm=SingleProcessCommunicator()) == 0
    alone, _ = trained(tmp_path / "one")
    plan = _plan_file(tmp_path / "plan.json", [4, 7, 12])
    job = lbtrain_ranks(3, *args, "--plan", plan, "--replan", "off", "--out", str(tmp_path / "r"))
    assert job.codes == [0, 0, 0], job.output()
    model, sizes = trained(tmp_path / "r")
    assert sizes == [4, 7, 12]
    assert max_difference(model, alone) < 1e-5
    # Rank 0 computed 7 of each epoch's 8 steps: what the re-planner's per-step line reads.
    epochs = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").open()]
    for epoch in (e for e in epochs if e["type"] == "epoch"):
        assert epoch["steps"] == 8 and [r["busy_steps"] for r in epoch["ranks"]] == [7, 8, 8]
