"""`balanced_loader`: this rank's DataLoader for a load-balanced global batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from lbtrain.balancer import BalancePlan, plan_batches
from lbtrain.balancer.checks import whole
from lbtrain.data.sampler import BalancedBatchSampler

__all__ = ["BalancedLoader", "balanced_loader"]


class BalancedLoader(DataLoader):
    """A DataLoader over this rank's shares, which also knows each step's gradient weight.

    Iterate it like any DataLoader. While iterating, `weight` holds the current step's
    b_i / B_step, the factor to pass to `sync_gradients` (`step_weights` lists them all);
    `samples` and `global_samples` hold b_i and B_step themselves, `batches_served` counts
    batches handed out since the loader was made, and `epoch` and `step` place the latest
    one in its epoch (`BalancedDataParallel` reads them all).

    A rank whose share is zero (`empty`) still yields one batch per step, so it takes the
    same steps as the others: a batch of zero samples shaped like a real one. So does a rank
    with a share at an epoch's last step when that step's tail has fewer samples than the
    ranks with a share. Skip forward and backward where `samples` is 0 (a mean over no
    samples is NaN) and call `sync_gradients` with weight 0, which adds zeros.
    """

    batch_sampler: BalancedBatchSampler

    def __init__(self, dataset: Dataset, batch_sampler: BalancedBatchSampler, **kwargs: Any):
        batch_sampler.skip_empty = True
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.weight: float = batch_sampler.step_weights[0]
        self.samples: int = 0
        self.global_samples: int = 0
        self.batches_served: int = 0
        self.step: int = 0  # the handed-out batch's step in its epoch
        self.epoch: int = 0  # and that epoch
        self._empty_batch: Any = None

    @property
    def plan(self) -> BalancePlan:
        """The plan shared by all ranks."""
        return self.batch_sampler.plan

    @property
    def step_weights(self) -> tuple[float, ...]:
        """This rank's weight for each step of an epoch."""
        return self.batch_sampler.step_weights

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; call with the same value on every rank."""
        self.batch_sampler.set_epoch(epoch)

    def set_plan(self, plan: BalancePlan) -> None:
        """Switch to `plan` from the next epoch (re-planning); the same on every rank."""
        self.batch_sampler.set_plan(plan)

    def start_at(self, step: int) -> None:
        """Begin the next pass over the epoch at `step` (a resume mid-epoch: the steps
        before it are done), then from 0 again; the same on every rank."""
        self.batch_sampler.start_at(step)

    @property
    def empty(self) -> bool:
        """True when the plan gives this rank no samples: every batch it yields is empty."""
        sampler = self.batch_sampler
        return sampler.plan.batch_sizes[sampler.rank] == 0

    def __iter__(self) -> Iterator[Any]:
        first = self.batch_sampler.first_step  # read before the sampler's pass resets it
        schedule = self.batch_sampler.schedule[first:]
        rank, epoch = self.batch_sampler.rank, self.batch_sampler.epoch
        if not any(shares[rank] for _, _, shares in schedule):
            # No indices to fetch (a zero share, or a pass begun at a tail this rank has no
            # sample of), and no worker processes to start for nothing. The sampler, never
            # iterated, would not reset its first step: reset it here, as the pass begins.
            self.batch_sampler.first_step = 0
            for step, (start, stop, _) in enumerate(schedule, start=first):
                self._at(epoch, step, 0, stop - start)
                yield self.empty_batch()
            return
        # Workers prefetch ahead of the consumer, so the weight follows the batches
        # handed out, not the sampler's position. The sampler leaves out the steps where
        # this rank has no sample (a tail shorter than the ranks): an empty batch there.
        fetched = super().__iter__()
        for step, (start, stop, shares) in enumerate(schedule, start=first):
            batch = next(fetched) if shares[rank] else self.empty_batch()
            self._at(epoch, step, shares[rank], stop - start)
            yield batch

    def _at(self, epoch: int, step: int, samples: int, global_samples: int) -> None:
        """The step whose batch is handed out next."""
        self.weight = samples / global_samples
        self.samples, self.global_samples = samples, global_samples
        self.epoch, self.step = epoch, step
        self.batches_served += 1

    def empty_batch(self) -> Any:
        """A batch of zero samples with the shapes and types of a real one."""
        if self._empty_batch is None:
            # Fetch one item as the DataLoader would, then keep zero rows of it.
            fetch = getattr(self.dataset, "__getitems__", None)
            items = fetch([0]) if fetch else [self.dataset[0]]
            collate = self.collate_fn or default_collate
            self._empty_batch = _no_rows(collate(items))
        return self._empty_batch


def _no_rows(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor | np.ndarray):
        return batch[:0]
    if isinstance(batch, dict):
        return {key: _no_rows(value) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_no_rows(value) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(_no_rows(value) for value in batch)
    return batch


def balanced_loader(
    ranks: BalancePlan | Sequence[object],
    dataset: Dataset,
    *,
    global_batch_size: int | None = None,
    rank: int,
    policy: str = "proportional",
    caps: Sequence[int | None] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    pin_memory: bool = False,
) -> BalancedLoader:
    """This rank's DataLoader: its share of every load-balanced global batch.

    Args:
        ranks: a BalancePlan, or one entry per replica (a throughput in samples/s or a
            profile record) from which a plan is made with `policy` and `caps`.
        dataset: a map-style dataset, identical on every rank.
        global_batch_size: B; required unless `ranks` is a plan (then it must match or be None).
        rank: this replica's rank in [0, P).
        policy: balancing policy when a plan is computed ("equal", "proportional", "cost").
        caps: optional per-replica batch-size caps when a plan is computed.
        shuffle, seed: one permutation per epoch, seeded by seed + epoch, the same on all ranks.
        drop_last: drop the short last global batch instead of splitting it by the plan.
        num_workers, collate_fn, pin_memory: passed to torch's DataLoader.

    Returns:
        A BalancedLoader; its `weight` attribute is this step's b_i / B_step.

    Example:
        >>> loader = balanced_loader([120.0, 40.0], dataset, global_batch_size=64, rank=comm.rank)
        >>> for epoch in range(epochs):
        ...     loader.set_epoch(epoch)
        ...     for x, y in loader:
        ...         optimizer.zero_grad()
        ...         if loader.samples:  # an empty batch (a zero share) computes nothing
        ...             loss_fn(model(x), y).backward()
        ...         sync_gradients(model, loader.weight, comm)
        ...         optimizer.step()
    """
    seed = whole("seed", seed)
    plan = _loader_plan(ranks, global_batch_size, policy, caps)
    num_samples = _map_style_length(dataset)
    sampler = BalancedBatchSampler(
        num_samples, plan, rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    return BalancedLoader(
        dataset,
        sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        # Each iter() of a DataLoader draws a seed from its generator; with torch's global one
        # that would shift every dropout mask after it, and so change a resumed run.
        generator=torch.Generator().manual_seed(seed % 2**64),
    )


def _loader_plan(
    ranks: BalancePlan | Sequence[object],
    global_batch_size: int | None,
    policy: str,
    caps: Sequence[int | None] | None,
) -> BalancePlan:
    """The plan `ranks` is, checked against global_batch_size, or the one made from them."""
    if not isinstance(ranks, BalancePlan):
        if global_batch_size is None:
            raise ValueError("global_batch_size is required when ranks is not a BalancePlan")
        return plan_batches(ranks, global_batch_size, policy, caps=caps)
    if global_batch_size is not None and global_batch_size != ranks.global_batch_size:
        raise ValueError(
            f"global_batch_size={global_batch_size} disagrees with the plan's "
            f"{ranks.global_batch_size}; pass None or the plan's value"
        )
    return ranks


def _map_style_length(dataset: Dataset) -> int:
    """len(dataset), refusing a dataset whose samples cannot be shared out by index."""
    if isinstance(dataset, IterableDataset):
        raise TypeError(
            f"dataset of type {type(dataset).__name__} is an IterableDataset; balanced_loader "
            "needs a map-style dataset (one with __getitem__ and __len__), whose samples it "
            "can share out by index"
        )
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(
            f"dataset of type {type(dataset).__name__} has no len(); balanced_loader needs a "
            "map-style dataset"
        ) from exc
