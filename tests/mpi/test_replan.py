"""Re-planning while training: an emulated slowdown that swaps mid-run.

Rank 0 starts fast and rank 1 4x slow; from epoch 3 of 9 on it is the other way round. With
`--replan auto` the plan must follow (rank 1 gets the larger share after the change), with
`--replan off` it must not move, and both runs must end on the same weights (the update does
not depend on how the batch is split). The measured idle time through the change is a
benchmark (`scripts/bench_train.py replan`), not a test: it depends on the machine's load.

The `auto` run needs real processes: its decisions follow measured compute, and ranks that
are threads of one process share the interpreter, which blurs what each rank measures. The
`off` run decides nothing from timing, so it runs on in-process ranks (tests/ranks.py).
"""

from __future__ import annotations

import re

from lbtrain.balancer import BalancePlan, ReplicaSpeed
from lbtrain.trainer.checkpoint import find_checkpoint, load_checkpoint
from tests.fixtures.run_files import epoch_records
from tests.mpi.launch import run_mpi
from tests.ranks import lbtrain_ranks

COMMON = (
    "--dataset synthetic --model hamida --patch-size 5 --train-ratio 0.5 --dropout 0 "
    "--epochs 9 --global-batch 64 --threads 1 --no-map --curves off --devices cpu"
).split()  # --devices cpu: emulated CPU ranks, also where the machine has a GPU
# 9 epochs: the change comes at epoch 3, and on a loaded machine the first move after it can
# stop at an equal split (seen once in a full suite: 58/6, then 32/32 for the last 2 of 7
# epochs); the epochs after it finish the move.
EMULATED = "--time-budget 2 --emulate-slowdown 1,4 --emulate-change 3:4,1".split()


def _outcome(out):
    model = load_checkpoint(find_checkpoint(out))["model"]
    return [epoch["batch_sizes"] for epoch in epoch_records(out)], model


def _first_plan(folder, sizes: list[int]):
    speeds = tuple(ReplicaSpeed(float(max(size, 1))) for size in sizes)
    path = folder / "first-plan.json"
    path.write_text(BalancePlan("cost", sum(sizes), tuple(sizes), speeds).to_json())
    return path


def test_the_plan_follows_a_mid_run_slowdown_change_only_with_replan_auto(tmp_path):
    auto = run_mpi(
        "lbtrain", 2, "train", *COMMON, *EMULATED, "--replan", "auto",
        "--out", str(tmp_path / "auto"), module=True, timeout=240,
    )  # fmt: skip
    assert auto.returncode == 0, auto.stdout + auto.stderr
    batches, auto_model = _outcome(tmp_path / "auto")
    first, last = batches[0], batches[-1]
    assert first[0] > first[1], f"rank 0 starts 4x faster and must get more: {batches}"
    assert last[1] > last[0], f"after the swap rank 1 is the fast one: {batches}"
    # Epochs 3 and 4 measured the change (two that agree): the first switch that follows it
    # comes after epoch 4 (on a quiet machine, exactly then). On a loaded one the measured
    # rates are noisier, the first move can fall short, and the epochs after it finish the
    # move: the last plan above is what must hold.
    after = [int(n) for n in re.findall(r"after epoch (\d+): re-planned", auto.stdout)]
    assert any(n >= 4 for n in after), auto.stdout
    # These steps are really timed, on a machine that may be busy: a loaded core can also
    # move a rank's measured speed before the change (seen: a re-plan after epoch 2 too), so
    # the count is not asserted here; that noise alone never switches is checked on model
    # clocks (tests/unit/test_replan.py). The summary counts what the epoch lines show.
    shown = auto.stdout.count(": re-planned")
    assert f"re-planned {shown} time(s)" in auto.stdout, auto.stdout

    # The same run with --replan off, from the auto run's first plan: the batches never
    # move, and the weights are the auto run's, up to float32 rounding (other splits of the
    # same global batches). Nothing is decided from timing, so no emulation is needed.
    off = lbtrain_ranks(
        2, "train", *COMMON, "--replan", "off", "--plan", str(_first_plan(tmp_path, first)),
        "--out", str(tmp_path / "off"),
    )  # fmt: skip
    assert off.codes == [0, 0], off.output()
    batches, off_model = _outcome(tmp_path / "off")
    assert all(b == first for b in batches), batches
    assert "re-planned" not in off.stdout
    assert auto_model.keys() == off_model.keys()
    difference = max(
        (auto_model[k].double() - off_model[k].double()).abs().max().item() for k in auto_model
    )
    assert difference < 1e-5
