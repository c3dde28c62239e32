"""The batch sampler that cuts every global batch into per-rank shares."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

from lbtrain.balancer import BalancePlan
from lbtrain.balancer.checks import flag, whole
from lbtrain.balancer.rounding import largest_remainder
from lbtrain.text import plural

__all__ = [
    "BalancedBatchSampler",
    "disagreement",
    "epoch_schedule",
    "fingerprint",
    "steps_per_epoch",
]

# What every rank's sampler must share, or the ranks take different steps (and one waits
# in a collective for another that has finished) or cover the data twice.
AGREED = ("dataset length", "shuffle", "seed", "drop_last", "plan")


def epoch_schedule(
    num_samples: int, plan: BalancePlan, drop_last: bool = False
) -> list[tuple[int, int, tuple[int, ...]]]:
    """The global batches of one epoch as (start, stop, per-rank share sizes).

    Global batch k covers perm[start:stop]. A short last batch is a step of its own, split
    by the plan's proportions, unless it holds a single sample: that one joins the batch
    before it (see `steps_per_epoch`). Where the tail has fewer samples than the ranks with
    a share, some of them get an empty batch at that step. The global batches depend only
    on the dataset's length, the global batch and `drop_last`, never on the number of
    ranks or the plan: one process and any world take the same steps. A rank whose share is
    zero gets an empty batch at every step. Every rank computes the same schedule from the
    same arguments, so the step count agrees without communication.
    """
    full = plan.global_batch_size
    steps, tail = divmod(num_samples, full)
    bounds = [(k * full, (k + 1) * full) for k in range(steps)]
    if steps_per_epoch(num_samples, full, drop_last) > steps:
        bounds.append((steps * full, num_samples))  # the tail, a step of its own
    elif tail and not drop_last:
        bounds[-1] = (bounds[-1][0], num_samples)  # a one-sample tail joins the step before
    schedule = []
    for start, stop in bounds:
        size = stop - start
        shares = plan.batch_sizes if size == full else _split_like(plan, size)
        schedule.append((start, stop, tuple(shares)))
    return schedule


# A tail shorter than this joins the batch before it. A step of one sample cannot train
# BatchNorm1d (one value per channel) and normalises any BatchNorm by that sample alone, right
# before each evaluation; one sample more in the last full batch costs nothing.
MIN_TAIL = 2


def steps_per_epoch(num_samples: int, global_batch: int, drop_last: bool = False) -> int:
    """How many global batches an epoch has: a short tail is a step of its own when it holds
    at least `MIN_TAIL` samples (or is all there is), else it joins the step before."""
    steps, tail = divmod(num_samples, global_batch)
    # Not the world size, nor the ranks with a share: one process and every world, before
    # and after re-planning or a change of world, take the same steps (and LR schedule).
    if tail and not drop_last and (tail >= MIN_TAIL or not steps):
        steps += 1
    return steps


def _split_like(plan: BalancePlan, size: int) -> list[int]:
    # A zero share stays zero: a rank left out by the plan is left out of the tail too. The
    # others get a sample each where the tail has enough; where it has fewer, the largest
    # shares take them and the rest get an empty batch at this step.
    enough = size >= len(plan.active_ranks)
    lower = [1 if b > 0 and enough else 0 for b in plan.batch_sizes]
    caps = [
        (math.inf if r.cap is None else r.cap) if b > 0 else 0
        for r, b in zip(plan.replicas, plan.batch_sizes, strict=True)
    ]
    if sum(caps) < size:
        # Only a merged tail (one sample over B) can get here. A cap is memory: refuse now,
        # at construction, rather than exceed it at the epoch's last step.
        held = [None if math.isinf(c) else int(c) for c in caps]
        raise ValueError(
            f"the epoch's last step merges a one-sample tail into a global batch of {size} "
            f"samples, but the ranks' caps {held} hold only {int(sum(caps))}; pass "
            "drop_last=True, or choose a global batch that divides the dataset or leaves a "
            f"tail of at least {MIN_TAIL} samples"
        )
    targets = [min(size * w, cap) for w, cap in zip(plan.weights, caps, strict=True)]
    return largest_remainder(targets, size, lower, caps, plan.batch_sizes)


class BalancedBatchSampler(Sampler[list[int]]):
    """Yields this rank's share of every global batch.

    Each epoch, all ranks draw the same seeded permutation without communicating. Global
    batch k is `perm[k*B:(k+1)*B]`, cut into contiguous shares of sizes b_0..b_{P-1}; this
    rank gets share `rank`. Across ranks every sample is seen exactly once per epoch (or,
    with `drop_last`, every sample but the short tail) and every rank takes the same number
    of steps, the number one process takes. A rank with a zero share yields an empty list
    at every step, and a rank with a share does at the last step where that step's tail
    has fewer samples than there are such ranks (`BalancedLoader` hands out an empty batch
    shaped like a real one there).

    Args:
        num_samples: length of the dataset.
        plan: the BalancePlan shared by all ranks.
        rank: this rank, in [0, plan.world_size).
        shuffle: draw a new permutation each epoch (seeded by seed + epoch).
        seed: base seed; must be the same on every rank.
        drop_last: drop the short last global batch instead of splitting it.

    .. warning::
        Call `set_epoch(epoch)` before each epoch, on every rank, or every epoch repeats the
        first permutation.
    """

    def __init__(
        self,
        num_samples: int,
        plan: BalancePlan,
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        rank = whole("rank", rank)
        num_samples = whole("num_samples", num_samples)
        seed = whole("seed", seed)
        shuffle, drop_last = flag("shuffle", shuffle), flag("drop_last", drop_last)
        if not 0 <= rank < plan.world_size:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {plan.world_size - 1}]"
                f": the plan is for {plural(plan.world_size, 'rank')}; give it one entry per "
                "rank of the job"
            )
        if num_samples < 1:
            raise ValueError(
                f"the dataset is empty (num_samples={num_samples}); pass a dataset with samples"
            )
        if num_samples < len(plan.active_ranks):
            raise ValueError(
                f"the dataset has {num_samples} sample{'s' * (num_samples != 1)}, fewer than the "
                f"{len(plan.active_ranks)} ranks with a share: some would never get one; use "
                "fewer ranks or a larger dataset"
            )
        if drop_last and num_samples < plan.global_batch_size:
            raise ValueError(
                f"drop_last=True with {num_samples} samples and global_batch_size="
                f"{plan.global_batch_size} leaves no step; lower the global batch or set "
                "drop_last=False"
            )
        self.num_samples = num_samples
        self.plan = plan
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.first_step = 0  # where the next pass begins (start_at)
        # Leave out the steps where this rank has no sample (set by `BalancedLoader`, which
        # fetches the others through its DataLoader and hands out an empty batch there).
        self.skip_empty = False
        self._schedule = epoch_schedule(num_samples, plan, drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of `epoch`; call it with the same value on every rank."""
        self.epoch = whole("epoch", epoch, low=0)

    def start_at(self, step: int) -> None:
        """Begin the next pass over the epoch at `step` (a resume mid-epoch), then from 0
        again; the same on every rank."""
        step = whole("step", step, low=0)
        if step >= len(self._schedule):
            raise ValueError(
                f"step={step} is beyond the epoch's {len(self._schedule)} steps; give a step "
                f"below {len(self._schedule)}"
            )
        self.first_step = step

    def set_plan(self, plan: BalancePlan) -> None:
        """Share later batches by `plan` (re-planning); call with the same plan on every rank.

        The new plan must be for the same ranks and global batch, so the permutation and the
        number of steps per epoch stay what they were.
        """
        if (plan.world_size, plan.global_batch_size) != (
            self.plan.world_size,
            self.plan.global_batch_size,
        ):
            raise ValueError(
                f"a new plan must keep {self.plan.world_size} ranks and a global batch of "
                f"{self.plan.global_batch_size}; got {plan.world_size} and "
                f"{plan.global_batch_size}"
            )
        self.plan = plan
        self._schedule = epoch_schedule(self.num_samples, plan, self.drop_last)

    @property
    def schedule(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """The epoch's global batches as (start, stop, per-rank shares); see epoch_schedule."""
        return list(self._schedule)

    @property
    def step_weights(self) -> tuple[float, ...]:
        """This rank's weight b_i / B_step for each step of an epoch."""
        return tuple(shares[self.rank] / (stop - start) for start, stop, shares in self._schedule)

    @property
    def step_batch_sizes(self) -> tuple[int, ...]:
        """This rank's batch size for each step of an epoch."""
        return tuple(shares[self.rank] for _, _, shares in self._schedule)

    def permutation(self) -> torch.Tensor:
        """The epoch's permutation of dataset indices, identical on every rank."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator()
        # torch takes seeds modulo 2**64 (a negative one as its two's complement) but refuses
        # those outside [-2**63, 2**64): reduce here, and every seed has its permutation.
        generator.manual_seed((self.seed + self.epoch) % 2**64)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the pass's first step is read (and reset) at its first batch. A
        # DataLoader with workers makes two iterators and starts only the second.
        perm = self.permutation()
        first, self.first_step = self.first_step, 0
        for start, _, shares in self._schedule[first:]:
            size = shares[self.rank]
            if size or not self.skip_empty:
                offset = start + sum(shares[: self.rank])
                yield perm[offset : offset + size].tolist()

    def __len__(self) -> int:
        return len(self._schedule)


def fingerprint(sampler: BalancedBatchSampler, *, as_ints: bool = False) -> tuple:
    """What `sampler` must share with every other rank's, in the order of `AGREED`.

    The seed counts only when shuffling. `as_ints` gives the seed and the plan's batch
    sizes as CRC-32s, so the row fits an int64 tensor whatever the seed.
    """
    seed: object = sampler.seed if sampler.shuffle else 0
    plan: object = tuple(sampler.plan.batch_sizes)
    if as_ints:
        seed, plan = (zlib.crc32(repr(value).encode()) for value in (seed, plan))
    return (sampler.num_samples, int(sampler.shuffle), seed, int(sampler.drop_last), plan)


def disagreement(rows: Sequence[Sequence[object]], *, hashed: bool = False) -> str | None:
    """The first setting on which the ranks' samplers differ, as a one-line error, or None.

    Args:
        rows: each rank's `fingerprint`, in rank order.
        hashed: the rows came from `fingerprint(..., as_ints=True)`.
    """
    for column, name in enumerate(AGREED):
        first = rows[0][column]
        other = next((r for r, row in enumerate(rows) if row[column] != first), None)
        if other is None:
            continue
        if name in ("seed", "plan") and hashed:
            said = f"rank {other}'s differs from rank 0's"
        else:
            shown = [_shown(name, v) for v in (first, rows[other][column])]
            said = f"{shown[0]} on rank 0, {shown[1]} on rank {other}"
        return (
            f"the ranks' loaders disagree on the {name} ({said}); build every rank's loader "
            "from the same plan and dataset, with the same shuffle, seed and drop_last, or "
            "their steps differ"
        )
    return None


def _shown(name: str, value: object) -> object:
    if name in ("shuffle", "drop_last"):
        return bool(value)
    return list(value) if isinstance(value, tuple) else value
