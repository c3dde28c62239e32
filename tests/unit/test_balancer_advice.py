"""The ideal step, zero-share ranks and the launch advice of lbtrain.balancer.advice.

The fixtures are read with `json` and turned into ReplicaSpeed by hand, so these tests load
neither torch nor the profiling package; expected figures come from the fixtures' alpha and
beta, worked out in the tests.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lbtrain.balancer import (
    POLICIES,
    CommCost,
    ReplicaSpeed,
    ideal_step,
    idle_ranks_note,
    min_batch_note,
    plan_batches,
    subset_note,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# Relative slack for float noise in the step sums (T* itself is bisected to the last bit).
SLACK = 1e-12


def _fixture_replicas(name: str) -> list[ReplicaSpeed]:
    """ReplicaSpeed per rank from a profiles fixture, throughput read at its reference batch."""
    data = json.loads((FIXTURES / name).read_text())
    replicas = []
    for p in data["profiles"]:
        ref = p["reference_batch"]
        throughput = ref / (p["alpha"] + p["beta"] * ref)
        replicas.append(ReplicaSpeed(throughput, p["alpha"], p["beta"], p["cap"]))
    return replicas


GPU_CPU = _fixture_replicas("profiles_gpu_cpu.json")
CPUS = _fixture_replicas("profiles_3ranks.json")

# GPU + CPU fixture at B = 1024, by hand (ms): the GPU alone takes 1.5 + 0.0006 x 1024 =
# 2.1144, shorter than any CPU's fixed cost but rank 1's 2.1, so only rank 1 could join; T*
# solves (T - 1.5) / 0.0006 + (T - 2.1) / 0.06 = 1024: T = (1024 + 2500 + 35) / (1666.67 +
# 16.667) = 2.114257 ms, just above 2.1, and rank 1's share at T* is 0.24 samples: the
# integer optimum gives it none.
GPU_ALONE = 1.5e-3 + 0.6e-6 * 1024
T_STAR_GPU_CPU = (1024 + 1.5 / 0.0006 + 2.1 / 0.06) / (1 / 0.0006 + 1 / 0.06) * 1e-3
# With min_batch 1 the CPUs take one sample each: 2.6 + 0.065 = 2.665 ms on rank 3.
ONE_EACH = 2.6e-3 + 65e-6


@st.composite
def cases(draw):
    """Random replicas, caps, min_batch, B and sync cost that every policy can plan."""
    count = draw(st.integers(1, 5))
    min_batch = draw(st.integers(0, 4))
    floor = max(1, min_batch)  # equal and proportional give every rank at least 1
    total = draw(st.integers(count * floor, 600))
    replicas = []
    for _ in range(count):
        throughput = draw(st.floats(0.5, 5000, allow_nan=False, allow_infinity=False))
        alpha = draw(st.floats(0, 0.5, allow_nan=False, allow_infinity=False))
        cap = draw(st.none() | st.integers(floor, 600))
        replicas.append(ReplicaSpeed(throughput, alpha, None, cap))
    assume(sum(math.inf if r.cap is None else r.cap for r in replicas) >= total)
    comm = draw(
        st.none()
        | st.builds(
            CommCost,
            seconds=st.floats(0, 0.5, allow_nan=False, allow_infinity=False),
            world_size=st.integers(1, 8),
        )
    )
    return replicas, total, min_batch, comm


@given(cases())
@settings(max_examples=300, deadline=None)
def test_no_plan_beats_the_ideal_step(case):
    replicas, total, min_batch, comm = case
    plans = [plan_batches(replicas, total, p, min_batch=min_batch, comm=comm) for p in POLICIES]
    for plan in plans:
        assert ideal_step(plan).step <= plan.predicted_step_time * (1 + SLACK)
    # ideal_step clamps T* to its own plan's compute; across plans, every plan's ideal must
    # still lie below every other plan, or T* was computed too high.
    for own, other in itertools.product(plans, repeat=2):
        assert ideal_step(own).step <= other.predicted_step_time * (1 + SLACK)


def _brute_force_compute(replicas: list[ReplicaSpeed], total: int) -> float:
    """The least max compute over every integer composition of `total` (0 s at a zero share)."""
    best = math.inf
    for sizes in itertools.product(range(total + 1), repeat=len(replicas)):
        if sum(sizes) != total:
            continue
        if any(r.cap is not None and b > r.cap for r, b in zip(replicas, sizes, strict=True)):
            continue
        best = min(
            best, max(r.step_time(b) if b else 0.0 for r, b in zip(replicas, sizes, strict=True))
        )
    return best


@st.composite
def small_cases(draw):
    count = draw(st.integers(1, 3))
    total = draw(st.integers(1, 12))
    replicas = [
        ReplicaSpeed(
            draw(st.floats(0.5, 5000, allow_nan=False, allow_infinity=False)),
            draw(st.floats(0, 0.5, allow_nan=False, allow_infinity=False)),
            None,
            draw(st.none() | st.integers(1, 12)),
        )
        for _ in range(count)
    ]
    assume(sum(math.inf if r.cap is None else r.cap for r in replicas) >= total)
    return replicas, total


@given(small_cases())
@settings(max_examples=300, deadline=None)
def test_cost_plan_with_zero_shares_is_the_integer_optimum(case):
    replicas, total = case
    plan = plan_batches(replicas, total, "cost", min_batch=0)
    best = _brute_force_compute(replicas, total)
    assert plan.predicted_compute_time <= best * (1 + SLACK)
    assert ideal_step(plan).compute <= best * (1 + SLACK)


def test_brute_force_sees_a_zero_share():
    # Guard on the oracle itself: one fast replica beside one whose fixed cost alone is
    # longer than the fast one's whole step; the best composition gives the slow one none.
    fast, slow = ReplicaSpeed(1000.0, 0.001), ReplicaSpeed(1000.0, 0.5)
    assert _brute_force_compute([fast, slow], 10) == pytest.approx(0.001 + 10 / 1000)
    assert plan_batches([fast, slow], 10, "cost", min_batch=0).batch_sizes == (10, 0)


@pytest.mark.parametrize("policy", POLICIES)
def test_gpu_cpu_fixture_efficiency_never_above_one(policy):
    plan = plan_batches(GPU_CPU, 1024, policy, min_batch=0)
    ideal = ideal_step(plan)
    assert ideal.compute == pytest.approx(T_STAR_GPU_CPU, rel=1e-9)
    assert ideal.comm == 0.0
    assert ideal.step / plan.predicted_step_time <= 1.0


def test_gpu_cpu_fixture_cost_plan_leaves_the_cpus_out_and_says_why():
    plan = plan_batches(GPU_CPU, 1024, "cost", min_batch=0)
    assert plan.batch_sizes == (1024, 0, 0, 0)
    assert plan.idle_ranks == (1, 2, 3)
    assert plan.predicted_step_times == pytest.approx((GPU_ALONE, 0.0, 0.0, 0.0))
    assert plan.predicted_step_time == pytest.approx(GPU_ALONE)
    note = idle_ranks_note(plan)
    assert note is not None and "ranks 1, 2, 3 get no samples" in note
    assert min_batch_note(plan) is None
    # Zero shares already cost nothing, so launching rank 0 alone is no faster.
    assert subset_note(plan) is None


def test_gpu_cpu_fixture_with_min_batch_one_names_what_zero_shares_save():
    plan = plan_batches(GPU_CPU, 1024, "cost", min_batch=1)
    assert plan.batch_sizes == (1021, 1, 1, 1)
    assert plan.predicted_step_time == pytest.approx(ONE_EACH)
    assert idle_ranks_note(plan) is None
    note = min_batch_note(plan)
    assert note is not None
    assert "min_batch=0" in note and "ranks 1, 2, 3" in note and "2.11 ms" in note
    assert "2.67 ms" in note


@pytest.mark.parametrize("policy", POLICIES)
def test_cpu_fixture_efficiency_never_above_one(policy):
    # T* = (B + sum alpha/beta) / sum(1/beta), every rank's share positive (in ms):
    # (300 + 10/0.9 + 30/1.7 + 40/3.6) / (1/0.9 + 1/1.7 + 1/3.6) = 171.901 ms.
    t_star = (300 + 10 / 0.9 + 30 / 1.7 + 40 / 3.6) / (1 / 0.9 + 1 / 1.7 + 1 / 3.6) * 1e-3
    plan = plan_batches(CPUS, 300, policy, min_batch=0)
    assert ideal_step(plan).compute == pytest.approx(t_star, rel=1e-9)
    assert ideal_step(plan).step / plan.predicted_step_time <= 1.0
    assert plan.idle_ranks == ()
    assert idle_ranks_note(plan) is None and min_batch_note(plan) is None


def test_subset_note_when_the_sync_makes_one_rank_faster():
    # 5 ms of sync on 4 ranks: all four take 2.1144 + 5 ms, rank 0 alone 2.1144 ms (one
    # rank reduces nothing).
    comm = CommCost(seconds=5e-3, world_size=4)
    plan = plan_batches(GPU_CPU, 1024, "cost", min_batch=0, comm=comm)
    assert plan.predicted_step_time == pytest.approx(GPU_ALONE + 5e-3)
    assert ideal_step(plan).comm == pytest.approx(5e-3)
    note = subset_note(plan)
    assert note is not None
    assert "rank 0 only" in note and "2.11 ms/step" in note and "7.11 ms" in note


@pytest.mark.parametrize(
    ("replicas", "total", "comm"),
    [
        (GPU_CPU, 1024, None),
        # 0.05 ms of sync: rank 0 alone saves 2.3%, under the 5% worth advising.
        (GPU_CPU, 1024, CommCost(seconds=5e-5, world_size=4)),
        (CPUS, 300, None),
        # 1 ms of sync beside a 173 ms step: dropping a CPU rank costs far more.
        (CPUS, 300, CommCost(seconds=1e-3, world_size=3)),
    ],
)
def test_no_subset_note_otherwise(replicas, total, comm):
    plan = plan_batches(replicas, total, "cost", min_batch=0, comm=comm)
    assert subset_note(plan) is None
