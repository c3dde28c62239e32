"""A DDP communication hook that weights each rank's gradient by its share of the batch.

For people who keep stock `torch.nn.parallel.DistributedDataParallel`:

    model = DistributedDataParallel(model)
    loader = lbtrain.balanced_loader(plan, dataset, rank=dist.get_rank())
    model.register_comm_hook(lbtrain.WeightedHookState(loader), lbtrain.weighted_allreduce_hook)

DDP's own hook divides every bucket by the world size, which over-weights ranks with small
batches; this one multiplies it by w_i = b_i / B (the loader's weight for the step) and
sums, so the update is the one a single process makes on the whole global batch.

With BatchNorm, synchronise it and weight the loss instead of the buckets:

    model = DistributedDataParallel(lbtrain.convert_sync_batchnorm(model, comm))
    model.register_comm_hook(lbtrain.WeightedHookState(loader, prescaled=True),
                             lbtrain.weighted_allreduce_hook)
    (loss_fn(model(x), y) * loader.weight).backward()
"""

# No `from __future__ import annotations` here: DDP's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] themselves, and refuses strings.
from typing import Any

import torch
import torch.distributed as dist

from lbtrain.balancer.checks import flag
from lbtrain.data import BalancedLoader
from lbtrain.data.sampler import disagreement, fingerprint

__all__ = ["WeightedHookState", "weighted_allreduce_hook"]


class WeightedHookState:
    """What `weighted_allreduce_hook` reads: the loader (for the weight) and the group.

    Args:
        loader: this rank's `balanced_loader`; its `weight` is read at each bucket.
        process_group: the DDP model's process group (default: the whole world).
        prescaled: the loss already carries the weight (`loss * loader.weight`), so the
            buckets are summed as they are. Needed with `lbtrain.convert_sync_batchnorm`:
            synchronised BatchNorm's backward adds the ranks' output gradients, which must
            carry each rank's weight before they reach it.
    """

    def __init__(
        self, loader: BalancedLoader, process_group: Any = None, *, prescaled: bool = False
    ) -> None:
        if not isinstance(loader, BalancedLoader):
            raise ValueError(
                f"loader={type(loader).__name__} is not a BalancedLoader; build it with "
                "lbtrain.balanced_loader(plan, dataset, rank=dist.get_rank())"
            )
        self.loader = loader
        self.process_group = process_group
        self.prescaled = flag("prescaled", prescaled)  # "no" is truthy: it must not pass
        self.checked = False

    def check(self, device: torch.device) -> None:
        """Refuse a loader planned for another group, built for another rank, or unlike the
        other ranks' loaders, on every rank at once (one small allreduce, at the first
        bucket)."""
        size = dist.get_world_size(self.process_group)
        rank = dist.get_rank(self.process_group)
        sampler = self.loader.batch_sampler
        # Each rank writes its (plan size, loader rank + 1, what the loaders must share) into
        # its own row: after the sum every rank knows every loader, so one wrong loader stops
        # all of them instead of leaving the others waiting in the bucket's allreduce.
        row = [sampler.plan.world_size, sampler.rank + 1, *fingerprint(sampler, as_ints=True)]
        table = torch.zeros(size, len(row), dtype=torch.int64, device=device)
        table[rank] = torch.tensor(row, dtype=torch.int64)
        dist.all_reduce(table, group=self.process_group)
        loaders = table.tolist()
        for where, (planned, built, *_) in enumerate(loaders):
            if planned != size:
                raise ValueError(
                    f"loader's plan is for {planned} ranks but the process group has {size} "
                    f"(on rank {where}); plan again for {size} ranks (lbtrain.plan_for)"
                )
            if built - 1 != where:
                raise ValueError(
                    f"loader was built for rank {built - 1} on rank {where}; pass "
                    "rank=dist.get_rank() to balanced_loader"
                )
        problem = disagreement([loader[2:] for loader in loaders], hashed=True)
        if problem is not None:
            raise ValueError(problem)
        self.checked = True


def weighted_allreduce_hook(
    state: WeightedHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Multiply the bucket by this rank's b_i / B and sum it over ranks (a DDP comm hook).

    A rank with a zero share still runs forward and backward on the empty batch its loader
    gives it (DDP needs every rank's backward to fire every bucket); its bucket is zeroed
    rather than multiplied by 0, because 0 * NaN is NaN, and a mean over no samples is NaN
    whenever a layer divides by the batch.
    """
    buffer = bucket.buffer()
    if not state.checked:
        state.check(buffer.device)
    weight = state.loader.weight
    if weight == 0:
        buffer.zero_()
    elif weight != 1 and not state.prescaled:
        buffer.mul_(weight)
    work = dist.all_reduce(buffer, group=state.process_group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0])
