"""best_subset and subset_note against the old advice: plan every subset, take the best.

The reference below is the advice as it was before issue 22 (one cost plan per k), kept
here as the slow, simple oracle; the new code must choose the same ranks with the same
figures, and write the same note.
"""

from __future__ import annotations

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lbtrain.balancer import CommCost, ReplicaSpeed, plan_batches, subset_note
from lbtrain.balancer.advice import WORTHWHILE, _ms, _ranks
from lbtrain.balancer.plan import cost_sizes
from lbtrain.balancer.subsets import (
    SubsetPrediction,
    _compute_bounds,
    _speed_order,
    best_subset,
)


def _reference_predictions(replicas, total, comm):
    """The pre-issue-22 subset_predictions, verbatim."""
    count = len(replicas)
    equal = total / count
    order = sorted(range(count), key=lambda i: (replicas[i].step_time(equal), i))
    predictions = []
    for k in range(count, 0, -1):
        keep = sorted(order[:k])
        chosen = [replicas[i] for i in keep]
        upper = [math.inf if r.cap is None else r.cap for r in chosen]
        if sum(upper) < total:
            break
        sizes = cost_sizes(chosen, total, [0] * k, upper)
        compute = max(r.step_time(b) for r, b in zip(chosen, sizes, strict=True) if b > 0)
        sync = 0.0 if comm is None else comm.time(k)
        predictions.append(SubsetPrediction(tuple(keep), tuple(sizes), compute, sync))
    return predictions


def _reference_note(plan):
    """The pre-issue-22 subset_note, verbatim but for the reference predictions (and the
    noun, which now agrees with the count: "rank 3", "ranks 0, 1")."""
    predictions = _reference_predictions(plan.replicas, plan.global_batch_size, plan.comm)
    if not predictions:
        return None
    best = min(predictions, key=lambda p: (p.step, -len(p.ranks)))
    slower = best.step >= (1 - WORTHWHILE) * plan.predicted_step_time
    if len(best.ranks) == plan.world_size or slower:
        return None
    return (
        f"the fastest launch uses {_ranks(best.ranks)} only: {_ms(best.step)} ms/step "
        f"against {_ms(plan.predicted_step_time)} ms with all {plan.world_size}; launch "
        f"{len(best.ranks)} rank{'s' if len(best.ranks) != 1 else ''} on those devices"
    )


@st.composite
def clusters(draw):
    """Heterogeneous ranks: fast, slow, some whose fixed cost alone outlasts the rest, with
    caps (some below B / P), repeated ranks (ties), a sync cost or none, and min_batch."""
    count = draw(st.integers(1, 14))
    kinds = st.sampled_from(["gpu", "cpu", "slow", "zero-alpha"])
    replicas = []
    for _ in range(count):
        kind = draw(kinds)
        if replicas and draw(st.booleans()) and draw(st.booleans()):
            replicas.append(draw(st.sampled_from(replicas)))  # identical ranks: exact ties
            continue
        alpha = {"gpu": draw(st.floats(1e-4, 5e-3)), "cpu": draw(st.floats(5e-3, 0.05)),
                 "slow": draw(st.floats(0.2, 2.0)), "zero-alpha": 0.0}[kind]  # fmt: skip
        beta = draw(st.floats(1e-7, 1e-5) if kind == "gpu" else st.floats(1e-4, 5e-3))
        cap = draw(st.none() | st.integers(1, 3000))
        replicas.append(ReplicaSpeed(1.0 / beta, alpha, beta, cap))
    total = draw(st.integers(1, 4000))
    assume(sum(math.inf if r.cap is None else r.cap for r in replicas) >= total)
    comm = draw(
        st.none() | st.builds(CommCost, seconds=st.floats(0, 0.05), world_size=st.integers(1, 16))
    )
    min_batch = draw(st.integers(0, 2))
    return replicas, total, comm, min_batch


@given(clusters())
@settings(max_examples=400, deadline=None)
def test_best_subset_is_the_old_best(case):
    replicas, total, comm, _ = case
    predictions = _reference_predictions(replicas, total, comm)
    expected = min(predictions, key=lambda p: (p.step, -len(p.ranks))) if predictions else None
    assert best_subset(replicas, total, comm) == expected


@given(clusters())
@settings(max_examples=400, deadline=None)
def test_bounds_lie_below_every_plan_of_every_subset(case):
    replicas, total, comm, _ = case
    bounds = _compute_bounds(replicas, _speed_order(replicas, total), total)
    for prediction in _reference_predictions(replicas, total, comm):
        assert bounds[len(prediction.ranks) - 1] <= prediction.compute


@given(clusters())
@settings(max_examples=300, deadline=None)
def test_subset_note_is_the_old_note(case):
    replicas, total, comm, min_batch = case
    assume(total >= len(replicas) * min_batch)
    assume(all(r.cap is None or r.cap >= min_batch for r in replicas))
    plan = plan_batches(replicas, total, "cost", min_batch=min_batch, comm=comm)
    assert subset_note(plan) == _reference_note(plan)


def test_the_note_fires_and_matches_when_the_sync_outweighs_slow_ranks():
    # Two fast ranks, six CPU-like ones and 20 ms of sync: one fast rank alone (6.12 ms, no
    # sync) beats all eight (32 ms) and the two fast ones (6.12 / 2 + 1 + 10 ms of sync).
    replicas = [ReplicaSpeed(1e5, 1e-3, 1e-5)] * 2 + [ReplicaSpeed(500.0, 0.01, 2e-3)] * 6
    plan = plan_batches(replicas, 512, "cost", min_batch=1, comm=CommCost(0.02, 8))
    note = subset_note(plan)
    assert note is not None and "rank 0 only" in note
    assert note == _reference_note(plan)
