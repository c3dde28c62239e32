"""How the engine times a step: marks on the host clock, or events on the device's stream.

The engine takes five marks a step (start, compute done, wait done, sync done, update
done). `StepTimer` reads the host clock at each, which on a GPU is only right if the device
is synchronised first, and each synchronisation stalls the host until the device is idle.
`EventTimer` (a CUDA device with no emulated slowdown) records an event on the stream
instead and reads the events once, at the epoch's end: the host queues the next step's
work while the device finishes this one. Its times are the device's, on a clock aligned
with the host's at the start of training, so the trace and the records read them alike.

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
        """Called once before the first step of a fit."""

    def mark(self) -> Any:
        """One of a step's five marks: here, the time now."""
        return self.now()

    def times(self, marks: Sequence[Any], samples: int, epoch: int) -> StepTimes | PendingTimes:
        """The step's phases from the five marks the engine took, for `samples` computed
        in (0-based) `epoch`."""
        return StepTimes(*marks, samples=samples)


class PendingTimes:
    """A step's times that are read once its events have completed (`resolve`)."""

    def __init__(self, timer: EventTimer, marks: Sequence[Any], samples: int) -> None:
        self.timer, self.marks, self.samples = timer, marks, samples
        self._times: StepTimes | None = None

    def ready(self) -> bool:
        """Whether the step's work is done (its times can be read without waiting)."""
        return self._times is not None or bool(self.marks[-1].query())

    def resolve(self) -> StepTimes:
        """The step's times; waits for the step's last event if it has not completed."""
        if self._times is None:
            self.marks[-1].synchronize()
            seconds = [self.timer.seconds(event) for event in self.marks]
            self._times = StepTimes(*seconds, samples=self.samples)
            self.marks = ()  # the events can go
        return self._times


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
        self._reference: Any = None
        self._at = 0.0

    def start(self) -> None:
        """Align the device's clock with the host's: an event on an idle device, now."""
        synchronize(self.device)
        self._reference = self.mark()
        self._reference.synchronize()
        self._at = self.now()

    def mark(self) -> Any:
        """Record an event on the current stream."""
        event = self.event()
        event.record()
        return event

    def times(self, marks: Sequence[Any], samples: int, epoch: int) -> PendingTimes:
        """The step's times, to `resolve` once its work is done."""
        if self._reference is None:
            self.start()
        return PendingTimes(self, marks, samples)

    def seconds(self, event: Any) -> float:
        """When the device reached `event`, on the host's clock."""
        return self._at + self._reference.elapsed_time(event) / 1e3


class HostEvent:
    """`torch.cuda.Event`'s interface on the host clock: a CPU stand-in for `EventTimer`."""

    def __init__(self) -> None:
        self.at = 0.0

    def record(self) -> None:
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
