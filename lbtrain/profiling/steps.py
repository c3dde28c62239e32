"""Timed training steps on synthetic batches, shared by the profiler and re-timing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from lbtrain.devices import synchronize
from lbtrain.emulation import Slowdown, rank_cpu_time
from lbtrain.profiling.state import TrainingState

__all__ = ["Batch", "LossFn", "MakeBatch", "StepTimer", "resolve_device", "step_sandbox"]

Batch = tuple[torch.Tensor, torch.Tensor]
MakeBatch = Callable[[int, torch.device], Batch]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def resolve_device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    """`device`, default the model's first parameter's, with a CUDA index filled in."""
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class StepTimer:
    """Runs and times training steps the way training runs them, one cached batch per size.

    Args:
        model, optimizer, loss_fn, make_batch: the workload, as for `profile_replica`.
        device: where the batches go.
        slowdown: emulated slowdown applied to each timed step.
        timer: clock in seconds.
        cpu_timer: CPU seconds of this rank (`rank_cpu_time`), for the slowdown on CPU
            devices; None to
            use `timer` alone.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        make_batch: MakeBatch,
        *,
        device: torch.device,
        slowdown: Slowdown,
        timer: Callable[[], float],
        cpu_timer: Callable[[], float] | None,
    ) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.make_batch, self.device = make_batch, device
        self.slowdown, self.timer = slowdown, timer
        # The emulated sleep follows the CPU time of a CPU step, so that waiting for a shared
        # core is not multiplied by the slowdown factor; GPU steps, and fake clocks, use wall
        # time.
        self.cpu_timer = cpu_timer if device.type == "cpu" else None
        self._batches: dict[int, Batch] = {}

    def batch(self, size: int) -> Batch:
        """The synthetic batch of `size` samples, made once."""
        if size not in self._batches:
            self._batches[size] = self.make_batch(size, self.device)
        return self._batches[size]

    def clear(self) -> None:
        """Drop the cached batches (they hold device memory the cap probe needs)."""
        self._batches.clear()

    def train_step(self, size: int) -> None:
        """One untimed forward, backward and optimizer step on `size` samples."""
        inputs, targets = self.batch(size)
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_fn(self.model(inputs), targets).backward()
        self.optimizer.step()

    def timed_step(self, size: int) -> float:
        """Seconds of one training step on `size` samples, emulated slowdown included."""
        self.batch(size)
        synchronize(self.device)
        begin = self.timer()
        with self.slowdown.step(
            self.timer, lambda: synchronize(self.device), cpu_timer=self.cpu_timer
        ):
            self.train_step(size)
        return self.timer() - begin

    def median_time(self, size: int, repeats: int) -> float:
        """Median of `repeats` timed steps at `size`, after one untimed warm-up step."""
        self.train_step(size)  # first step at a new size pays for allocation and caching
        return statistics.median([self.timed_step(size) for _ in range(repeats)])


@contextmanager
def step_sandbox(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    make_batch: MakeBatch,
    *,
    device: torch.device,
    seed: int,
    slowdown: Slowdown | None = None,
    timer: Callable[[], float] = time.perf_counter,
    cpu_timer: Callable[[], float] | None = rank_cpu_time,
    sync_batchnorm: bool = False,
) -> Iterator[StepTimer]:
    """A StepTimer whose steps leave no trace: model, optimizer, mode and RNG are restored.

    The RNG is forked and seeded with `seed`, so the synthetic batches are the same on every
    run; the model is put in training mode, as training runs it. With `sync_batchnorm`, its
    BatchNorm layers compute as synchronised BatchNorm does on several ranks
    (`lbtrain.parallel.batchnorm.timed_as_synchronised`), so the steps cost what training's do.
    """
    # Here, not at the top: lbtrain.parallel plans through lbtrain.profiling.
    from lbtrain.parallel.batchnorm import timed_as_synchronised

    steps = StepTimer(
        model,
        optimizer,
        loss_fn,
        make_batch,
        device=device,
        slowdown=slowdown or Slowdown(1.0),
        timer=timer,
        cpu_timer=cpu_timer,
    )
    snapshot = TrainingState(model, optimizer)
    cuda_devices = [device.index] if device.type == "cuda" else []
    try:
        with (
            torch.random.fork_rng(devices=cuda_devices),
            timed_as_synchronised(model, sync_batchnorm),
        ):
            torch.manual_seed(seed)
            model.train()
            yield steps
    finally:
        steps.clear()
        snapshot.restore()
        if device.type == "cuda":
            torch.cuda.empty_cache()
