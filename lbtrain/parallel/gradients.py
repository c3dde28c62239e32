"""Weighted gradient synchronisation: the step that makes unequal batches exact.

Each step the buckets (`lbtrain.parallel.buckets`: flat buffers the `.grad` are views into)
are weighted by b_i / B, one in-place scale each, and sum-allreduced in place, in bucket
order on every rank; with overlap on each bucket's allreduce starts from backward once its
gradients are all in, while the rest of backward still runs.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Iterable
from numbers import Real

import torch
from torch import nn

from lbtrain.balancer.checks import flag, real
from lbtrain.comm import Communicator
from lbtrain.parallel.buckets import (
    DEFAULT_BUCKET_MB,
    OVERLAP_BUCKET_MB,
    Bucket,
    layout_signature,
    sync_layout,
)
from lbtrain.parallel.checks import require_communicator
from lbtrain.parallel.staging import Stager, make_stager

__all__ = ["GradientSync", "check_weight", "check_weights_agree", "sync_gradients"]


def check_weight(weight: object) -> float:
    """`weight` as a float in [0, 1]: TypeError for a non-number, ValueError out of range."""
    weight = real("weight", weight)
    if not math.isfinite(weight) or not 0 <= weight <= 1:
        raise ValueError(
            f"weight={weight!r} is invalid: pass this rank's b_i / B, a number in [0, 1] "
            "(BalancedLoader.weight)"
        )
    return float(weight)


class GradientSync:
    """Sum-allreduce weighted gradients through persistent buckets; built once per model.

    Each step, after backward on this rank's mean loss, every rank's gradients become the
    mean gradient over the global batch: sum_i (b_i / B) * mean_i, the update one process
    would make on all B samples. Dividing by the world size instead (DDP, Horovod, the
    static-balancing paper) over-weights replicas with small batches.

    Three ways to drive it:

    * after backward, `sync(weight)`: scale and reduce every bucket (what `sync_gradients`
      does);
    * around backward, for overlap: `begin(weight)` before forward (zeroes the buckets and
      arms the hooks), backward (each bucket's non-blocking allreduce starts once all its
      gradients are in), then `wait()` before the optimizer step. `launch()` starts the
      buckets still waiting, e.g. before another collective;
    * from backward itself, as `BalancedDataParallel` does: the user's loop zeroes the
      gradients its own way, so when backward starts through the wrapper's outputs it calls
      `arm(weight)` (keep what `.grad` holds: accumulation), or `stash()` then `arm` (a sum
      already synced stays out of the next), `reweigh` (a weight known only then: a loss
      over a count the user gives), `flush_ready()` before each collective inside the model
      (synchronised BatchNorm), and `launch()` and `wait()` from its end-of-backward
      callback.

    Every rank must start the same buckets in the same order, so a bucket starts only after
    every bucket before it: a parameter without a gradient this step holds a rank back until
    `launch()` or `wait()`, never out of order. A rank with a zero share (weight 0) skips
    forward and backward and still calls `begin` and `wait`: it adds exact zeros.

    Args:
        model: a module, or its parameters, with the same structure on every rank.
        comm: the job's communicator.
        bucket_mb: flat-buffer size per allreduce, in MiB (None: OVERLAP_BUCKET_MB with
            overlap, DEFAULT_BUCKET_MB without).
        overlap: start each bucket's allreduce from backward (needs one backward per step).
        progress: with overlap, test the requests in flight from every gradient hook, so
            an MPI library that progresses only inside MPI calls (MPICH by default) moves
            them on. Measured on MPICH (benchmark 2): the wait after backward cut by 71%
            with these calls, 25% without; MPICH's progress thread
            (MPIR_CVAR_ASYNC_PROGRESS=1) cut it by 76% but spins a core per rank and made
            every step 1.8x slower on a 2-core machine.
        stage: pass buckets through pinned host buffers (None: for CUDA buckets when the
            MPI library is not CUDA-aware). True on a CPU bucket exercises the same path.

    Note:
        Exact for models whose forward treats samples independently, and for BatchNorm
        once converted to `lbtrain.SyncBatchNorm` (BalancedDataParallel does it); plain
        BatchNorm in training mode normalises with per-rank batch statistics.
    """

    def __init__(
        self,
        model: nn.Module | Iterable[nn.Parameter],
        comm: Communicator,
        *,
        bucket_mb: float | None = None,
        overlap: bool = False,
        progress: bool = True,
        stage: bool | None = None,
    ) -> None:
        if bucket_mb is None:
            bucket_mb = OVERLAP_BUCKET_MB if overlap else DEFAULT_BUCKET_MB
        if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, Real) or not bucket_mb > 0:
            raise ValueError(f"bucket_mb={bucket_mb!r} must be a positive number of MiB")
        try:
            params = list(model.parameters() if isinstance(model, nn.Module) else model)
        except TypeError:  # None, a number: not iterable
            params = [model]
        if not all(isinstance(p, torch.Tensor) for p in params):
            raise TypeError(
                f"model={model!r:.60} is not a module or its parameters: pass an nn.Module or "
                "model.parameters()"
            )
        self.signature = layout_signature(params, float(bucket_mb))
        self.comm = comm
        self.overlap = flag("overlap", overlap)
        self.progress = flag("progress", progress)
        if stage is not None:
            flag("stage", stage)
        self.buckets = [Bucket(group) for group in sync_layout(params, float(bucket_mb))]
        self.stagers: list[Stager | None] = [make_stager(b.flat, comm, stage) for b in self.buckets]
        self._where = {
            id(p): (k, i)
            for k, bucket in enumerate(self.buckets)
            for i, p in enumerate(bucket.params)
        }
        self._weight = 1.0
        self._scale = True
        self._armed = False
        self._next = 0  # the first bucket not yet launched
        # Hooks of CUDA parameters run on autograd's device threads, those of CPU ones on the
        # caller's: one lock keeps a bucket from starting twice. MPI may be called from a
        # thread other than begin()'s only where the library allows it (SERIALIZED or more).
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._any_thread = bool(getattr(comm, "thread_safe", True))
        self._hooks = []
        if self.overlap:
            self._hooks = [
                p.register_post_accumulate_grad_hook(self._on_gradient)
                for bucket in self.buckets
                for p in bucket.params
            ]
        for bucket in self.buckets:
            for index in range(len(bucket.params)):
                bucket.attach(index)

    @property
    def nbytes(self) -> int:
        """Bytes reduced per step."""
        return sum(b.flat.numel() * b.flat.element_size() for b in self.buckets)

    def zero_grad(self) -> None:
        """Zero every bucket and point every `.grad` at its view (replaces optimizer's)."""
        for bucket in self.buckets:
            bucket.flat.zero_()
            bucket.carry = None
            for index, param in enumerate(bucket.params):
                if param.grad is not bucket.views[index]:
                    param.grad = bucket.views[index]

    def begin(self, weight: float, *, prescaled: bool = False) -> None:
        """Start a step: zero the gradients and, with overlap, arm the hooks for `weight`.

        `prescaled=True` says the loss was multiplied by `weight` before backward, so the
        gradients already carry it and the buckets are not scaled again.
        """
        self._start(weight, prescaled)
        self.zero_grad()
        self._owner = threading.get_ident()
        self._armed = self.overlap

    def arm(self, weight: float, *, prescaled: bool = False) -> None:
        """Start a step as `begin` does, but keep what the gradients hold (accumulation).

        Each `.grad` becomes its bucket view again, holding the same values (zeros where it
        was None), so backward adds onto earlier micro-batches' gradients in place.
        """
        self._start(weight, prescaled)
        self.adopt_grads()
        self._owner = threading.get_ident()
        self._armed = self.overlap

    def adopt_grads(self) -> None:
        """Point every `.grad` at its bucket view, keeping its values (zeros where None)."""
        for bucket in self.buckets:
            for index in range(len(bucket.params)):
                bucket.attach(index)

    def stash(self) -> None:
        """Keep what the buckets hold (a sum already synced) out of the next sum.

        For a loop that backpropagates again before zeroing the gradients (accumulation
        without `no_sync`, a second backward through one forward): the next sync adds only
        the gradient computed since, and `wait` puts the kept sum back, as one process
        accumulates. A bucket whose gradients were all set to None (an optimizer's
        `zero_grad()`) keeps nothing at no cost; one of zeros after one read of it.
        """
        for bucket in self.buckets:
            held = any(p.grad is not None for p in bucket.params)
            for index in range(len(bucket.params)):
                bucket.attach(index)
            if held and bool(bucket.flat.any()):
                if bucket.carry is None:
                    bucket.carry = bucket.flat.clone()
                else:
                    bucket.carry.add_(bucket.flat)
                bucket.flat.zero_()

    def reweigh(self, weight: float, *, prescaled: bool) -> None:
        """Change the armed step's weight before any bucket is weighed (start of backward)."""
        if any(b.launched for b in self.buckets):
            raise RuntimeError("the weight of a step changed after its buckets started")
        self._weight = check_weight(weight)
        # A truthy string ("no") would silently leave the weight out of every gradient.
        self._scale = not flag("prescaled", prescaled)

    def flush_ready(self) -> None:
        """Start, in order, every bucket whose gradients are all in (before another collective).

        A collective in the middle of backward (synchronised BatchNorm) must meet the same
        buckets started before it on every rank; staged copies are waited for here.
        """
        if not self._armed or (not self._any_thread and threading.get_ident() != self._owner):
            return
        with self._lock:
            self._launch_ready(block=True)

    def launch(self) -> None:
        """Start every bucket not started yet, in order (after backward, before `wait`)."""
        with self._lock:
            for bucket in self.buckets[self._next :]:
                for index in range(len(bucket.params)):
                    if index not in bucket.ready:
                        bucket.attach(index)
                        bucket.ready.add(index)
            self._launch_ready(block=True)

    def wait(self) -> None:
        """Finish the step: every bucket reduced and copied back; then the optimizer steps."""
        self._armed = False
        self.launch()
        for bucket, stager in zip(self.buckets, self.stagers, strict=True):
            assert bucket.request is not None
            bucket.request.wait()
            if stager is not None:
                stager.unstage()
            if bucket.carry is not None:
                bucket.flat.add_(bucket.carry)
                bucket.carry = None

    def sync(self, weight: float, *, prescaled: bool = False) -> None:
        """Weight and sum-allreduce the gradients backward left in `.grad` (no overlap)."""
        self._start(weight, prescaled)
        self.wait()

    def close(self) -> None:
        """Remove the hooks; gradients stay where they are."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._armed = False

    def _start(self, weight: float, prescaled: bool) -> None:
        """A new step's weight, once the last step's allreduces have all completed."""
        self._weight = check_weight(weight)
        # A truthy string ("no") would silently leave the weight out of every gradient.
        self._scale = not flag("prescaled", prescaled)
        if any(b.request is not None and not b.request.test() for b in self.buckets):
            raise RuntimeError(
                "a step started while the last one's allreduces were still in flight: call "
                "wait() before the optimizer step and before the next begin()"
            )
        self._next = 0
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.launched = False
            bucket.request = None

    def _on_gradient(self, param: torch.Tensor) -> None:
        if not self._armed:
            return
        with self._lock:
            k, index = self._where[id(param)]
            bucket = self.buckets[k]
            if bucket.launched:
                self._armed = False
                raise RuntimeError(
                    "a gradient arrived for a bucket already being reduced: overlap needs one "
                    "backward per step; call begin() before each backward, or turn overlap off"
                )
            bucket.attach(index)
            bucket.ready.add(index)
            if not self._any_thread and threading.get_ident() != self._owner:
                return  # no MPI from this thread: launch() starts it, on begin()'s thread
            self._launch_ready(block=False)
            if self.progress:
                for earlier in self.buckets[: self._next]:
                    if earlier.request is not None and not earlier.request.test():
                        break

    def _launch_ready(self, *, block: bool) -> None:
        """Start, in order, the buckets whose gradients are all in (staged ones once copied)."""
        while self._next < len(self.buckets):
            bucket = self.buckets[self._next]
            stager = self.stagers[self._next]
            if not bucket.launched:
                if len(bucket.ready) < len(bucket.params):
                    return
                self._weigh(bucket)
                bucket.launched = True
                if stager is not None:
                    stager.stage()
            if stager is not None and not stager.staged(block=block):
                return  # its copy to the host is still running: later buckets wait behind it
            buffer = bucket.flat if stager is None else stager.buffer
            bucket.request = self.comm.iallreduce_sum_(buffer)
            self._next += 1

    def _weigh(self, bucket: Bucket) -> None:
        if self._weight == 0:
            # A rank with no samples adds exact zeros, whatever stale values (even NaN) its
            # gradients hold: 0 * NaN would poison every rank's sum.
            bucket.flat.zero_()
        elif self._scale and self._weight != 1:
            bucket.flat.mul_(self._weight)


# One GradientSync per model, so `sync_gradients` builds its buckets once; a call with
# another communicator or a changed model replaces it (the old buckets are freed).
_SYNCS: weakref.WeakKeyDictionary[nn.Module, GradientSync] = weakref.WeakKeyDictionary()


def sync_gradients(
    model: nn.Module | Iterable[nn.Parameter],
    weight: float,
    comm: Communicator,
    *,
    bucket_mb: float = DEFAULT_BUCKET_MB,
    prescaled: bool = False,
) -> None:
    """Turn each rank's mean-loss gradient into the mean gradient over the global batch.

    Call after `loss.backward()` on this rank's mean loss and before `optimizer.step()`.
    Gradients are scaled by `weight` = b_i / B and sum-allreduced in a few flat buckets,
    so sum_i (b_i / B) * mean_i = the mean over all B samples: the update one process would
    make on the whole global batch (see `GradientSync`, which also overlaps the sync with
    backward).

    The buckets are built on the first call for a module and kept; afterwards each `.grad`
    is a view into them, so `optimizer.zero_grad(set_to_none=False)` keeps the sync free of
    copies (with `set_to_none=True` each gradient is copied in once per step). A parameter
    with no gradient on this rank contributes zeros, so every rank reduces the same buffers
    in the same order and nothing hangs. A rank with a zero share (weight 0) skips forward
    and backward and still calls this: it adds zeros and receives the sum.

    The first call for a module (every call for a list of parameters, which builds its
    buckets each time too) checks, with one small allgather, that the ranks' weights sum to
    1, and raises the same ValueError on every rank if not (a loader planned for another
    number of ranks, say).

    Args:
        model: a module, or its parameters, with the same structure on every rank.
        weight: this rank's b_i / B for the current step (BalancedLoader.weight).
        comm: the job's communicator.
        bucket_mb: flat-buffer size per allreduce call, in MiB.
        prescaled: the loss already carried the weight (multiplied by b_i / B, or summed
            over the batch and divided by B), so the gradients are summed as they are;
            `weight` is still this rank's b_i / B, checked but not applied.
    """
    check_weight(weight)
    flag("prescaled", prescaled)
    require_communicator(comm)
    if not isinstance(model, nn.Module):
        check_weights_agree(weight, comm)
        GradientSync(model, comm, bucket_mb=bucket_mb).sync(weight, prescaled=prescaled)
        return
    sync = _SYNCS.get(model)
    if (
        sync is None
        or sync.comm is not comm
        or sync.signature != layout_signature(model.parameters(), float(bucket_mb))
    ):
        check_weights_agree(weight, comm)
        sync = _SYNCS[model] = GradientSync(model, comm, bucket_mb=bucket_mb)
    sync.sync(weight, prescaled=prescaled)


def check_weights_agree(weight: float, comm: Communicator) -> None:
    """Raise on every rank unless the ranks' weights sum to 1 (one small allgather).

    A bare weight cannot say which plan it came from: a loader planned for 3 ranks in a job
    of 2 gives weights that sum to 2/3, and the update would silently shrink by a third.
    `sync_gradients` checks this once per model, at its first step.
    """
    weights = comm.allgather(float(weight))
    total = math.fsum(weights)
    # Weights computed in float32 (a tensor's .item()) are off by an ulp each.
    if abs(total - 1) > max(1e-6, len(weights) * 2**-22):
        shown = ", ".join(f"{w:.4g}" for w in weights[:8]) + (", ..." if len(weights) > 8 else "")
        raise ValueError(
            f"the ranks' weights sum to {total:.9g}, not 1 ({shown} on {len(weights)} ranks): "
            f"pass each rank's b_i / B from a loader planned for this job's {len(weights)} "
            "ranks (loader.weight; loader.plan.world_size must be the job's size), and "
            "prescaled=True if the loss already carries it"
        )
