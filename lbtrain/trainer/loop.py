"""`fit`: the one training loop in the repository.

Each step, every rank computes the mean loss over its share b_i of the global batch and
backpropagates it weighted by b_i / B; the gradients are sum-allreduced in persistent
buckets (`GradientSync`); one small allreduce shares the loss, the stop requests and whether
any loss went non-finite; every rank takes the same optimizer step. The update is the one a
single process would make on the whole global batch.

With overlap on, each bucket's allreduce starts during backward, as soon as its gradients
are in. The small allreduce comes after backward on purpose: ranks arrive there as their
compute ends, so its duration is this rank's *waiting* for the slowest, and the wait for
the gradient buckets after it measures the *communication* not hidden behind backward.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import nn

from lbtrain.balancer import BalancePlan
from lbtrain.comm import Communicator
from lbtrain.data import BalancedLoader
from lbtrain.devices import synchronize
from lbtrain.emulation import Slowdown, rank_cpu_time
from lbtrain.parallel import BalancedDataParallel
from lbtrain.session import CollectiveError
from lbtrain.trainer.progress import Progress
from lbtrain.trainer.replan import predicted_steps, propose, refreshed

__all__ = ["EpochRecord", "FitResult", "StopSignal", "TrainingDiverged", "fit"]

# Exit statuses of a run stopped by a signal, as shells report them (128 + signal number).
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


class TrainingDiverged(CollectiveError):
    """The loss became NaN or infinite on some rank; every rank raises it at the same step."""


class StopSignal:
    """Turns SIGINT and SIGTERM into a request to stop after the current step.

    The loop shares the request with every rank in its per-step allreduce, so all ranks
    stop after the same step, save one checkpoint and exit. A second Ctrl-C interrupts at
    once, for a user who does not want to wait.
    """

    def __init__(self) -> None:
        self.signals: list[int] = []

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and signal.SIGINT in self.signals:
            raise KeyboardInterrupt
        self.signals.append(signum)

    @contextmanager
    def installed(self) -> Iterator[StopSignal]:
        """Catch the signals while the block runs, then restore.

        Only a process's main thread receives signals (and may install handlers); a rank
        that is another thread (`lbtrain.comm.LocalWorld`) runs without, and stops when a
        rank that has them asks.
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in SIGNAL_EXIT}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


@dataclass
class EpochRecord:
    """One epoch as this rank saw it; loss and accuracy are over the whole global batch."""

    epoch: int
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    correct: float = 0.0
    seconds: float = 0.0
    compute: float = 0.0
    wait: float = 0.0
    comm: float = 0.0
    own_samples: int = 0
    predicted_compute: float = 0.0
    predicted_seconds: float = 0.0
    slowdown: float = 1.0
    batch_sizes: list[int] = field(default_factory=list)
    ranks: list[dict[str, float]] = field(default_factory=list)
    replan: dict[str, Any] | None = None

    @property
    def step_seconds(self) -> float:
        """Measured seconds per step."""
        return self.seconds / max(self.steps, 1)

    @property
    def predicted_step_seconds(self) -> float:
        """The plan's predicted seconds per step, for the steps this epoch took."""
        return self.predicted_seconds / max(self.steps, 1)

    @property
    def idle_fraction(self) -> float:
        """The share of the working ranks' time spent waiting for the slowest.

        Ranks with no samples are left out: the plan idles them on purpose (and says so).
        """
        working = [r for r in self.ranks if r["samples"] > 0]
        total = sum(r["seconds"] for r in working)
        return sum(r["wait"] for r in working) / total if total > 0 else 0.0

    @property
    def loss(self) -> float:
        """Mean training loss over the epoch's samples."""
        return self.loss_sum / max(self.samples, 1)

    @property
    def accuracy(self) -> float:
        """Training accuracy over the epoch's samples."""
        return self.correct / max(self.samples, 1)


