"""What each batch's gradient is multiplied by, and each sync's bucket weight.

`BalancedDataParallel` keeps the step's state machine (which batch is open, armed, synced);
this keeps the arithmetic of the loss reductions: the samples (or counted units) of this
rank and of the world since the last sync, the factor on the way back from the outputs,
and the weight the buckets carry into the sum.

- "mean": each batch's factor is its own b_i / B and the buckets are summed as they are,
  accumulating too: k micro-batches give the sum of the k gradients one process computes
  on their global batches, as DDP and one process accumulate (a loss divided by k gives
  their mean).
- "sum": the factor is 1 and the buckets are summed as they are.
- "count": over the units each rank names with `set_loss_count` (known only at backward, so
  the factor and the weight are decided then); one batch per sync weighs it by n_i / sum n_j,
  and accumulating, the window is one mean over all of its units.
- weighting "uniform": DDP's 1/P, for comparisons.
"""

from __future__ import annotations

import math

import torch

from lbtrain.comm import Communicator
from lbtrain.data import BalancedLoader

__all__ = ["StepWeights"]


class StepWeights:
    """The weighing of the batches since the last sync (see the module docstring)."""

    def __init__(
        self, comm: Communicator, loader: BalancedLoader, weighting: str, loss_reduction: str
    ) -> None:
        self.comm, self.loader = comm, loader
        self.weighting, self.loss_reduction = weighting, loss_reduction
        self.window = [0.0, 0.0]  # samples (or counted units) of this rank and the world
        self.armed: tuple[float, bool] = (1.0, True)  # the last sync's weight, prescaled
        self._units: dict[int, tuple[float, float]] = {}  # set_loss_count, by loader batch
        self._seen: set[int] = set()  # batches whose units are in the window
        self._given: dict[int, float] = {}  # a count loss's factor, by loader batch

    def add_batch(self) -> None:
        """The loader's current batch joins the window (a count loss's at its backward)."""
        batch = self.loader.batches_served
        for kept in (self._units, self._given):
            for key in [k for k in kept if k < batch]:
                del kept[key]
        if self.loss_reduction != "count":
            self.window[0] += self.loader.samples
            self.window[1] += self.loader.global_samples

    def synced(self) -> None:
        """The sync is done: the next window starts empty."""
        self.window, self._seen = [0.0, 0.0], set()

    def factor(self) -> float | None:
        """What this batch's gradient is multiplied by on its way back from the outputs.

        None: decided when backward starts (a count given after the forward).
        """
        if self.weighting == "uniform":
            return 1.0 / self.comm.size
        if self.loss_reduction == "sum":
            return 1.0
        if self.loss_reduction == "count":
            return None
        # Each batch by its own share b_i / B, accumulating too: the sum over micro-batches
        # is then the sum one process accumulates, whatever their sizes.
        return self.loader.weight

    def arm(self, single: bool) -> tuple[float, bool]:
        """The sync's bucket weight, and whether the gradients already carry it."""
        if self.loss_reduction == "count":
            # A count comes later, at backward (`late_factor`); DDP's 1/P needs none (it was
            # left at 0 here, and the buckets were zeroed: the comparison never trained).
            self.armed = (1.0 / self.comm.size if self.weighting == "uniform" else 0.0, True)
            return self.armed
        own, total = self.window
        if self.weighting == "uniform" or self.loss_reduction == "sum" or single:
            self.armed = ((self.factor() or 0.0) if own else 0.0, True)
        else:
            # Accumulated "mean": every micro-batch carried its own share already; the
            # weight only says whether this rank had samples in the window (0: zeros).
            self.armed = ((own / total if own else 0.0), True)
        return self.armed

    def seen(self, token: int) -> None:
        """A second backward through batch `token` syncs again: its units are in already."""
        self._seen.add(token)

    def set_count(self, count: float) -> float:
        """This batch's units on this rank (collective); the count over all ranks."""
        if self.loss_reduction != "count":
            raise RuntimeError(
                f"set_loss_count() is for loss_reduction='count' (this model: "
                f"{self.loss_reduction!r}); pass loss_reduction='count' to BalancedDataParallel"
            )
        count = float(count)
        if not (math.isfinite(count) and count >= 0):
            raise ValueError(f"count={count!r} must be a finite number >= 0 (this rank's units)")
        buffer = torch.tensor([count], dtype=torch.float64)
        self.comm.allreduce_sum_(buffer)
        total = float(buffer.item())
        if not total > 0:
            raise ValueError(
                "set_loss_count: the ranks' counts sum to 0: a loss over no units has no gradient"
            )
        self._units[self.loader.batches_served] = (count, total)
        return total

    def late_factor(self, token: int, synced_now: bool, accumulating: bool) -> float:
        """A 'count' loss's factor for batch `token`, now that its units are known.

        `synced_now`: `token` is the open sync's only batch; `accumulating`: a sync is open
        and `token` is one of its micro-batches. Re-weighs the armed sync (`armed`).
        """
        units = self._units.get(token)
        if units is None:
            raise RuntimeError(
                f"rank {self.comm.rank}: backward without this batch's count: call "
                "model.set_loss_count(n) on every rank after drawing the batch and before "
                "backward (loss_reduction='count')"
            )
        if token in self._given:  # a second backward through this forward
            return self._given[token]
        if self.weighting == "uniform":
            return 1.0 / self.comm.size
        own, total = units
        if token not in self._seen:
            self._seen.add(token)
            self.window[0] += own
            self.window[1] += total
        if synced_now:
            self.armed = (own / total, True)
            self._given[token] = own / total
        else:
            if accumulating:
                # Accumulating: each micro-batch adds its units' sum; the sync divides by all.
                self.armed = (1.0 / self.window[1] if self.window[0] else 0.0, False)
            self._given[token] = own
        return self._given[token]
