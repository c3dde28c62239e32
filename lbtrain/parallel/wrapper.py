"""`BalancedDataParallel`: a user's own loop, balanced and exact, shaped like DDP.

Wrap the model once; the loop stays `loss_fn(model(x), y).backward(); optimizer.step()`.
The wrapper reads each step's weight w_i = b_i / B from the balanced loader, scales the
gradient flowing back from the outputs by it (as free as scaling the loss), and sums the
gradients over ranks from backward itself, in the persistent buckets of `GradientSync`, so
that when `backward()` returns every rank holds the mean gradient over the global batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from lbtrain.comm import Communicator
from lbtrain.data import BalancedLoader
from lbtrain.data.sampler import disagreement, fingerprint
from lbtrain.evaluation import Evaluator, evaluate
from lbtrain.gradients import GradientSync
from lbtrain.parallel.layout import broadcast_tensors, check_same_model
from lbtrain.session import agree

__all__ = ["BalancedDataParallel"]

WEIGHTINGS = ("share", "uniform")


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by a factor and tells the owner."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, factor: float, owner: Any) -> torch.Tensor:
        ctx.factor, ctx.owner = factor, owner
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.owner._backward_started()
        return (grad if ctx.factor == 1 else grad * ctx.factor), None, None


class BalancedDataParallel(nn.Module):
    """Wrap a model for exact data-parallel training with unequal per-rank batches.

    Like `torch.nn.parallel.DistributedDataParallel`, but each rank's gradient is weighted
    by its share b_i / B of the global batch instead of 1 / P, so the update is the one a
    single process makes on the whole batch, however unevenly the loader splits it.

    At construction (collective) it checks that every rank built the same model, naming the
    first parameter that differs, and copies rank 0's parameters and buffers to every rank.
    Each training forward reads the current step from `loader`; when backward returns, the
    gradients are synchronised (overlapped with backward by default). A rank whose share is
    zero runs the same loop on the empty batch the loader gives it and adds exact zeros:
    no branching in the user's loop.

    Buffers (BatchNorm's running statistics) follow one rank, as DDP's do, but they are
    copied after each step's gradient sync rather than before each forward: then every rank
    holds one model whenever the user evaluates or saves, and the copy rides on a moment when
    all ranks already meet. The source is the rank with the largest share, whose statistics
    come from the most samples (a rank with no samples never updates them).

    Args:
        module: the model, on this rank's device; the same architecture on every rank.
        comm: the job's communicator.
        loader: this rank's `balanced_loader`; its plan must be for `comm.size` ranks.
        overlap: start each gradient bucket's allreduce during backward.
        bucket_mb: MiB per allreduce bucket (default: GradientSync's).
        broadcast_buffers: copy the buffers from the largest-share rank after each step.
        sync_in_backward: finish the sync before backward returns (as DDP). False leaves
            the wait to `finish()`, for a loop that does other work first (the trainer).
        weighting: "share" (exact) or "uniform" (1 / P, what DDP does; only to compare).

    Example:
        >>> model = BalancedDataParallel(model, comm, loader)
        >>> for x, y in loader:
        ...     optimizer.zero_grad()
        ...     loss_fn(model(x), y).backward()  # a zero share: an empty batch, exact zeros
        ...     optimizer.step()
    """

    def __init__(
        self,
        module: nn.Module,
        comm: Communicator,
        loader: BalancedLoader,
        *,
        overlap: bool = True,
        bucket_mb: float | None = None,
        broadcast_buffers: bool = True,
        sync_in_backward: bool = True,
        weighting: str = "share",
    ) -> None:
        super().__init__()
        if not all(hasattr(comm, name) for name in ("rank", "size", "allgather")):
            # Before the checks below, which meet the other ranks through it.
            raise TypeError(
                f"comm={comm!r:.60} is not a communicator; pass lbtrain.world_communicator()"
            )
        agree(comm, lambda: _check_arguments(module, comm, loader, weighting))
        rows = comm.allgather(fingerprint(loader.batch_sampler))
        agree(comm, lambda: _raise_if(disagreement(rows)), name_rank=False)
        # An engine whose transport depends on the devices (torch.distributed: NCCL only where
        # every rank is on a GPU) picks it now, unless the job already did (the trainer).
        use_device = getattr(comm, "use_device", None)
        if use_device is not None and getattr(comm, "transport", None) is None:
            device = next(module.parameters(), torch.empty(0)).device
            agree(comm, lambda: use_device(device))
        check_same_model(module, comm)
        broadcast_tensors([*module.parameters(), *module.buffers()], comm, root=0)
        self.module = module
        self.comm = comm
        self.loader = loader
        self.broadcast_buffers = bool(broadcast_buffers)
        self.sync_in_backward = bool(sync_in_backward)
        self.weighting = weighting
        self.gradients = GradientSync(module, comm, overlap=overlap, bucket_mb=bucket_mb)
        # Buckets of other sizes would sum unrelated slices (NaN, or a rank left waiting).
        layouts = comm.allgather([b.flat.numel() for b in self.gradients.buckets])
        agree(comm, lambda: _raise_if(_bucket_disagreement(layouts)), name_rank=False)
        self._require_sync = True
        self._counted = loader.batches  # the loader batch last added to the window
        self._window = [0, 0]  # samples of this rank, and of the world, since the last sync
        self._open: int | None = None  # the loader batch whose sync is armed and not done
        self._launched = False
        self._armed_step: int | None = None  # the loader step of the last sync armed

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the next backward outside syncs them all.

        Exact with any micro-batches: each micro-batch's gradient is weighted by its share
        of all the samples since the last sync, so k micro-steps and one sync equal one
        process's step on their union.
        """
        previous, self._require_sync = self._require_sync, False
        try:
            yield
        finally:
            self._require_sync = previous

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The module's forward; in training (train mode, grad enabled) it prepares the sync.

        In eval mode or under `torch.no_grad()` it is the module's forward alone, so an
        evaluation between steps (even one that computes a loss) is not taken for a step.
        """
        training = self.module.training and torch.is_grad_enabled()
        if not training or not self.gradients.buckets:
            return self.module(*inputs, **kwargs)
        self._count_batch()
        own = self.loader.samples
        if own == 0:
            # No samples: nothing to compute a gradient from. The output still takes part
            # in backward (a leaf), which is when this rank's zeros join the sum.
            with torch.no_grad():
                outputs = self.module(*inputs, **kwargs)
            factor = 0.0
        else:
            outputs = self.module(*inputs, **kwargs)
            factor = self._factor()
        if self._require_sync:
            self._arm()
        return _mark(outputs, factor, self, leaf=own == 0)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients, one pass per bucket; they stay views of the buckets.

        `set_to_none` is accepted for nn.Module's signature and ignored: the buckets are the
        gradients' storage (an optimizer's `zero_grad()` that sets them to None is fine too:
        the next forward points them back at zeroed buckets).
        """
        del set_to_none
        self.gradients.zero_grad()

    def launch(self) -> None:
        """Start every bucket still waiting (after backward, before another collective)."""
        self._arm_if_skipped()
        self.gradients.launch()
        self._launched = True

    def finish(self) -> None:
        """Complete this step's sync (and copy the buffers); then the optimizer may step.

        Backward calls it when `sync_in_backward`; calling it again is harmless. A rank that
        skipped forward and backward this step (a zero share, in a loop that branches) calls
        it to add its zeros.
        """
        self._arm_if_skipped()
        if self._open is None:
            return
        self.gradients.wait()
        if self.broadcast_buffers:
            buffers = list(self.module.buffers())
            if buffers:
                broadcast_tensors(buffers, self.comm, root=_largest_share(self.loader))
        self._open, self._launched = None, False
        self._window = [0, 0]

    def evaluate(
        self,
        dataset: Dataset,
        evaluator: Evaluator,
        *,
        weights: Sequence[float] | None = None,
        batch_size: int = 256,
        collate_fn: Callable | None = None,
    ) -> dict[str, Any]:
        """Score `dataset` across ranks (shares sized by the plan); metrics of the summed state.

        Collective. Each rank scores a contiguous share (by default in proportion to its
        batch in the plan) into the evaluator's state; the states are summed over ranks.
        """
        device = next(self.module.parameters()).device
        weights = list(weights) if weights is not None else list(self.loader.plan.batch_sizes)
        return evaluate(
            self.module,
            dataset,
            evaluator,
            self.comm,
            weights,
            device=device,
            batch_size=batch_size,
            collate_fn=collate_fn,
        )

    def _count_batch(self) -> None:
        """Add the loader's current batch to the window since the last sync, once."""
        loader = self.loader
        if loader.batches == self._counted:
            if self._open is None and self._window[1] == 0:
                # Its step is synced (or none was drawn): the weights come from the loader's
                # batch, so another training forward would add gradients weighted 0.
                raise RuntimeError(_no_new_batch(self.comm.rank, loader.batches))
            return
        if self._open is not None:
            raise RuntimeError(
                f"rank {self.comm.rank} started a new batch before the last one's backward: "
                "every rank must run forward and backward on every batch, an empty one too"
            )
        if self._window[1] == 0 and not self._require_sync:
            # An accumulating micro-batch: backward adds straight into the buckets. (A synced
            # batch gets the same from `_arm`, which GradientSync.arm does in one pass.)
            self.gradients.adopt_grads()
        self._counted = loader.batches
        self._window[0] += loader.samples
        self._window[1] += loader.global_samples

    def _check_epoch(self) -> None:
        """Every rank in one epoch, under one plan (collective; from `_arm`, see there).

        A rank that skipped `set_epoch` or `set_plan` draws other samples than the rest, or
        weighs them by another plan, and the sums still run. One small allgather an epoch
        catches it, on every rank alike.
        """
        loader = self.loader
        rows = self.comm.allgather((loader.epoch, tuple(loader.plan.batch_sizes)))
        for rank, (epoch, plan) in enumerate(rows):
            if epoch != rows[0][0]:
                raise RuntimeError(
                    f"rank {rank} starts epoch {epoch} and rank 0 epoch {rows[0][0]}: call "
                    "loader.set_epoch(epoch) with the same epoch on every rank before each epoch"
                )
            if plan != rows[0][1]:
                raise RuntimeError(
                    f"rank {rank} shares the batch as {list(plan)} and rank 0 as "
                    f"{list(rows[0][1])}: call loader.set_plan(plan) with the same plan on every "
                    "rank, between epochs"
                )

    def _factor(self) -> float:
        """What this batch's gradient is multiplied by on its way back from the outputs."""
        if self.weighting == "uniform":
            return 1.0 / self.comm.size
        if self._require_sync and self._window[1] == self.loader.global_samples:
            return self.loader.weight  # one batch per sync: b_i / B, nothing left to scale
        return float(self.loader.samples)  # accumulating: sums now, / total samples at the sync

    def _arm(self) -> None:
        own, total = self._window
        if self.weighting == "uniform" or total == self.loader.global_samples:
            weight, prescaled = (self._factor() if own else 0.0), True
        else:
            weight, prescaled = (1.0 / total if own else 0.0), False
        # The first sync of each pass over the loader (and the first of all) checks the
        # epoch and plan. Here, not at a step-0 forward: every rank arms every sync, just
        # before its buckets, while a zero share that branches and accumulates counts only
        # the batches it syncs. The steps are in lockstep, so all ranks decide alike.
        step = self.loader.step
        if self._armed_step is None or step <= self._armed_step:
            self._check_epoch()
        self._armed_step = step
        self.gradients.arm(weight, prescaled=prescaled)
        self._open, self._launched = self._counted, False

    def _arm_if_skipped(self) -> None:
        """A batch this rank neither ran forward on nor synced yet: open its step now."""
        if self._open is None and self.loader.batches != self._counted:
            self._count_batch()
            self._arm()

    def _backward_started(self) -> None:
        # Queued once per backward; runs on the engine after every gradient is in.
        if self._open is not None and not self._launched:
            self._launched = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        self.gradients.launch()
        if self.sync_in_backward:
            self.finish()


def _no_new_batch(rank: int, handed_out: int) -> str:
    drawn = (
        f"none since batch {handed_out}, which was synced or drawn before the model was wrapped"
        if handed_out
        else "it has handed out no batch yet"
    )
    return (
        f"rank {rank}: a training forward without a new batch from the loader the model was "
        f"wrapped with ({drawn}): take one batch at a time from that loader for each step "
        "(not list(loader), a prefetcher or another loader), and run forwards that are not "
        "training steps under torch.no_grad() or model.eval()"
    )


def _bucket_disagreement(layouts: list[list[int]]) -> str | None:
    for rank, layout in enumerate(layouts):
        if layout != layouts[0]:
            return (
                f"rank {rank} cuts the gradients into {_buckets(layout)} and rank 0 into "
                f"{_buckets(layouts[0])}: pass the same bucket_mb and overlap to "
                "BalancedDataParallel on every rank, each rank's model on one device"
            )
    return None


def _buckets(layout: list[int]) -> str:
    sizes = ", ".join(map(str, layout[:4])) + (", ..." if len(layout) > 4 else "")
    return f"{len(layout)} bucket{'s' * (len(layout) != 1)} ({sizes} elements)"


def _largest_share(loader: BalancedLoader) -> int:
    sizes = loader.plan.batch_sizes
    return max(range(len(sizes)), key=lambda r: (sizes[r], -r))


def _mark(outputs: Any, factor: float, owner: BalancedDataParallel, *, leaf: bool) -> Any:
    """Route backward through `_ScaleGrad` on every floating output tensor."""
    if isinstance(outputs, torch.Tensor):
        if not outputs.is_floating_point():
            return outputs
        if leaf:
            outputs = outputs.detach().requires_grad_()
        elif not outputs.requires_grad:
            return outputs
        return _ScaleGrad.apply(outputs, factor, owner)
    if isinstance(outputs, dict):
        return {key: _mark(value, factor, owner, leaf=leaf) for key, value in outputs.items()}
    if isinstance(outputs, tuple) and hasattr(outputs, "_fields"):  # a namedtuple
        return type(outputs)(*(_mark(value, factor, owner, leaf=leaf) for value in outputs))
    if isinstance(outputs, list | tuple):
        return type(outputs)(_mark(value, factor, owner, leaf=leaf) for value in outputs)
    return outputs


def _raise_if(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)


# ValueError, not TypeError: agree() reports these on every rank, so none waits alone.
def _check_arguments(
    module: nn.Module, comm: Communicator, loader: BalancedLoader, weighting: str
) -> None:
    if not isinstance(module, nn.Module):
        raise ValueError(f"module={module!r:.60} is not an nn.Module; pass the model to wrap")
    if not isinstance(loader, BalancedLoader):
        raise ValueError(
            f"loader={type(loader).__name__} is not a BalancedLoader; build it with "
            "lbtrain.balanced_loader(plan, dataset, rank=comm.rank)"
        )
    plan, rank = loader.plan, loader.batch_sampler.rank
    if plan.world_size != comm.size:
        raise ValueError(
            f"loader's plan is for {plan.world_size} ranks but the job has {comm.size}; plan "
            f"again for {comm.size} ranks (lbtrain.plan_for)"
        )
    if rank != comm.rank:
        raise ValueError(
            f"loader was built for rank {rank}; pass rank=comm.rank to balanced_loader"
        )
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} must be one of {', '.join(WEIGHTINGS)}")
