"""The balancer's arithmetic: properties over many inputs, and its errors."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lbtrain.balancer import POLICIES, BalancePlan, ReplicaSpeed, plan_batches

BALANCER_DIR = Path(__file__).resolve().parents[2] / "lbtrain" / "balancer"

speeds = st.floats(min_value=0.5, max_value=5000.0, allow_nan=False, allow_infinity=False)
alphas = st.floats(min_value=0.0, max_value=0.5, allow_nan=False, allow_infinity=False)


@st.composite
def replicas_and_batch(draw, with_caps: bool = False):
    count = draw(st.integers(min_value=1, max_value=8))
    reps = [ReplicaSpeed(draw(speeds), alpha=draw(alphas)) for _ in range(count)]
    min_batch = draw(st.integers(min_value=0, max_value=4))
    batch = draw(st.integers(min_value=count * max(1, min_batch), max_value=600))
    caps = None
    if with_caps:
        caps = [
            draw(st.one_of(st.none(), st.integers(min_value=max(1, min_batch), max_value=200)))
            for _ in range(count)
        ]
        assume(sum(math.inf if c is None else c for c in caps) >= batch)
    return reps, batch, caps, min_batch


@settings(max_examples=300, deadline=None)
@given(replicas_and_batch(with_caps=True), st.sampled_from(POLICIES))
def test_sizes_sum_to_global_batch_and_honour_caps_and_minimum(case, policy):
    reps, batch, caps, min_batch = case
    plan = plan_batches(reps, batch, policy, caps=caps, min_batch=min_batch)
    assert sum(plan.batch_sizes) == batch
    assert all(b >= min_batch for b in plan.batch_sizes)
    for size, cap in zip(plan.batch_sizes, caps, strict=True):
        assert cap is None or size <= cap
    assert math.isclose(sum(plan.weights), 1.0)


@settings(max_examples=300, deadline=None)
@given(replicas_and_batch())
def test_proportional_never_gives_a_faster_replica_fewer_samples(case):
    reps, batch, _, min_batch = case
    plan = plan_batches(reps, batch, "proportional", min_batch=min_batch)
    for i, ri in enumerate(reps):
        for j, rj in enumerate(reps):
            if ri.throughput > rj.throughput:
                assert plan.batch_sizes[i] >= plan.batch_sizes[j], (i, j, plan.batch_sizes)


@settings(max_examples=300, deadline=None)
@given(replicas_and_batch(with_caps=True))
def test_cost_slowest_step_never_worse_than_proportional_or_equal(case):
    reps, batch, caps, min_batch = case
    cost = plan_batches(reps, batch, "cost", caps=caps, min_batch=min_batch)
    for other in ("proportional", "equal"):
        baseline = plan_batches(reps, batch, other, caps=caps, min_batch=min_batch)
        assert cost.predicted_step_time <= baseline.predicted_step_time * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(replicas_and_batch(with_caps=True))
def test_cost_plan_is_the_integer_optimum(case):
    """No single move of one sample between two replicas lowers the slowest step time."""
    reps, batch, caps, min_batch = case
    plan = plan_batches(reps, batch, "cost", caps=caps, min_batch=min_batch)
    sizes = list(plan.batch_sizes)
    worst = plan.predicted_step_time
    slow = max(range(len(sizes)), key=lambda i: plan.predicted_step_times[i])
    for j in range(len(sizes)):
        cap = plan.replicas[j].cap
        if j == slow or sizes[slow] == min_batch or (cap is not None and sizes[j] >= cap):
            continue
        moved = sizes.copy()
        moved[slow] -= 1
        moved[j] += 1
        # A rank with no samples computes nothing: 0 s, not its fixed cost.
        new_worst = max(
            r.step_time(b) if b else 0.0 for r, b in zip(plan.replicas, moved, strict=True)
        )
        assert new_worst >= worst - 1e-12


def test_proportional_matches_hand_computed_shares():
    # 1:2:5 of 80 is exactly 10, 20, 50.
    assert plan_batches([10, 20, 50], 80).batch_sizes == (10, 20, 50)
    # 1:1:1 of 10 leaves one sample over; it goes to one replica, not to the largest.
    assert plan_batches([5.0, 5.0, 5.0], 10, "proportional").batch_sizes == (4, 3, 3)


def test_largest_remainder_does_not_dump_the_remainder_on_the_largest_replica():
    # Targets 21*(1,1,1,4)/7 = 3, 3, 3, 12: exact; 22 spreads the extra sample alone,
    # but 25 -> 3.57, 3.57, 3.57, 14.29 must give the three small ones their rounding.
    plan = plan_batches([1, 1, 1, 4], 25)
    assert plan.batch_sizes == (4, 4, 3, 14)


def test_equal_policy_is_the_unbalanced_baseline():
    assert plan_batches([1, 100, 10000], 9, "equal").batch_sizes == (3, 3, 3)


def test_cost_policy_accounts_for_fixed_step_cost():
    # Equal throughput but one replica pays 0.1 s per step before any sample: the cost policy
    # gives it fewer samples, proportional cannot see the difference.
    reps = [ReplicaSpeed(100.0, alpha=0.0), ReplicaSpeed(100.0, alpha=0.1)]
    assert plan_batches(reps, 40, "proportional").batch_sizes == (20, 20)
    cost = plan_batches(reps, 40, "cost")
    assert cost.batch_sizes == (25, 15)
    assert cost.predicted_step_time < plan_batches(reps, 40, "proportional").predicted_step_time


def test_caps_redistribute_to_the_others():
    plan = plan_batches([1.0, 1.0, 8.0], 100, "proportional", caps=[None, None, 30])
    assert plan.batch_sizes == (35, 35, 30)


def test_plan_round_trips_through_json():
    reps = [ReplicaSpeed(120.0, alpha=0.01, cap=64), ReplicaSpeed(40.0, alpha=0.02), 15.0]
    plan = plan_batches(reps, 77, "cost")
    text = plan.to_json()
    assert BalancePlan.from_json(text) == plan
    data = json.loads(text)
    assert data["batch_sizes"] == list(plan.batch_sizes)
    assert data["predicted_step_times"] == pytest.approx(list(plan.predicted_step_times))


def test_plan_validation_rejects_tampered_json():
    data = plan_batches([1.0, 2.0], 12).to_dict()
    data["batch_sizes"] = [3, 10]
    with pytest.raises(ValueError, match="sum to 13"):
        BalancePlan.from_dict(data)
    with pytest.raises(ValueError, match="not a BalancePlan"):
        BalancePlan.from_dict({"policy": "equal"})


def test_profile_like_records_are_accepted():
    class Record:
        def replica_speed(self) -> ReplicaSpeed:
            return ReplicaSpeed(50.0, alpha=0.01, cap=8)

    plan = plan_batches([Record(), Record()], 16, "cost")
    assert plan.batch_sizes == (8, 8)


@pytest.mark.parametrize(
    ("ranks", "batch", "kwargs", "message"),
    [
        ([1.0, 2.0, 3.0], 2, {}, r"global_batch_size=2 is smaller than 3 replicas"),
        ([1.0, 0.0], 8, {}, r"ranks\[1\]=0.0 is not a valid throughput"),
        ([1.0, -3.0], 8, {}, r"ranks\[1\]=-3.0 is not a valid throughput"),
        ([1.0, float("nan")], 8, {}, r"ranks\[1\]=nan is not a valid throughput"),
        ([1.0, 2.0], 100, {"caps": [10, 20]}, r"caps \[10, 20\] hold at most 30 samples"),
        ([1.0, 2.0], 10, {"caps": [10]}, r"caps has 1 entries but ranks has 2"),
        ([1.0, 2.0], 10, {"policy": "fastest"}, r"policy='fastest' is unknown"),
        ([], 10, {}, r"ranks is empty"),
        ([1.0, 2.0], 10, {"min_batch": -1}, r"min_batch=-1 is invalid"),
        (["fast"], 10, {}, r"ranks\[0\] has type str"),
    ],
)
def test_bad_input_names_the_parameter_and_value(ranks, batch, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        plan_batches(ranks, batch, **kwargs)


def test_balancer_source_imports_neither_torch_nor_mpi4py():
    for path in BALANCER_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                root = name.split(".")[0]
                assert root not in {"torch", "mpi4py", "numpy"}, f"{path.name} imports {name}"


def test_importing_the_balancer_loads_neither_torch_nor_mpi4py():
    code = (
        "import sys, lbtrain.balancer as b; b.plan_batches([1.0, 2.0], 9, 'cost');"
        "bad = {'torch', 'mpi4py'} & set(sys.modules); assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
