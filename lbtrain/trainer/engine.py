"""The engine: the one training loop in the repository, and the hooks every concern uses.

Each step, every rank computes the mean loss over its share b_i of the global batch and
backpropagates it weighted by b_i / B through `BalancedDataParallel` (the wrapper a user's
own loop uses); the gradients are sum-allreduced in persistent buckets; one small allreduce
(`Control`) shares the loss, the step metric, stop requests and whether any loss went
non-finite; every rank takes the same optimizer step. The update is the one a single
process would make on the whole global batch.

With overlap on, each bucket's allreduce starts during backward. The control allreduce
comes after backward on purpose: ranks arrive there as their compute ends, so its duration
is this rank's *waiting* for the slowest, and the wait for the gradient buckets after it
measures the *communication* not hidden behind backward.

Everything else (progress, re-planning, metrics, evaluation, checkpoints, the divergence
guard, the trace) is a `Callback` (lbtrain/trainer/callbacks.py). At an epoch's end the
engine calls them in the order of their `order`: progress, re-plan, metrics, divergence,
evaluation, checkpoint; so a checkpoint holds the next epoch's plan and the evaluation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from lbtrain.balancer import BalancePlan
from lbtrain.collective import CollectiveError
from lbtrain.comm import Communicator
from lbtrain.data import BalancedLoader
from lbtrain.devices import synchronize
from lbtrain.emulation import Slowdown, rank_cpu_time
from lbtrain.parallel import BalancedDataParallel
from lbtrain.text import plural
from lbtrain.trainer.control import Control
from lbtrain.trainer.records import EpochRecord, Totals
from lbtrain.trainer.replanner import predicted_steps
from lbtrain.trainer.signals import StopSignal
from lbtrain.trainer.timing import (
    CollectiveWaits,
    PendingTimes,
    StepTimer,
    StepTimes,
    with_inner_wait,
)

# StepTimer and StepTimes live in lbtrain.trainer.timing; they stay importable from here.
__all__ = ["Callback", "Engine", "RunState", "StepTimer", "StepTimes", "TrainingDiverged"]

# Steps whose event times may wait to be read; beyond, the engine counts the ones done.
SETTLE_EVERY = 256


class TrainingDiverged(CollectiveError):
    """The loss went non-finite or ran away; every rank raises it at the same step."""


@dataclass
class RunState:
    """Where the run is: `epoch` full epochs plus `step` steps of the next are done."""

    epochs: int
    epoch: int = 0
    step: int = 0
    global_step: int = 0
    stop_code: int = 0
    totals: Totals = field(default_factory=Totals)
    record: EpochRecord | None = None  # the epoch in progress (or the one a stop cut short)

    @property
    def finished(self) -> bool:
        """Every epoch ran."""
        return self.epoch >= self.epochs


class Callback:
    """A hook into the engine; override what you need. `key` names its checkpointed state."""

    order: ClassVar[int] = 50
    key: ClassVar[str | None] = None

    def on_fit_start(self, engine: Engine) -> None:
        """Before the first step of this process (after a resume: the first it takes)."""

    def on_step_end(
        self, engine: Engine, control: Control, times: StepTimes | PendingTimes
    ) -> None:
        """After each step's update; `control` holds the job's sums. `times.resolve()` gives
        the step's phases; with CUDA event timing it waits for the step's work, so read it
        at the epoch's end (as the trace does)."""

    def on_epoch_end(self, engine: Engine, record: EpochRecord) -> None:
        """After an epoch, on every rank, with every rank's figures in `record.ranks`."""

    def on_log(self, engine: Engine, entry: dict[str, Any]) -> None:
        """A metrics entry (epoch, eval, stop) to keep; rank 0 writes, others ignore."""

    def on_fit_end(self, engine: Engine) -> None:
        """After training ends: all epochs done, or stopped (`engine.state.stop_code`)."""

    def close(self) -> None:
        """Release what it holds (files), once the run's outputs are written."""

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of it (None: nothing)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()`'s values."""


class Engine:
    """Trains `model` for `epochs` with the balanced wrapper, calling `callbacks`; collective.

    Args:
        model, optimizer, scheduler: the scheduler is stepped once per global batch.
        loader: this rank's balanced loader (its plan can change between epochs).
        comm: the job's communicator.
        loss_fn: mean-reduced loss on (outputs, targets).
        device: this rank's device.
        epochs: total epochs of the run.
        step_metric: summed metric of a step (a classifier's correct predictions), or None.
        slowdown_at: the emulated slowdown of each epoch (a testing aid).
        weighting: "share" (exact) or "uniform" (1/P, as DDP; only to compare).
        overlap: start bucket allreduces during backward.
        sync_batchnorm: BatchNorm over the global batch (lbtrain.SyncBatchNorm).
        stop: the run's signal catcher; a request on any rank stops every rank after a step.
        callbacks: the concerns (see the module docstring).
        timer: the clock (default wall time).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        loader: BalancedLoader,
        comm: Communicator,
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        device: torch.device,
        epochs: int,
        step_metric: Callable[[torch.Tensor, torch.Tensor], float] | None = None,
        slowdown_at: Callable[[int], Slowdown] | None = None,
        weighting: str = "share",
        overlap: bool = True,
        sync_batchnorm: bool = True,
        stop: StopSignal | None = None,
        callbacks: Iterable[Callback] = (),
        timer: StepTimer | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.loader, self.comm, self.device = loader, comm, device
        self.loss_fn, self.step_metric = loss_fn, step_metric
        self.slowdown_at = slowdown_at or (lambda epoch: Slowdown(1.0))
        self.weighting, self.overlap, self.sync_batchnorm = weighting, overlap, sync_batchnorm
        self.stop = stop or StopSignal()
        self.callbacks = sorted(callbacks, key=lambda c: c.order)
        self.timer = timer or StepTimer()
        self.state = RunState(epochs)
        self.parallel: BalancedDataParallel | None = None
        # BatchNorm statistics: the largest share's after each step, on every rank, so an
        # evaluation or a checkpoint sees one state (False only to show why).
        self.broadcast_buffers = True
        self._cpu_timer = rank_cpu_time if device.type == "cpu" else None
        self._waits = CollectiveWaits(
            self.timer.now, self._sync_device if device.type == "cuda" else None
        )
        self._timed: list[StepTimes | PendingTimes] = []  # this epoch's, not yet counted
        self._began = 0.0  # when the epoch in progress began, on the timer's clock

    @property
    def plan(self) -> BalancePlan:
        """The plan in force (re-planning may switch it between epochs)."""
        return self.loader.plan

    def close(self) -> None:
        """Let every callback release what it holds."""
        for callback in self.callbacks:
            callback.close()

    def settle(self) -> None:
        """Add every timed step of the epoch in progress to its record (waiting for event
        marks): a checkpoint taken mid-epoch then holds all the steps' times."""
        if self.state.record is not None:
            self._settle(self.state.record)

    def training_clock(self) -> float:
        """This rank's seconds of training in the run so far, up to the end of the latest
        step: evaluations and checkpoints' writes left out. It reads no clock (the step
        times already read it), so no step phase takes the reading's time."""
        state, record = self.state, self.state.record
        # At an epoch's end the totals hold it already (and the step is back at 0).
        return state.totals.seconds + (record.seconds if record is not None and state.step else 0.0)

    def leave_out(self, seconds: float) -> None:
        """Leave `seconds` spent mid-epoch (a checkpoint's write) out of the epoch's time."""
        self._began += seconds

    def log(self, entry: dict[str, Any]) -> None:
        """Hand a metrics entry to the callbacks that keep them."""
        for callback in self.callbacks:
            callback.on_log(self, entry)

    def fit(self) -> RunState:
        """Train from the state's position to the end, or to a stop; collective."""
        state = self.state
        self.model.train()
        # The wrapper a user's loop uses; its wait comes after the control allreduce.
        self.parallel = BalancedDataParallel(
            self.model,
            self.comm,
            self.loader,
            overlap=self.overlap,
            sync_in_backward=False,
            weighting=self.weighting,
            broadcast_buffers=self.broadcast_buffers,
            sync_batchnorm=self.sync_batchnorm,
        )
        try:
            with self.stop.deferring():
                self._timed = []  # nothing left over from a fit an exception ended
                for callback in self.callbacks:
                    callback.on_fit_start(self)
                while not state.finished and not state.stop_code:
                    self._epoch()
                if not state.stop_code:
                    # A signal after the last step's control (during the last evaluation or
                    # checkpoint) is read here: the run ends with its status, not later.
                    state.stop_code = (
                        Control.of_step(0, 0.0, 0, 0, self.stop.code).allreduce(self.comm).stop_code
                    )
            for callback in self.callbacks:
                callback.on_fit_end(self)
        except TrainingDiverged as exc:
            self.log(
                {
                    "type": "stop",
                    "epoch": state.epoch + 1,
                    "step": state.step,
                    "reason": f"diverged: {exc}",
                    "code": 1,
                    "time": time.time(),
                }
            )
            raise
        finally:
            self.parallel.gradients.close()  # hooks go; the gradients stay bucket views
        return state

    def _epoch(self) -> None:
        state, loader = self.state, self.loader
        epoch = state.epoch
        loader.set_epoch(epoch)
        self.timer.start()  # event timing: the device's clock placed on the host's again
        slowdown = self.slowdown_at(epoch)
        plan = loader.plan
        # The plan's prediction for each step, to set beside what the step measures.
        predictions = [
            predicted_steps(plan, shares, self.comm.rank)
            for _, _, shares in loader.batch_sampler.schedule
        ]
        if state.record is None or state.step == 0:
            state.record = EpochRecord(
                epoch, slowdown=slowdown.factor, batch_sizes=list(plan.batch_sizes),
                correction=state.totals.correction(list(plan.batch_sizes)),
            )  # fmt: skip
            if self.step_metric is not None:
                state.record.metric_sum = 0.0
        record, first = state.record, state.step
        # The rate the epoch trains at (its first step's; at its end the scheduler has moved
        # on to the next epoch's). An interrupted epoch keeps the rate its checkpoint holds,
        # unless the checkpoint predates the field.
        if not record.lr:
            record.lr = float(self.optimizer.param_groups[0]["lr"])
        self._began = self.timer.now() - record.seconds  # an interrupted epoch's carries on
        for step, (inputs, targets) in enumerate(loader):
            if step < first:  # resuming mid-epoch: same permutation, skip what was done
                continue
            control, times = self._step(inputs, targets, slowdown)
            self._count(record, control, times.samples, predictions[step])
            self._timed.append(times)
            if len(self._timed) >= SETTLE_EVERY:  # a long epoch: count what is done so far
                self._settle(record, wait=False)
            record.seconds = self.timer.now() - self._began
            state.step, state.global_step = step + 1, state.global_step + 1
            for callback in self.callbacks:
                callback.on_step_end(self, control, times)
            if control.stop_code:
                state.stop_code = control.stop_code
                break
        self._settle(record)
        if state.stop_code and state.step < len(loader):
            return  # an interrupted epoch: its record travels in the checkpoint
        self._end_epoch(record)

    def _end_epoch(self, record: EpochRecord) -> None:
        state = self.state
        record.ranks = self.comm.allgather(record.measured())
        state.epoch, state.step = state.epoch + 1, 0
        state.totals.add(record)
        for callback in self.callbacks:
            callback.on_epoch_end(self, record)
        state.totals.last = record.to_metrics()  # with the re-plan, if one was made
        state.record = None

    def _step(
        self, inputs: Any, targets: Any, slowdown: Slowdown
    ) -> tuple[Control, StepTimes | PendingTimes]:
        parallel, loader, mark = self.parallel, self.loader, self.timer.mark
        assert parallel is not None
        weight, value, metric = loader.weight, 0.0, 0.0
        # No sample at this step: a zero share, or a tail shorter than the ranks.
        empty = not loader.samples
        # Event marks need no synchronisation, unless an emulated sleep must follow the
        # device's compute.
        sync = self._sync_device if slowdown.active or not self.timer.deferred else None
        start = mark()
        parallel.zero_grad()
        # An empty batch computes nothing and adds zeros in the sync, unless the model holds
        # collectives (synchronised BatchNorm): then it joins them.
        if not empty or parallel.collective_forward:
            outputs, loss, targets = self._backward(inputs, targets, slowdown, sync)
            if not empty:  # a mean over no samples is NaN, and no divergence
                value = float(loss.detach())
                if self.step_metric is not None:
                    metric = self.step_metric(outputs.detach(), targets)
        # Buckets not started from backward start before the control allreduce, so every
        # rank starts its collectives in the same order. (A rank that ran no forward meets
        # the others' epoch check here: waiting too.)
        with self._waits.attached(parallel):
            parallel.launch()
        computed = mark()
        clock = self.training_clock() if self.comm.rank == 0 else 0.0
        control = Control.of_step(weight, value, metric, len(targets), self.stop.code, clock)
        control = control.allreduce(self.comm)
        waited = mark()
        parallel.finish()  # also on the way out: no collective left in flight
        if control.nonfinite:
            self._diverged(value, control)
        synced = mark()
        with slowdown.step(synchronize=sync, cpu_timer=self._cpu_timer):
            self.optimizer.step()
            self.scheduler.step()
        marks = (start, computed, waited, synced, mark())
        samples = 0 if empty else len(targets)
        times = self.timer.times(marks, samples, self.state.epoch)
        inner = self._waits.take()
        return control, with_inner_wait(times, inner) if inner else times

    def _backward(
        self, inputs: Any, targets: Any, slowdown: Slowdown, sync: Callable[[], None] | None
    ) -> tuple[Any, torch.Tensor, Any]:
        """Forward and backward of this rank's batch, stretched by its emulated slowdown."""
        parallel = self.parallel
        assert parallel is not None
        with slowdown.step(synchronize=sync, cpu_timer=self._cpu_timer) as segments:
            # Time in the collectives inside the step (synchronised BatchNorm's, the wrapper's
            # epoch check at each epoch's first step) is waiting, not compute; and an
            # emulated slow rank is slow between them too.
            emulated = (segments.split, segments.resume) if slowdown.active else ()
            with self._waits.attached(parallel, *emulated):
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                outputs = parallel(inputs)
                loss = self.loss_fn(outputs, targets)
                loss.backward()
        return outputs, loss, targets

    def _count(
        self,
        record: EpochRecord,
        control: Control,
        samples: int,
        prediction: tuple[float, float],
    ) -> None:
        batch = int(control.samples)
        record.steps += 1
        record.samples += batch
        record.own_samples += samples
        record.own_steps += 1 if samples else 0
        record.loss_sum += control.loss * batch
        if record.metric_sum is not None:
            record.metric_sum += control.metric
        record.predicted_compute += prediction[0]
        record.predicted_seconds += prediction[1]

    def _settle(self, record: EpochRecord, wait: bool = True) -> None:
        """Add the steps' times to the record, in step order, once they can be read (event
        marks: once the device is done with them, which this waits for unless `wait` is
        False: then it stops at the first step not done)."""
        done = 0
        for pending in self._timed:
            if not wait and not pending.ready():
                break
            times = pending.resolve()
            record.compute += times.compute
            if self.comm.size == 1:
                # No rank to wait for: the control step's own bookkeeping is work, not idle.
                record.compute += times.wait
            else:
                record.wait += times.wait
            record.comm += times.comm
            done += 1
        del self._timed[:done]

    def _diverged(self, value: float, control: Control) -> None:
        state = self.state
        shown = value if not math.isfinite(value) else "non-finite"
        raise TrainingDiverged(
            f"training diverged: the loss became {shown} at epoch {state.epoch + 1}, step "
            f"{state.step + 1} (on {plural(int(control.nonfinite), 'rank')}); lower the "
            "learning rate (--lr), or check the data for NaN or infinite values; earlier "
            "checkpoints, if any, are kept"
        )

    def _sync_device(self) -> None:
        synchronize(self.device)
