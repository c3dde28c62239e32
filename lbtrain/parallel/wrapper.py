"""`BalancedDataParallel`: a user's own loop, balanced and exact, shaped like DDP.

Wrap the model once; the loop stays `loss_fn(model(x), y).backward(); optimizer.step()`.
The wrapper reads each step's weight w_i = b_i / B from the balanced loader, scales the
gradient flowing back from the outputs by it (as free as scaling the loss), and sums the
gradients over ranks from backward itself, in the persistent buckets of `GradientSync`, so
that when `backward()` returns every rank holds the mean gradient over the global batch.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from lbtrain.collective import agree
from lbtrain.comm import Communicator
from lbtrain.data import BalancedLoader
from lbtrain.evaluation import Evaluator, evaluate
from lbtrain.parallel.batchnorm import (
    convert_sync_batchnorm,
    sync_batchnorm_layers,
)
from lbtrain.parallel.checks import (
    bucket_disagreement,
    check_setup,
    no_new_batch,
    raise_if,
    second_backward,
    shared_autograd_thread,
)
from lbtrain.parallel.gradients import GradientSync
from lbtrain.parallel.layout import broadcast_tensors, check_same_model, copy_buffers
from lbtrain.parallel.marking import mark
from lbtrain.parallel.weights import StepWeights

__all__ = ["BalancedDataParallel"]


def _gradient_sync(
    module: nn.Module,
    comm: Communicator,
    device: torch.device,
    collective_layers: bool,
    overlap: bool,
    bucket_mb: float | None,
) -> GradientSync:
    """The model's gradient buckets (collective), checked to be laid out alike on every rank."""
    if collective_layers and not getattr(comm, "thread_safe", True):
        # An engine that takes collectives from each rank's own thread only (in-process
        # ranks): a CUDA rank's gradient hooks run on autograd's device thread, so its
        # buckets start after backward, where a CPU rank's start during it. With
        # BatchNorm's collectives inside backward the ranks would meet them in different
        # orders: buckets after backward on every rank keep one order. (On every rank,
        # CPU ones too: a backward run from another thread defers buckets alike.)
        overlap = False
        places = comm.allgather((socket.gethostname(), os.getpid(), str(device)))
        agree(comm, lambda: raise_if(shared_autograd_thread(places)), name_rank=False)
    gradients = GradientSync(module, comm, overlap=overlap, bucket_mb=bucket_mb)
    # Buckets of other sizes would sum unrelated slices (NaN, or a rank left waiting).
    layouts = comm.allgather([b.flat.numel() for b in gradients.buckets])
    agree(comm, lambda: raise_if(bucket_disagreement(layouts)), name_rank=False)
    return gradients


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

    **BatchNorm** layers (1d, 2d, 3d) become `lbtrain.SyncBatchNorm` unless
    `sync_batchnorm=False`: training statistics over the global batch, so a model with
    BatchNorm is exact too, a rank with one sample trains, and the running statistics are
    the same on every rank. It costs two small allreduces per BatchNorm layer and step (the
    per-channel count, sums and squares in forward, two per-channel sums in backward), each
    a moment where the ranks wait for each other, and a rank with a zero share runs its
    empty batch through forward and backward to join them.

    **The loss** must be what `loss_reduction` says: "mean" (the default) a mean over this
    rank's samples, as `nn.CrossEntropyLoss()` gives; "sum" a sum over them
    (`reduction="sum"`), like one process's sum over the global batch; "count" a mean over
    units you count, such as tokens: call `model.set_loss_count(n)` (collective) with this
    rank's count each step before backward, and the gradient is one process's mean over
    every rank's units.

    Buffers other than synchronised BatchNorm's follow one rank, as DDP's do, but they are
    copied after each step's gradient sync rather than before each forward: then every rank
    holds one model whenever the user evaluates or saves, and the copy rides on a moment when
    all ranks already meet. The source is the rank with the largest share.

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
        sync_batchnorm: convert BatchNorm layers to `SyncBatchNorm` (in place, keeping
            their parameters and buffers).
        loss_reduction: "mean", "sum" or "count", what the loss is normalised by (above).

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
        sync_batchnorm: bool = True,
        loss_reduction: str = "mean",
    ) -> None:
        super().__init__()
        flags = {
            "overlap": overlap,
            "broadcast_buffers": broadcast_buffers,
            "sync_in_backward": sync_in_backward,
            "sync_batchnorm": sync_batchnorm,
        }
        check_setup(module, comm, loader, weighting, loss_reduction, flags)
        # An engine whose transport depends on the devices (torch.distributed: NCCL only where
        # every rank is on a GPU) picks it now, unless the job already did (the trainer).
        device = next(module.parameters(), torch.empty(0)).device
        use_device = getattr(comm, "use_device", None)
        if use_device is not None and getattr(comm, "transport", None) is None:
            agree(comm, lambda: use_device(device))
        if sync_batchnorm:
            module = convert_sync_batchnorm(module, comm)
        check_same_model(module, comm)
        broadcast_tensors([*module.parameters(), *module.buffers()], comm, root=0)
        self.module, self.comm, self.loader = module, comm, loader
        self.broadcast_buffers = bool(broadcast_buffers)
        self.sync_in_backward = bool(sync_in_backward)
        self.weighting, self.loss_reduction = weighting, loss_reduction
        layers = [layer for _, layer in sync_batchnorm_layers(module)]
        self.gradients = _gradient_sync(module, comm, device, bool(layers), overlap, bucket_mb)
        self._layers = layers
        for layer in layers:
            layer.before_collective = self._before_collective
            layer.after_collective = self._after_collective
        # Called before each collective inside the step (synchronised BatchNorm's, the epoch
        # check after an epoch's first forward) and once it returns (an emulated slowdown
        # sleeps before it, and times compute again after it).
        self.before_collective: Callable[[], None] | None = None
        self.after_collective: Callable[[], None] | None = None
        # With collectives inside the model, a rank with no samples runs its empty batch
        # through forward and backward like the others, so that it joins each of them.
        self._graph_on_empty = bool(layers)
        self._require_sync = True
        self._counted = loader.batches_served  # the loader batch last added to the window
        self.weights = StepWeights(comm, loader, weighting, loss_reduction)
        self._open: int | None = None  # the loader batch whose sync is armed and not done
        self._launched = False  # the current backward's end is queued
        self._in_backward = False
        self._armed_step: int | None = None  # the loader step of the last sync armed
        self._synced: int | None = None  # the batch whose synced sum the gradients hold
        self._batches = 0  # loader batches since the last sync

    @property
    def collective_forward(self) -> bool:
        """Whether the model's forward and backward are collectives (synchronised BatchNorm):
        then every rank runs them on every batch, an empty one too."""
        return self._graph_on_empty

    def _before_collective(self) -> None:
        # Buckets complete by now start first, so every rank starts them in one order.
        self.gradients.flush_ready()
        if self.before_collective is not None:
            self.before_collective()

    def _after_collective(self) -> None:
        if self.after_collective is not None:
            self.after_collective()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the next backward outside syncs them all.

        Exact with any micro-batches, as DDP's: each micro-batch's gradient is weighted by
        its own share b_i / B of its global batch, so after k micro-batches the gradients
        are the sum one process accumulates running the same loop on the global batches.
        Divide the loss by k, as with DDP, for their mean. (Accumulating without `no_sync`,
        a backward and a sync per micro-batch, gives the same: each sync adds only what came
        since the last.) With `loss_reduction="count"` the window is one mean over every
        rank's units since the last sync.
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
        for layer in self._layers:
            layer.stamp = self._counted  # the ranks' collectives meet on one batch
        own = self.loader.samples
        leaf = own == 0 and not self._graph_on_empty
        if leaf:
            # No samples: nothing to compute a gradient from. The output still takes part
            # in backward (a leaf), which is when this rank's zeros join the sum.
            with torch.no_grad():
                outputs = self.module(*inputs, **kwargs)
        else:
            outputs = self.module(*inputs, **kwargs)
        factor = 0.0 if own == 0 else self.weights.factor()
        if self._require_sync:
            self._arm()
        return mark(outputs, factor, self, self._counted, leaf=leaf)

    def set_loss_count(self, count: float) -> float:
        """This step's count of the units the loss is a mean over; collective, before backward.

        Only with `loss_reduction="count"`: the loss on this rank is a mean over `count`
        units (tokens, pixels, ...), and the gradient becomes one process's mean over every
        rank's units. Every rank calls it once per batch, a rank with no samples with 0.
        Returns the count over all ranks.
        """
        return self.weights.set_count(count)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients, one pass per bucket; they stay views of the buckets.

        `set_to_none` is accepted for nn.Module's signature and ignored: the buckets are the
        gradients' storage (an optimizer's `zero_grad()` that sets them to None is fine too:
        the next forward points them back at zeroed buckets).
        """
        del set_to_none
        self.gradients.zero_grad()
        self._synced = None

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
            copy_buffers(self.module, self.comm, self.loader.plan.batch_sizes)
        self._synced = self._open
        self._open, self._launched, self._in_backward = None, False, False
        self._batches = 0
        self.weights.synced()

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
        if loader.batches_served == self._counted:
            if self._open is None and self._batches == 0:
                # Its step is synced (or none was drawn): the weights come from the loader's
                # batch, so another training forward would add gradients weighted 0.
                raise RuntimeError(no_new_batch(self.comm.rank, loader.batches_served))
            return
        if self._open is not None:
            raise RuntimeError(
                f"rank {self.comm.rank} started a new batch before the last one's backward: "
                "every rank must run forward and backward on every batch, an empty one too"
            )
        if self._batches == 0:
            if self._synced is not None:
                # The gradients hold a synced sum (accumulation without no_sync): keep it
                # out of the next sum, and put it back after.
                self.gradients.stash()
                self._synced = None
            elif not self._require_sync:
                # An accumulating micro-batch: backward adds straight into the buckets. (A
                # synced batch gets the same from `_arm`, which GradientSync.arm does.)
                self.gradients.adopt_grads()
        self._counted = loader.batches_served
        self._batches += 1
        self.weights.add_batch()

    def _check_epoch(self) -> None:
        """Every rank in one epoch, under one plan (collective; from `_arm`, see there).

        A rank that skipped `set_epoch` or `set_plan` draws other samples than the rest, or
        weighs them by another plan, and the sums still run. One small allgather an epoch
        catches it, on every rank alike.
        """
        loader = self.loader
        # A meeting inside the step (after the forward): the fast ranks wait here for the
        # slowest one's forward. Between the hooks, as BatchNorm's collectives, so that a
        # loop timing compute counts it as waiting, and an emulated slow rank does not
        # stretch it (else a rank's first step of each epoch looked 40-70 ms slower).
        if self.before_collective is not None:
            self.before_collective()
        rows = self.comm.allgather((loader.epoch, tuple(loader.plan.batch_sizes)))
        if self.after_collective is not None:
            self.after_collective()
        for rank, (epoch, plan) in enumerate(rows):
            if epoch != rows[0][0]:
                raise RuntimeError(
                    f"rank {rank} starts epoch {epoch} and rank 0 epoch {rows[0][0]}: call "
                    "loader.set_epoch(epoch) with the same epoch on every rank before each "
                    "epoch, and run forward and backward on every batch, an empty one too (a "
                    "loop that skips a rank's empty batch calls model.finish() there)"
                )
            if plan != rows[0][1]:
                raise RuntimeError(
                    f"rank {rank} shares the batch as {list(plan)} and rank 0 as "
                    f"{list(rows[0][1])}: call loader.set_plan(plan) with the same plan on every "
                    "rank, between epochs"
                )

    def _single(self) -> bool:
        """Whether the window since the last sync is this one batch, synced now."""
        return self._require_sync and self._batches == 1

    def _arm(self) -> None:
        # The first sync of each pass over the loader (and the first of all) checks the
        # epoch and plan. Here, not at a step-0 forward: every rank arms every sync, just
        # before its buckets, while a zero share that branches and accumulates counts only
        # the batches it syncs. The steps are in lockstep, so all ranks decide alike.
        step = self.loader.step
        if self._armed_step is None or step <= self._armed_step:
            self._check_epoch()
        self._armed_step = step
        weight, prescaled = self.weights.arm(self._single())
        self.gradients.arm(weight, prescaled=prescaled)
        self._open, self._launched = self._counted, False

    def _arm_if_skipped(self) -> None:
        """A batch this rank neither ran forward on nor synced yet: open its step now."""
        if self._open is None and self.loader.batches_served != self._counted:
            if self._graph_on_empty:
                raise RuntimeError(
                    f"rank {self.comm.rank} skipped the forward of a batch: with synchronised "
                    "BatchNorm every rank must run forward and backward on every batch, an "
                    "empty one too"
                )
            self._count_batch()
            self._arm()

    def _backward_started(self, token: int, factor: float | None) -> float:
        """The first node of backward: open a repeated sync, queue the end; the factor."""
        if self._open is None and token == self._synced and self._batches == 0:
            # A second backward through the forward whose sum is done: sync what it adds,
            # weighted as the first.
            self.gradients.stash()
            weight, prescaled = self.weights.armed
            self.gradients.arm(weight, prescaled=prescaled)
            self._open, self._launched, self._synced, self._batches = token, False, None, 1
            self.weights.seen(token)
        elif self._open is not None and self._launched and not self._in_backward:
            raise RuntimeError(
                second_backward(self.comm.rank, "while its gradients are being summed")
            )
        if factor is None:
            # A count loss: its units are known now; this re-weighs the armed sync.
            synced_now = self._open == token and self._single()
            factor = self.weights.late_factor(token, synced_now, self._open is not None)
        if self._open is not None and not self._launched:
            if self.loss_reduction == "count" and self._open == token:
                weight, prescaled = self.weights.armed
                self.gradients.reweigh(weight, prescaled=prescaled)
            self._launched = self._in_backward = True
            # Queued once per backward; runs on the engine after every gradient is in.
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        return factor

    def _backward_done(self) -> None:
        self._in_backward = False
        self.gradients.launch()
        if self.sync_in_backward:
            self.finish()
