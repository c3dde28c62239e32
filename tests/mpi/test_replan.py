"""Re-planning while training: an emulated slowdown that swaps mid-run.

Rank 0 starts fast and rank 1 4x slow; from epoch 3 on it is the other way round. With
`--replan auto` the plan must follow (rank 1 gets the larger share after the change), with
`--replan off` it must not move, and both runs must end on the same weights (the update does
not depend on how the batch is split). The measured idle time through the change is a
benchmark (`scripts/bench_train.py replan`), not a test: it depends on the machine's load.
"""

from __future__ import annotations

import json

import pytest

from lbtrain.trainer.checkpoint import find_checkpoint, load_checkpoint
from tests.mpi.launch import run_mpi

COMMON = (
    "--dataset synthetic --model hamida --patch-size 5 --train-ratio 0.5 --dropout 0 "
    "--epochs 5 --global-batch 64 --time-budget 2 --threads 1 --no-map "
    "--emulate-slowdown 1,4 --emulate-change 3:4,1"
).split()


def _train(out, replan: str):
    result = run_mpi(
        "lbtrain", 2, "train", *COMMON, "--replan", replan, "--out", str(out),
        module=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    model = load_checkpoint(find_checkpoint(out))["model"]
    return result.stdout, [epoch["batch_sizes"] for epoch in summary["epochs"]], model


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {mode: _train(tmp_path_factory.mktemp(mode) / "run", mode) for mode in ("auto", "off")}


@pytest.mark.parametrize("replan", ["auto", "off"])
def test_the_plan_follows_a_mid_run_slowdown_change_only_with_replan_auto(replan, runs):
    log, batches, _ = runs[replan]
    first, last = batches[0], batches[-1]
    assert first[0] > first[1], f"rank 0 starts 4x faster and must get more: {batches}"
    if replan == "off":
        assert all(b == first for b in batches), batches
        assert "re-planned" not in log
    else:
        assert last[1] > last[0], f"after the swap rank 1 is the fast one: {batches}"
        assert "after epoch 3: re-planned" in log, log


def test_re_planning_leaves_the_trained_weights_unchanged(runs):
    """Other splits of the same global batches: equal up to float32 rounding."""
    auto, off = runs["auto"][2], runs["off"][2]
    assert auto.keys() == off.keys()
    difference = max((auto[k].double() - off[k].double()).abs().max().item() for k in auto)
    assert difference < 1e-5
