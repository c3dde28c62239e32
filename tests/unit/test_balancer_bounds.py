"""The planner returns, or refuses with its documented bound, for any batch and speed ratio.

A hang would stall the suite, so each call runs under an alarm that turns it into a failure.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbtrain.balancer import MAX_GLOBAL_BATCH, POLICIES, ReplicaSpeed, plan_batches


@contextmanager
def deadline(seconds: int = 5) -> Iterator[None]:
    def expired(signum, frame):
        raise TimeoutError(f"the planner did not return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("total", [2**31, 2**40, MAX_GLOBAL_BATCH])
def test_batches_up_to_the_bound_are_planned_exactly(policy, total):
    with deadline():
        plan = plan_batches([1.0, 2.0, ReplicaSpeed(5.0, alpha=0.01)], total, policy)
    assert sum(plan.batch_sizes) == total


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("total", [MAX_GLOBAL_BATCH + 1, 10**18, 2**63, 10**30])
def test_batches_above_the_bound_are_refused_with_it(policy, total):
    with deadline(), pytest.raises(ValueError, match=r"2\*\*53"):
        plan_batches([1.0, 2.0], total, policy)


@settings(max_examples=60, deadline=None)
@given(
    exponent=st.floats(min_value=0, max_value=300),
    total=st.integers(min_value=3, max_value=MAX_GLOBAL_BATCH),
    alpha=st.sampled_from([0.0, 1e-3, 0.5]),
    policy=st.sampled_from(POLICIES),
)
def test_any_finite_speed_ratio_returns_a_valid_plan(exponent, total, alpha, policy):
    fast = 10.0**exponent
    ranks = [ReplicaSpeed(1.0, alpha=alpha), ReplicaSpeed(fast), 3.0]
    with deadline():
        plan = plan_batches(ranks, total, policy)
    assert sum(plan.batch_sizes) == total  # BalancePlan also checks it on construction
    if policy == "proportional" and fast > 1.0:  # a faster replica never gets fewer samples
        assert plan.batch_sizes[1] >= plan.batch_sizes[0]
