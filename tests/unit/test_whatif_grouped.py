"""lbtrain.whatif.grouped gives the step of `plan_batches` over every device, per group."""

from __future__ import annotations

import math
import random

import pytest

from lbtrain.balancer import ReplicaSpeed, plan_batches
from lbtrain.whatif.grouped import GroupShare, grouped_plan


def _expanded(counts, alphas, betas):
    replicas = []
    for n, a, b in zip(counts, alphas, betas, strict=True):
        replicas += [ReplicaSpeed(1 / b, alpha=a, beta=b)] * n
    return replicas


def _step(shares, alphas, betas):
    return max(a + b * s.batch_max if s.batch_max else 0.0
               for s, a, b in zip(shares, alphas, betas, strict=True))  # fmt: skip


@pytest.mark.parametrize("policy", ["equal", "proportional", "cost"])
@pytest.mark.parametrize("seed", range(40))
def test_grouped_plan_matches_plan_batches(policy, seed):
    rng = random.Random(seed)
    groups = rng.randint(1, 4)
    counts = [rng.randint(1, 9) for _ in range(groups)]
    alphas = [rng.choice([0.0, rng.uniform(0, 0.05)]) for _ in range(groups)]
    betas = [rng.uniform(1e-4, 1e-2) for _ in range(groups)]
    min_batch = rng.choice([0, 0, 1, 2])
    total = rng.randint(sum(counts) * max(1, min_batch), 3000)
    shares = grouped_plan(counts, alphas, betas, total, policy, min_batch)
    plan = plan_batches(_expanded(counts, alphas, betas), total, policy, min_batch=min_batch)
    assert sum(s.samples for s in shares) == total
    assert _step(shares, alphas, betas) == pytest.approx(plan.predicted_compute_time, rel=1e-12)
    start = 0
    for n, share in zip(counts, shares, strict=True):
        part = plan.batch_sizes[start : start + n]
        start += n
        if policy != "cost":  # the same order of extras as the balancer's
            assert sorted(part) == sorted([share.base] * (n - share.extra)
                                          + [share.base + 1] * share.extra)  # fmt: skip
        assert min(part) >= min_batch and share.batch_min >= min_batch


def test_group_share_figures():
    share = GroupShare(count=4, base=3, extra=1)
    assert (share.batch_min, share.batch_max, share.samples) == (3, 4, 13)
    assert GroupShare(4, 3, 0).batch_max == 3 and GroupShare(4, 3, 4).batch_min == 4


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="smaller than 10 devices"):
        grouped_plan([10], [0.0], [1.0], 5, "equal")
    with pytest.raises(ValueError, match="unknown"):
        grouped_plan([1], [0.0], [1.0], 5, "fastest")


@pytest.mark.parametrize("policy", ["equal", "proportional", "cost"])
@pytest.mark.parametrize("seed", range(40))
def test_grouped_plan_with_caps_matches_plan_batches_with_caps(policy, seed):
    rng = random.Random(1000 + seed)
    groups = rng.randint(1, 4)
    counts = [rng.randint(1, 9) for _ in range(groups)]
    alphas = [rng.choice([0.0, rng.uniform(0, 0.05)]) for _ in range(groups)]
    betas = [rng.uniform(1e-4, 1e-2) for _ in range(groups)]
    caps = [rng.choice([math.inf, rng.randint(1, 60)]) for _ in range(groups)]
    room = sum(n * c for n, c in zip(counts, caps, strict=True))
    total = rng.randint(sum(counts), int(min(room, 3000)))
    shares = grouped_plan(counts, alphas, betas, total, policy, 0, caps)
    per_rank = [None if c == math.inf else c for n, c in zip(counts, caps, strict=True)
                for _ in range(n)]  # fmt: skip
    plan = plan_batches(_expanded(counts, alphas, betas), total, policy, caps=per_rank)
    assert sum(s.samples for s in shares) == total
    assert all(s.batch_max <= c for s, c in zip(shares, caps, strict=True))
    assert _step(shares, alphas, betas) == pytest.approx(plan.predicted_compute_time, rel=1e-12)


def test_a_batch_beyond_the_devices_memory_is_one_line():
    with pytest.raises(
        ValueError, match="does not fit the devices' memory, which holds at most 20"
    ):
        grouped_plan([2, 2], [0.0, 0.0], [1.0, 1.0], 21, "cost", 0, [4, 6])
    with pytest.raises(ValueError, match="fewer samples than the 2"):
        grouped_plan([2], [0.0], [1.0], 4, "cost", 2, [1])


def test_a_fast_group_at_its_cap_takes_no_more_samples():
    # The fast device's target is exactly its cap: rounding down and then up again must
    # stop at the cap, and the slow device takes the rest.
    shares = grouped_plan([1, 1], [0.0, 0.0], [0.001, 1.0], 10, "cost", 0, [5, math.inf])
    assert [s.batch_max for s in shares] == [5, 5]
