"""How the engine times a step: marks on the host clock, or events on the device's stream.

The engine takes five marks a step (start, compute done, wait done, sync done, update
done). `StepTimer` reads the host clock at each, which on a GPU is only right if the device
is synchronised first: four waits a step for the device to be idle. `EventTimer` (a CUDA
device with no emulated slowdown) records an event on the device's stream instead and reads
the events at the epoch's end (and every few hundred steps, those already done). The step
itself still waits where it needs a value from the device (the loss, gradients staged
through the host), so what this gains is measured, not assumed: the optimizer's kernels
overlap the next batch's loading, and a phase is timed where the device spends it (an
NCCL allreduce's tail counts as sync, not as the next compute). Each phase is the time
between two of the step's own events (float milliseconds stay precise over short spans);
only its start is placed on the host's clock, through a reference event taken at each
epoch's start.

`HostEvent` stands in for `torch.cuda.Event` on the CPU, so the deferred path runs in the
tests of a machine without a GPU (it proves the bookkeeping, not the CUDA calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lbtrain.devices import synchronize

__all__ = ["EventTimer", "HostEvent", "PendingTimes", "StepTimer", "StepTimes"]


@dataclass(frozen=True)
class StepTimes:
    """One step's phases on this rank's clock: compute, wait for the slowest, sync, update."""

    start: float
    computed: float
    waited: float
    synced: float
    done: float
    samples: int

    @property
    def compute(self) -> float:
        """Forward, backward and the optimizer step."""
        return (self.computed - self.start) + (self.done - self.synced)

    @property
    def wait(self) -> float:
        """Idle in the control allreduce, for the slowest rank."""
        return self.waited - self.computed

    @property
    def comm(self) -> float:
        """Gradient communication not hidden behind backward."""
        return self.synced - self.waited

    def ready(self) -> bool:
        """Always: host times are known as soon as they are taken."""
        return True

    def resolve(self) -> StepTimes:
        """Itself."""
        return self


class StepTimer:
    """The engine's clock; tests pass one whose times follow a model, so decisions made
    from timing (re-planning) repeat exactly."""

    # Marks that are device events, read after the step: the engine then leaves the device
    # unsynchronised around the step.
    deferred = False

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        return time.perf_counter()

    def start(self) -> None:
        """Called before each epoch's first step."""

    def mark(self) -> Any:
        """One of a step's five marks: here, the time now."""
        return self.now()

    def times(self, marks: Sequence[Any], samples: int, epoch: int) -> StepTimes | PendingTimes:
        """The step's phases from the five marks the engine took, for `samples` computed
        in (0-based) `epoch`."""
        return StepTimes(*marks, samples=samples)


class PendingTimes:
    """A step's times that are read once its events have completed (`resolve`); its
    attributes are `StepTimes`', each read through `resolve` (which may wait)."""

    def __init__(
        self, timer: EventTimer, marks: Sequence[Any], samples: int, anchor: tuple[Any, float]
    ) -> None:
        self.timer, self.marks, self.samples, self.anchor = timer, marks, samples, anchor
        self._times: StepTimes | None = None

    def ready(self) -> bool:
        """Whether the step's work is done (its times can be read without waiting)."""
        return self._times is not None or bool(self.marks[-1].query())

    def resolve(self) -> StepTimes:
        """The step's times; waits for the step's last event if it has not completed."""
        if self._times is None:
            self.marks[-1].synchronize()
            reference, at = self.anchor
            times = [at + reference.elapsed_time(self.marks[0]) / 1e3]
            for begin, end in zip(self.marks, self.marks[1:], strict=False):
                times.append(times[-1] + begin.elapsed_time(end) / 1e3)
            self._times = StepTimes(*times, samples=self.samples)
            self.marks, self.anchor = (), (None, 0.0)  # the events can go
        return self._times

    def __getattr__(self, name: str) -> Any:
        # start, computed, ..., compute, wait, comm: as StepTimes has them, once read.
        if name in _TIMES_FIELDS:
            return getattr(self.resolve(), name)
        raise AttributeError(name)


_TIMES_FIELDS = frozenset(
    {"start", "computed", "waited", "synced", "done", "compute", "wait", "comm"}
)


class EventTimer(StepTimer):
    """Marks are events recorded on `device`'s current stream, read at the epoch's end.

    Args:
        device: the rank's device.
        event: makes an event (default a timing `torch.cuda.Event`; `HostEvent` on a CPU).
    """

    deferred = True

    def __init__(self, device: torch.device, event: Callable[[], Any] | None = None) -> None:
        self.device = device
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self._anchor: tuple[Any, float] | None = None  # (reference event, host time)

    def start(self) -> None:
        """Align the device's clock with the host's: an event on an idle device, now (at
        each epoch's start, so a step's start is placed within milliseconds of it)."""
        synchronize(self.device)
        reference = self.mark()
        reference.synchronize()
        self._anchor = (reference, self.now())

    def mark(self) -> Any:
        """Record an event on the rank's device's current stream."""
        event = self.event()
        event.record(self._stream())
        return event

    def times(self, marks: Sequence[Any], samples: int, epoch: int) -> PendingTimes:
        """The step's times, to `resolve` once its work is done."""
        if self._anchor is None:
            self.start()
        assert self._anchor is not None
        return PendingTimes(self, marks, samples, self._anchor)

    def _stream(self) -> Any:
        # The rank's device's stream, whichever device is current on this thread.
        return torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None


class HostEvent:
    """`torch.cuda.Event`'s interface on the host clock: a CPU stand-in for `EventTimer`."""

    def __init__(self) -> None:
        self.at = 0.0

    def record(self, stream: Any = None) -> None:
        """Take the time now (a CPU has no queue: its work is done when the call returns)."""
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        """Done, always."""
        return True

    def elapsed_time(self, end: HostEvent) -> float:
        """Milliseconds from this event to `end`, as CUDA reports them."""
        return (end.at - self.at) * 1e3
