"""Balanced sampling, checked as a whole: every rank's sampler built in one process."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from lbtrain import balanced_loader, plan_batches
from lbtrain.balancer import ReplicaSpeed
from lbtrain.data import BalancedBatchSampler, BalancedLoader


def all_ranks(num_samples, plan, **kwargs):
    return [BalancedBatchSampler(num_samples, plan, r, **kwargs) for r in range(plan.world_size)]


@st.composite
def plans_and_sizes(draw):
    count = draw(st.integers(min_value=1, max_value=6))
    speeds = draw(st.lists(st.floats(0.5, 100.0), min_size=count, max_size=count))
    # Fixed costs make the cost policy leave slow ranks out (zero shares) in many draws.
    alphas = draw(st.lists(st.floats(0.0, 2.0), min_size=count, max_size=count))
    batch = draw(st.integers(min_value=count, max_value=80))
    policy = draw(st.sampled_from(["equal", "proportional", "cost"]))
    ranks = [ReplicaSpeed(s, alpha=a) for s, a in zip(speeds, alphas, strict=True)]
    plan = plan_batches(ranks, batch, policy, min_batch=draw(st.integers(0, 1)))
    num_samples = draw(st.integers(min_value=count, max_value=400))
    return plan, num_samples


@settings(max_examples=200, deadline=None)
@given(plans_and_sizes(), st.integers(0, 5), st.booleans())
def test_shares_are_disjoint_cover_the_data_and_step_counts_agree(case, epoch, shuffle):
    plan, num_samples = case
    samplers = all_ranks(num_samples, plan, shuffle=shuffle, seed=7)
    for sampler in samplers:
        sampler.set_epoch(epoch)
    per_rank = [list(s) for s in samplers]
    steps = {len(batches) for batches in per_rank}
    assert len(steps) == 1, "every rank must take the same number of steps"
    assert {len(s) for s in samplers} == steps
    seen = [i for batches in per_rank for batch in batches for i in batch]
    assert sorted(seen) == list(range(num_samples)), "each sample exactly once per epoch"
    # The global batches are one process's, whatever the world and the plan.
    alone = BalancedBatchSampler(num_samples, plan_batches([1.0], plan.global_batch_size), 0)
    assert [b[:2] for b in samplers[0].schedule] == [b[:2] for b in alone.schedule]
    active = len(plan.active_ranks)
    for step in range(steps.pop()):
        step_total = sum(len(batches[step]) for batches in per_rank)
        for rank, batches in enumerate(per_rank):
            if not plan.batch_sizes[rank]:
                assert batches[step] == [], "a zero share is empty at every step"
            elif step_total >= active:
                assert len(batches[step]) >= 1, "a rank with a share gets a sample if it can"
        weights = [s.step_weights[step] for s in samplers]
        assert sum(weights) == pytest.approx(1.0)
        for rank, batches in enumerate(per_rank):
            assert weights[rank] == pytest.approx(len(batches[step]) / step_total)


@settings(max_examples=100, deadline=None)
@given(plans_and_sizes())
def test_drop_last_runs_only_full_global_batches(case):
    plan, num_samples = case
    if num_samples < plan.global_batch_size:
        with pytest.raises(ValueError, match="drop_last=True"):
            BalancedBatchSampler(num_samples, plan, 0, drop_last=True)
        return
    samplers = all_ranks(num_samples, plan, drop_last=True)
    per_rank = [list(s) for s in samplers]
    full_steps = num_samples // plan.global_batch_size
    for rank, batches in enumerate(per_rank):
        assert len(batches) == full_steps
        assert all(len(b) == plan.batch_sizes[rank] for b in batches)
    seen = [i for batches in per_rank for batch in batches for i in batch]
    assert len(seen) == len(set(seen)) == full_steps * plan.global_batch_size


def test_global_batch_k_is_a_contiguous_slice_of_one_permutation():
    plan = plan_batches([1.0, 2.0, 5.0], 16)
    samplers = all_ranks(50, plan, seed=3)
    perm = samplers[0].permutation().tolist()
    per_rank = [list(s) for s in samplers]
    for step in range(len(per_rank[0])):
        joined = [i for batches in per_rank for i in batches[step]]
        assert joined == perm[step * 16 : step * 16 + len(joined)]


def test_short_tail_is_split_by_the_plan_proportions():
    plan = plan_batches([1.0, 3.0], 8)  # (2, 6)
    samplers = all_ranks(12, plan, shuffle=False)
    assert [s.step_batch_sizes for s in samplers] == [(2, 1), (6, 3)]


def test_a_tail_shorter_than_the_world_is_a_step_and_a_one_sample_tail_joins_the_one_before():
    plan = plan_batches([1.0, 2.0, 3.0], 12)  # (2, 4, 6)
    # 12 + 12 + 2: the tail is a step of its own, as in one process; the largest shares take
    # its samples and rank 0 gets none there.
    samplers = all_ranks(26, plan, shuffle=False)
    assert [s.step_batch_sizes for s in samplers] == [(2, 2, 0), (4, 4, 1), (6, 6, 1)]
    assert samplers[0].step_weights[2] == 0.0
    # 12 + 12 + 1: the lone sample joins the step before, on every world.
    for ranks in (plan, plan_batches([1.0], 12)):
        assert [b[:2] for b in all_ranks(25, ranks)[0].schedule] == [(0, 12), (12, 25)]


def test_the_loader_hands_a_rank_an_empty_batch_at_a_tail_it_has_no_sample_of():
    plan = plan_batches([1.0, 2.0, 3.0], 12)
    dataset = TensorDataset(torch.arange(26, dtype=torch.float32).unsqueeze(1), torch.zeros(26))
    loaders = [balanced_loader(plan, dataset, rank=r, seed=1) for r in range(3)]
    assert not loaders[0].empty
    seen = []
    for rank, loader in enumerate(loaders):
        for step, (x, _) in enumerate(loader):
            assert x.shape == (loader.samples, 1) and loader.step == step
            assert loader.weight == loader.samples / loader.global_samples
            seen += x.flatten().tolist()
        assert loader.samples == (0 if rank == 0 else 1) and loader.global_samples == 2
    assert sorted(seen) == list(range(26))
    # A pass begun at that tail step (a resume) yields its empty batch, and the next pass
    # starts from the epoch's first step again.
    loaders[0].start_at(2)
    assert [x.shape[0] for x, _ in loaders[0]] == [0]
    assert [x.shape[0] for x, _ in loaders[0]] == [2, 2, 0]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_pass_begun_mid_epoch_fetches_the_same_batches_with_workers(persistent):
    """A DataLoader with workers makes its sampler's iterator twice and starts only the
    second: a resumed pass (start_at) must still begin at its step, on every rank, also at
    a tail step where the rank has no sample, and the pass after it at step 0."""
    plan = plan_batches([1.0, 2.0, 3.0], 12)
    dataset = TensorDataset(torch.arange(26, dtype=torch.float32).unsqueeze(1))

    def passes(rank: int, workers: int, start: int) -> list[list[list[float]]]:
        sampler = BalancedBatchSampler(len(dataset), plan, rank, seed=1)
        loader = BalancedLoader(dataset, sampler, num_workers=workers,
                                persistent_workers=persistent and workers > 0)  # fmt: skip
        loader.start_at(start)
        return [[x.flatten().tolist() for (x,) in loader] for _ in range(2)]

    for rank in range(3):
        for start in (1, 2):
            assert passes(rank, 2, start) == passes(rank, 0, start), (rank, start)
    resumed, after = passes(0, 2, 2)
    assert resumed == [[]] and [len(batch) for batch in after] == [2, 2, 0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pass_left_unfinished_leaves_a_later_start_at_in_force(workers):
    """An iterator kept, left after one batch and closed after `start_at` (a resume, as
    `TrainState.restore` does): the next pass begins where start_at said, on a rank with
    samples there and on one without."""
    plan = plan_batches([1.0, 2.0, 3.0], 12)
    dataset = TensorDataset(torch.arange(26, dtype=torch.float32).unsqueeze(1))
    for rank, start in ((0, 2), (0, 1), (2, 2)):
        loader = balanced_loader(plan, dataset, rank=rank, seed=1, num_workers=workers)
        held = iter(loader)
        next(held)
        loader.start_at(start)
        held.close()  # or collected: the abandoned pass ends before the next one begins
        steps = [loader.step for _ in loader]
        assert steps == list(range(start, 3)), (rank, start, steps)


def test_epochs_differ_and_are_reproducible():
    plan = plan_batches([1.0, 1.0], 4)
    sampler = BalancedBatchSampler(40, plan, 0, seed=1)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == first
    assert second != first


def test_loader_yields_data_and_tracks_the_current_weight():
    data = torch.arange(30, dtype=torch.float32).unsqueeze(1)
    dataset = TensorDataset(data, torch.zeros(30))
    loader = balanced_loader([1.0, 4.0], dataset, global_batch_size=10, rank=1, seed=0)
    seen_weights = []
    for (x, _), expected in zip(loader, loader.step_weights, strict=True):
        seen_weights.append(loader.weight)
        assert x.shape[0] == round(expected * 10)
    assert seen_weights == list(loader.step_weights) == [0.8, 0.8, 0.8]


def test_loader_accepts_a_plan_and_rejects_a_conflicting_batch():
    plan = plan_batches([1.0, 2.0], 6)
    dataset = TensorDataset(torch.zeros(12))
    assert len(balanced_loader(plan, dataset, rank=0)) == 2
    with pytest.raises(ValueError, match="global_batch_size=7 disagrees"):
        balanced_loader(plan, dataset, global_batch_size=7, rank=0)


@pytest.mark.parametrize(
    ("num_samples", "rank", "message"),
    [
        (10, 3, r"Invalid rank 3, rank should be in the interval \[0, 2\]"),
        (10, -1, r"Invalid rank -1"),
        (0, 0, r"the dataset is empty"),
        (2, 0, r"the dataset has 2 samples, fewer than the 3 ranks"),
    ],
)
def test_bad_input_is_named(num_samples, rank, message):
    plan = plan_batches([1.0, 1.0, 1.0], 6)
    with pytest.raises(ValueError, match=message):
        BalancedBatchSampler(num_samples, plan, rank)


def test_loader_without_global_batch_is_rejected():
    with pytest.raises(ValueError, match="global_batch_size is required"):
        balanced_loader([1.0, 2.0], TensorDataset(torch.zeros(4)), rank=0)


def test_merged_tail_keeps_caps_when_the_others_can_take_the_extra():
    plan = plan_batches([10.0, 1.0], 10, caps=[8, None])
    assert plan.batch_sizes == (8, 2)
    samplers = all_ranks(11, plan, shuffle=False)  # 10 + a 1-sample tail, merged
    assert [s.step_batch_sizes for s in samplers] == [(8,), (3,)]


def test_a_merged_tail_the_caps_cannot_hold_is_refused_at_construction():
    """Caps [5, 5] and 11 samples: the 1-sample tail would give a rank 6."""
    plan = plan_batches([1.0, 1.0], 10, caps=[5, 5])
    with pytest.raises(ValueError, match=r"caps \[5, 5\] hold only 10.*drop_last=True"):
        BalancedBatchSampler(11, plan, 0)
    dropped = BalancedBatchSampler(11, plan, 0, drop_last=True)
    assert dropped.step_batch_sizes == (5,)
    assert max(max(s.step_batch_sizes) for s in all_ranks(12, plan)) <= 5  # a 2-sample tail


def zero_share_plan():
    # Rank 1's fixed cost (1 s) outlasts rank 0's whole step: the cost policy leaves it out.
    ranks = [ReplicaSpeed(100.0, alpha=0.01), ReplicaSpeed(10.0, alpha=1.0)]
    plan = plan_batches(ranks, 8, "cost")
    assert plan.batch_sizes == (8, 0) and plan.idle_ranks == (1,)
    return plan


class ItemsDataset(torch.utils.data.Dataset):
    """A dataset that returns whole batches from __getitems__, as the hyperspectral one does."""

    def __init__(self, n: int) -> None:
        self.x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
        self.y = torch.arange(n) % 2

    def __len__(self) -> int:
        return len(self.y)

    def __getitems__(self, indices):
        return self.x[indices], self.y[indices]


@pytest.mark.parametrize("items", [False, True])
def test_zero_share_loader_yields_empty_batches_of_the_right_shape_every_step(items):
    plan = zero_share_plan()
    if items:
        dataset, collate = ItemsDataset(20), (lambda batch: batch)
    else:
        dataset, collate = TensorDataset(torch.zeros(20, 3), torch.zeros(20).long()), None
    busy = balanced_loader(plan, dataset, rank=0, collate_fn=collate)
    idle = balanced_loader(plan, dataset, rank=1, collate_fn=collate)
    assert idle.empty and not busy.empty
    batches = list(idle)
    assert len(batches) == len(busy) == 3  # 8 + 8 + a tail of 4: the same steps on both
    for x, y in batches:
        assert x.shape == (0, 3) and y.shape == (0,) and y.dtype == torch.long
    assert idle.weight == 0.0 and set(idle.step_weights) == {0.0}
    assert sum(len(x) for x, _ in busy) == 20


def test_any_whole_seed_draws_a_permutation_and_small_ones_are_unchanged():
    # torch refuses seeds from 2**64 on ("Overflow when unpacking long long").
    import torch
    from torch.utils.data import TensorDataset

    from lbtrain import balanced_loader

    data = TensorDataset(torch.arange(16))

    def order(seed: int) -> list[int]:
        loader = balanced_loader([1.0], data, global_batch_size=16, rank=0, seed=seed)
        return next(iter(loader))[0].tolist()

    assert sorted(order(2**64 + 3)) == list(range(16))
    assert order(2**64 + 3) == order(3)
    expected = torch.randperm(16, generator=torch.Generator().manual_seed(3)).tolist()
    assert order(3) == expected


def test_a_pass_can_begin_mid_epoch_once_then_from_the_start_again():
    """A resume mid-epoch (TrainState): the next pass starts at the step asked, numbered as
    in the whole epoch, with the whole epoch's batches; the pass after starts at 0."""
    data = TensorDataset(torch.arange(30))
    loader = balanced_loader([1.0, 2.0], data, global_batch_size=6, rank=1, seed=5)
    loader.set_epoch(2)
    whole = [batch[0].tolist() for batch in loader]
    loader.start_at(3)
    resumed = [(loader.step, batch[0].tolist()) for batch in loader]
    assert resumed == list(enumerate(whole))[3:]
    assert [batch[0].tolist() for batch in loader] == whole  # the next pass: whole again
    with pytest.raises(ValueError, match="step=5 is beyond the epoch's 5 steps"):
        loader.start_at(5)
