"""Re-planning from measured rates, and the emulated slowdown schedule that exercises it."""

from __future__ import annotations

import pytest

from lbtrain.balancer import BalancePlan, ReplicaSpeed, plan_batches
from lbtrain.emulation import Slowdown, factor_at, parse_slowdown_changes, slowdown_schedule
from lbtrain.trainer.replan import predicted_steps, propose, rescaled_replicas

SPEEDS = [ReplicaSpeed(1000.0, alpha=0.001), ReplicaSpeed(250.0, alpha=0.004)]


def measured(plan: BalancePlan, factors: list[float]) -> list[dict[str, float]]:
    """What each rank would measure over 10 steps if its device were `factor` x the model."""
    rows = []
    for rank, factor in enumerate(factors):
        predicted = 10 * predicted_steps(plan, plan.batch_sizes, rank)[0]
        samples = 10.0 * plan.batch_sizes[rank]
        rows.append({"compute": predicted * factor, "predicted": predicted, "samples": samples})
    return rows


def test_a_swap_of_speeds_swaps_the_plan():
    plan = plan_batches(SPEEDS, 100, "cost")
    assert plan.batch_sizes[0] > plan.batch_sizes[1]
    change = propose(plan, measured(plan, [4.0, 0.25]))
    assert change is not None
    assert change.plan.batch_sizes[1] > change.plan.batch_sizes[0]
    assert change.new_step < 0.95 * change.old_step
    assert change.factors == pytest.approx((4.0, 0.25))
    assert "re-planned: batches" in change.describe(plan)


def test_measurements_that_match_the_model_keep_the_plan():
    plan = plan_batches(SPEEDS, 100, "cost")
    assert propose(plan, measured(plan, [1.0, 1.0])) is None
    # The same drift on every rank changes no ratio: nothing to gain.
    assert propose(plan, measured(plan, [1.3, 1.3])) is None


def test_a_gain_below_five_percent_is_ignored_as_noise():
    plan = plan_batches(SPEEDS, 100, "cost")
    assert propose(plan, measured(plan, [1.02, 1.0])) is None


def test_equal_never_replans_and_zero_share_ranks_keep_their_model():
    plan = plan_batches(SPEEDS, 100, "equal")
    assert propose(plan, measured(plan, [4.0, 0.25])) is None
    idle = BalancePlan("cost", 100, (100, 0), SPEEDS)
    replicas, factors = rescaled_replicas(idle, measured(idle, [2.0, 1.0]))
    assert factors == (pytest.approx(2.0), None)
    assert replicas[1] == SPEEDS[1]
    assert replicas[0].alpha == pytest.approx(2 * SPEEDS[0].alpha)


def test_slowdown_changes_parse_and_apply_from_their_epoch():
    changes = parse_slowdown_changes("3:4,1; 5:2", 2)
    assert changes == ((2, (4.0, 1.0)), (4, (2.0, 2.0)))
    assert [factor_at(e, 0, 1.0, changes) for e in range(6)] == [1, 1, 4, 4, 2, 2]
    assert [factor_at(e, 1, 4.0, changes) for e in range(6)] == [4, 4, 1, 1, 2, 2]
    base = Slowdown(4.0)
    at = slowdown_schedule("3:4,1", base, 1, 2)
    assert at(0) is base and at(2).factor == 1.0
    assert parse_slowdown_changes(None, 3) == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3", "not EPOCH:FACTORS"),
        ("0:1,1", "epoch >= 1"),
        ("x:1,1", "not EPOCH:FACTORS"),
        ("3:1,1;2:1,1", "epochs must increase"),
        ("3:1,2,3", "has 3 factors but the job has 2"),
        ("3:0.5,1", "below 1"),
    ],
)
def test_bad_slowdown_changes_are_one_line_naming_the_value(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_slowdown_changes(text, 2)
    assert "\n" not in str(info.value) and "emulate_change=" in str(info.value)
