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

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from lbtrain.devices import synchronize

__all__ = [
    "CollectiveWaits",
    "EventTimer",
    "HostEvent",
    "PendingTimes",
    "StepTimer",
    "StepTimes",
    "with_inner_wait",
]


@dataclass(frozen=True)
class StepTimes:
    """One step's phases on this rank's clock: compute, wait for the slowest, sync, update.

    `inner_wait` is the time spent inside the model's own collectives (synchronised
    BatchNorm) between `start` and `computed`: waiting for the other ranks, so it counts
    as wait, not compute. Counted as compute, it would make the fastest rank look as slow
    as the slowest, and the re-planner could not tell them apart.
    """

    start: float
    computed: float
    waited: float
    synced: float
    done: float
    samples: int
    inner_wait: float = 0.0

    @property
    def compute(self) -> float:
        """Forward, backward and the optimizer step, less the waits inside the model."""
        return (self.computed - self.start) + (self.done - self.synced) - self.inner_wait

    @property
    def wait(self) -> float:
        """Idle for the slowest rank: in the control allreduce and in the model's own
        collectives."""
        return self.waited - self.computed + self.inner_wait

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
        self.inner_wait = 0.0  # host-timed (see `CollectiveWaits`)
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
            self._times = StepTimes(*times, samples=self.samples, inner_wait=self.inner_wait)
            self.marks, self.anchor = (), (None, 0.0)  # the events can go
        return self._times

    def __getattr__(self, name: str) -> Any:
        # start, computed, ..., compute, wait, comm: as StepTimes has them, once read.
        if name in _TIMES_FIELDS:
            return getattr(self.resolve(), name)
        raise AttributeError(name)


_TIMES_FIELDS = frozenset(
    {"start", "computed", "waited", "synced", "done", "compute", "wait", "comm", "inner_wait"}
)


def with_inner_wait(times: StepTimes | PendingTimes, seconds: float) -> StepTimes | PendingTimes:
    """`times` with `seconds` of the step's compute moved to its wait (`StepTimes`)."""
    if isinstance(times, PendingTimes):
        times.inner_wait = seconds
        return times
    return dataclasses.replace(times, inner_wait=seconds)


class CollectiveWaits:
    """Times the collectives inside a step (synchronised BatchNorm's, the wrapper's epoch
    check), as the wrapper's `before_collective` and `after_collective` hooks, on the host
    clock.

    Args:
        now: the clock, in seconds.
        synchronize: waits for the device before the collective is timed (a CUDA rank: its
            queued kernels are compute, not waiting). The layer reads the collective's
            result on the host before `after_collective`, so an NCCL allreduce, queued when
            it returns, has finished by then. One device sync a collective on a CUDA rank
            with synchronised BatchNorm, which the host read after it pays anyway, and one
            an epoch at the epoch check (an allgather of Python objects, read on the host).
    """

    def __init__(
        self, now: Callable[[], float], synchronize: Callable[[], None] | None = None
    ) -> None:
        self.now, self.synchronize = now, synchronize
        self.seconds = 0.0
        self._began: float | None = None
        self._split: Callable[[], None] | None = None
        self._resume: Callable[[], None] | None = None

    @contextmanager
    def attached(
        self,
        owner: Any,
        split: Callable[[], None] | None = None,
        resume: Callable[[], None] | None = None,
    ) -> Iterator[None]:
        """`owner`'s (the wrapper's) `before_collective` and `after_collective` hooks are
        these for the block, calling `split` (an emulated sleep, compute) before the timing
        starts and `resume` once it stops; None again after it."""
        self._split, self._resume = split, resume
        owner.before_collective, owner.after_collective = self._before, self._after
        try:
            yield
        finally:
            owner.before_collective = owner.after_collective = None

    def take(self) -> float:
        """The seconds timed since the last take."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def _before(self) -> None:
        if self._split is not None:
            self._split()
        if self.synchronize is not None:
            self.synchronize()
        self._began = self.now()

    def _after(self) -> None:
        if self._began is not None:
            self.seconds += self.now() - self._began
            self._began = None
        if self._resume is not None:
            self._resume()


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