@dataclass
class FitResult:
    """Where training ended: after `epoch` full epochs plus `step` steps of the next."""

    epoch: int
    step: int
    global_step: int
    history: list[EpochRecord] = field(default_factory=list)
    stop_code: int = 0


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loader: BalancedLoader,
    comm: Communicator,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    epochs: int,
    slowdown: Slowdown | None = None,
    start_epoch: int = 0,
    start_step: int = 0,
    global_step: int = 0,
    weighting: str = "share",
    progress: Progress | None = None,
    stop: StopSignal | None = None,
    after_epoch: Callable[[EpochRecord, int], None] | None = None,
    replan: bool = False,
    slowdown_at: Callable[[int], Slowdown] | None = None,
    overlap: bool = True,
) -> FitResult:
    """Train from (start_epoch, start_step) to the end of `epochs`; collective.

    Args:
        model: the model on `device`, identical on every rank.
        optimizer, scheduler: stepped once per global batch (the scheduler per step).
        loader: this rank's balanced loader.
        comm: the job's communicator.
        loss_fn: mean-reduced loss on (outputs, targets).
        device: this rank's device.
        epochs: total epochs of the run.
        slowdown: emulated slowdown, applied to every compute phase as profiling applies it.
        start_epoch, start_step: resume position (steps already taken in start_epoch).
        global_step: optimizer steps taken before start.
        weighting: "share" multiplies gradients by b_i / B (exact); "uniform" by 1 / P, as
            DDP does, only to compare.
        progress: rank-0 display.
        stop: signal catcher; a caught signal on any rank stops every rank after the step.
        after_epoch: called on every rank with the epoch's record and the global step
            (evaluation and checkpoints happen there), after any re-plan, so a checkpoint
            holds the plan of the next epoch.
        replan: at each epoch's end, refresh the plan's speed model and sync cost from what
            the epoch measured (the next epoch's prediction), and switch every rank to the
            plan they imply when it is predicted more than 5% faster (`loader.plan` follows).
        slowdown_at: the emulated slowdown of each epoch, for a slowdown that changes
            mid-run (a testing aid); default `slowdown` throughout.
        overlap: start each gradient bucket's allreduce from backward, as soon as its
            gradients are in; False reduces them all after backward (same result).

    Raises:
        TrainingDiverged: on every rank, when any rank's loss is not finite.
    """
    slowdown = slowdown or Slowdown(1.0)
    progress = progress or Progress(False, epochs)
    cpu_timer = rank_cpu_time if device.type == "cpu" else None

    def sync_device() -> None:
        synchronize(device)

    history: list[EpochRecord] = []
    model.train()
    # The wrapper a user's own loop uses: one path from the loader to the update. Its wait
    # comes after the control allreduce (sync_in_backward=False), see the module docstring.
    parallel = BalancedDataParallel(
        model, comm, loader, overlap=overlap, sync_in_backward=False, weighting=weighting
    )
    try:
        for epoch in range(start_epoch, epochs):
            loader.set_epoch(epoch)
            if slowdown_at is not None:
                slowdown = slowdown_at(epoch)
            plan = loader.plan
            # The plan's prediction for each step of the epoch, to set beside what it measures.
            predictions = [
                predicted_steps(plan, shares, comm.rank)
                for _, _, shares in loader.batch_sampler.schedule
            ]
            record = EpochRecord(
                epoch, slowdown=slowdown.factor, batch_sizes=list(plan.batch_sizes)
            )
            first = start_step if epoch == start_epoch else 0
            progress.start_epoch(epoch, len(loader), first)
            began = mark = time.perf_counter()
            for step, (inputs, targets) in enumerate(loader):
                if step < first:  # resuming mid-epoch: same permutation, skip what was done
                    mark = time.perf_counter()
                    continue
                weight = loader.weight
                value, correct = 0.0, 0.0
                # The weight rides on the outputs' gradient, which is free, instead of one
                # pass over every bucket (benchmark 2 in BENCHMARKS.md).
                parallel.zero_grad()
                if not loader.empty:  # a zero share computes nothing and adds zeros in the sync
                    with slowdown.step(synchronize=sync_device, cpu_timer=cpu_timer):
                        inputs, targets = inputs.to(device), targets.to(device)
                        outputs = parallel(inputs)
                        loss = loss_fn(outputs, targets)
                        loss.backward()
                    value = float(loss.detach())
                    correct = float((outputs.detach().argmax(1) == targets).sum())
                # The buckets not started from backward (parameters without a gradient this
                # step, a rank with no samples) start before the control allreduce, so every
                # rank starts its collectives in the same order.
                parallel.launch()
                computed = time.perf_counter()
                finite = math.isfinite(value)
                # [weighted loss, correct, non-finite ranks, SIGINTs, SIGTERMs, samples]
                control = np.array(
                    [
                        weight * value if finite else 0.0,
                        correct,
                        0.0 if finite else 1.0,
                        float(stop is not None and signal.SIGINT in stop.signals),
                        float(stop is not None and signal.SIGTERM in stop.signals),
                        float(len(targets)),
                    ]
                )
                comm.allreduce_sum_(control)
                waited = time.perf_counter()
                if control[2]:
                    parallel.finish()  # no collective left in flight on the way out
                    raise TrainingDiverged(
                        f"the training loss became {value if not finite else 'non-finite'} at "
                        f"epoch {epoch + 1}, step {step + 1} (on {int(control[2])} rank(s)); "
                        "lower the learning rate (--lr), or check the data for NaN or infinite "
                        "values; earlier checkpoints are kept"
                    )
                parallel.finish()
                synced = time.perf_counter()
                with slowdown.step(synchronize=sync_device, cpu_timer=cpu_timer):
                    optimizer.step()
                    scheduler.step()
                done = time.perf_counter()
                global_step += 1
                batch = int(control[5])
                record.own_samples += len(targets)
                record.predicted_compute += predictions[step][0]
                record.predicted_seconds += predictions[step][1]
                record.steps += 1
                record.samples += batch
                record.loss_sum += float(control[0]) * batch
                record.correct += float(control[1])
                record.compute += (computed - mark) + (done - synced)
                record.wait += waited - computed
                record.comm += synced - waited
                mark = done
                progress.step(step, record.loss, record.samples / max(done - began, 1e-9))
                if control[3] or control[4]:
                    record.seconds = time.perf_counter() - began
                    progress.close()
                    history.append(record)
                    code = SIGNAL_EXIT[signal.SIGTERM] if control[4] else SIGNAL_EXIT[signal.SIGINT]
                    if step + 1 == len(loader):
                        return FitResult(epoch + 1, 0, global_step, history, code)
                    return FitResult(epoch, step + 1, global_step, history, code)
            record.seconds = time.perf_counter() - began
            history.append(record)
            record.ranks = comm.allgather(_measured(record))
            progress.end_epoch(
                f"epoch {epoch + 1}/{epochs}  loss {record.loss:.4f}  train acc "
                f"{100 * record.accuracy:6.2f} %  {record.seconds:.1f} s  "
                f"{record.samples / max(record.seconds, 1e-9):,.0f} samples/s  step "
                f"{1e3 * record.step_seconds:.1f} ms (predicted "
                f"{1e3 * record.predicted_step_seconds:.1f})"
                f"  idle {100 * record.idle_fraction:.0f} %"
            )
            if replan and epoch + 1 < epochs:
                # The next epoch is predicted from what this one measured; the batches change
                # only when that model finds a plan more than 5% faster.
                before = history[-2].ranks if len(history) > 1 else None
                change = propose(plan, record.ranks, previous=before)
                kept = refreshed(plan, record.ranks, before)
                # Rank 0's decision for all: every rank must switch to the very same plan.
                chosen = comm.bcast((kept if change is None else change.plan).to_dict(), root=0)
                if change is not None:
                    record.replan = change.to_dict(plan)
                    progress.line(f"  after epoch {epoch + 1}: {change.describe(plan)}")
                loader.set_plan(BalancePlan.from_dict(chosen))
            if after_epoch is not None:
                after_epoch(record, global_step)
        return FitResult(epochs, 0, global_step, history)
    finally:
        parallel.gradients.close()  # the hooks go; the gradients stay views of its buckets


def _measured(record: EpochRecord) -> dict[str, float]:
    """What this rank shares at the end of an epoch (for the log, the summary, re-planning)."""
    return {
        "compute": record.compute,
        "predicted": record.predicted_compute,
        "wait": record.wait,
        "comm": record.comm,
        "seconds": record.seconds,
        "samples": float(record.own_samples),
        "steps": float(record.steps),
        "slowdown": record.slowdown,
        "seconds_per_sample": record.compute / record.own_samples if record.own_samples else 0.0,
    }
