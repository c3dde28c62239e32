"""Heterogeneity emulation: make a replica behave like a device f times slower.

A testing and benchmarking aid, not a performance feature. After each real compute step the
rank sleeps (f - 1) times that step's compute time, so one machine (or CI) reproduces a
heterogeneous cluster. Profiling and training apply it through the same `Slowdown` object,
so the profile predicts what training will see.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from lbtrain.text import plural

__all__ = [
    "Segments",
    "Slowdown",
    "factor_at",
    "parse_slowdown_changes",
    "parse_slowdowns",
    "precise_sleep",
    "rank_cpu_time",
    "slowdown_for_rank",
    "slowdown_schedule",
]

# time.sleep overshoots by about 0.1 ms on Linux (timer slack, wake-up latency); sleeping to
# this margin before the deadline and spinning the rest keeps an emulated 4x rank at 4x even
# for steps of a millisecond, while the spin costs a negligible share of a core.
SPIN_MARGIN = 2e-4


def precise_sleep(
    seconds: float,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Sleep `seconds`, to within a few microseconds unless the OS deschedules the process.

    Args:
        seconds: how long to sleep; nothing happens for seconds <= 0.
        clock: monotonic clock in seconds.
        sleep: the coarse sleep used until SPIN_MARGIN before the deadline.
    """
    if seconds <= 0:
        return
    deadline = clock() + seconds
    # A loop, not one call: a signal or an early wake-up must not shorten the sleep.
    while (remaining := deadline - clock()) > SPIN_MARGIN:
        sleep(remaining - SPIN_MARGIN)
    while clock() < deadline:
        pass


def rank_cpu_time() -> float:
    """CPU seconds this rank has computed: its thread's when torch runs on one thread, else
    the whole process's (torch's intra-op threads work for it too).

    The thread's clock leaves out whatever else the process runs: an MPI progress thread,
    or the other ranks when ranks are threads of one process (`lbtrain.comm.LocalWorld`),
    whose work would otherwise count as this rank's.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() == 1:
        return time.thread_time()
    return time.process_time()


@dataclass(frozen=True)
class Slowdown:
    """Stretch each compute step of this rank by a factor, by sleeping after it.

    Args:
        factor: how many times slower this rank should look (>= 1; 1 means no emulation).
        sleep: the sleep function (default `precise_sleep`); injectable so tests can use a
            fake clock.

    Example:
        >>> slow = Slowdown(3.0)
        >>> with slow.step():          # doctest: +SKIP
        ...     loss = train_step()    # sleeps 2x the step's time afterwards
    """

    factor: float = 1.0
    sleep: Callable[[float], None] = field(default=precise_sleep, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (
            isinstance(self.factor, bool)
            or not isinstance(self.factor, int | float)
            or not math.isfinite(self.factor)
        ):
            raise ValueError(f"slowdown factor {self.factor!r} is not a finite number")
        if self.factor < 1:
            raise ValueError(
                f"slowdown factor {self.factor} is below 1: emulation can only slow a rank "
                "down; use factors >= 1 such as 1,2,4"
            )

    @property
    def active(self) -> bool:
        """True when this rank is actually slowed down."""
        return self.factor != 1.0

    def extra_time(self, compute_seconds: float) -> float:
        """Seconds to sleep after a step whose real compute took `compute_seconds`."""
        return (self.factor - 1.0) * max(compute_seconds, 0.0)

    def after_step(self, compute_seconds: float) -> float:
        """Sleep (factor - 1) * compute_seconds; call right after a synchronised compute step.

        Args:
            compute_seconds: wall time of the real compute just finished.

        Returns:
            The seconds slept.
        """
        extra = self.extra_time(compute_seconds)
        if extra > 0:
            self.sleep(extra)
        return extra

    @contextmanager
    def step(
        self,
        timer: Callable[[], float] = time.perf_counter,
        synchronize: Callable[[], None] | None = None,
        cpu_timer: Callable[[], float] | None = rank_cpu_time,
    ) -> Iterator[Segments]:
        """Time the enclosed compute step and sleep afterwards by the emulated factor.

        The compute time is the step's wall time, less the time the OS kept this process off
        the CPU (wall minus CPU time, where positive). Without that correction, ranks that
        share cores would multiply every scheduling delay by their factor: a 4x rank
        descheduled for 3 ms would sleep 9 ms more, and profiles would be mostly noise.

        It yields a `Segments` whose `split()`, called before a collective inside the step
        (synchronised BatchNorm), sleeps for the compute since the last `resume()` (or the
        start), and whose `resume()`, called once the collective returns, starts timing
        again: a slow device is slow before each collective too, and the time spent waiting
        in one is not stretched.

        Args:
            timer: wall clock in seconds.
            synchronize: called before reading the clocks, e.g. to wait for CUDA kernels;
                without it a GPU step would look nearly free.
            cpu_timer: CPU seconds this rank has used (`rank_cpu_time`), or None to take
                the wall time as it is. Pass None on GPU ranks, whose host thread may block
                while the device computes, and with a fake `timer`.
        """
        segments = Segments(self, timer, synchronize, cpu_timer)
        yield segments
        segments.split()


class Segments:
    """The compute of one emulated step, stretched piece by piece (see `Slowdown.step`)."""

    def __init__(
        self,
        slowdown: Slowdown,
        timer: Callable[[], float],
        synchronize: Callable[[], None] | None,
        cpu_timer: Callable[[], float] | None,
    ) -> None:
        self._slowdown, self._timer = slowdown, timer
        self._synchronize, self._cpu_timer = synchronize, cpu_timer
        self._timing = False
        self.resume()

    def resume(self) -> None:
        """Start timing a piece of compute (at the start, and after each collective)."""
        if self._timing:
            return
        if self._synchronize is not None:
            self._synchronize()
        self._wall = self._timer()
        self._cpu = self._cpu_timer() if self._cpu_timer is not None else 0.0
        self._timing = True

    def split(self) -> None:
        """Sleep for the compute since `resume()`; time nothing until the next one (a caller
        that splits before a collective calls `resume()` once it returns).

        The wait in the collective that follows is not compute: timed, a rank that waits
        for a slower one would stretch that wait by its own factor (MPI's waiting ranks
        spin, so their CPU time counts it too), and the slower one would then wait for it.
        """
        if not self._timing:
            return
        if self._synchronize is not None:
            self._synchronize()
        wall = self._timer() - self._wall
        if self._cpu_timer is not None:
            # Multi-threaded steps use more CPU than wall time; then the wall time stands.
            wall = min(wall, self._cpu_timer() - self._cpu)
        self._timing = False
        self._slowdown.after_step(wall)


# The slowest device emulated: a rank 1000x slower is already one a plan would leave idle.
MAX_SLOWDOWN = 1000.0


def parse_slowdowns(text: str | Sequence[float] | None, world_size: int) -> tuple[float, ...]:
    """Parse `--emulate-slowdown` into one factor per rank.

    Args:
        text: "1,2,4" (one factor per rank), a single factor for every rank, a sequence of
            numbers, or None/"" for no emulation.
        world_size: number of ranks in the job.

    Returns:
        A tuple of world_size factors, each >= 1.
    """
    if text is None or (isinstance(text, str) and not text.strip()):
        return (1.0,) * world_size
    if isinstance(text, str):
        items = [item.strip() for item in text.split(",")]
        factors = []
        for item in items:
            try:
                factors.append(float(item))
            except ValueError:
                raise ValueError(
                    f"--emulate-slowdown {text!r}: {item!r} is not a number; give one factor "
                    "per rank, e.g. --emulate-slowdown 1,2,4"
                ) from None
    else:
        factors = [float(f) for f in text]
    if len(factors) == 1:
        factors = factors * world_size
    if len(factors) != world_size:
        raise ValueError(
            f"--emulate-slowdown has {len(factors)} factors but the job has "
            f"{plural(world_size, 'rank')}; give one factor per rank, comma-separated (or one "
            "for all ranks)"
        )
    for rank, factor in enumerate(factors):
        if not math.isfinite(factor) or factor <= 0:
            what = "not finite" if math.isinf(factor) else "not positive"
            raise ValueError(
                f"--emulate-slowdown factor {factor:g} for rank {rank} is {what}; "
                "factors are how many times slower a rank behaves, e.g. 1,2,4"
            )
        if factor < 1:
            raise ValueError(
                f"--emulate-slowdown factor {factor:g} for rank {rank} is below 1; emulation "
                "can only slow ranks down, so use factors >= 1 (1 = full speed)"
            )
        if factor > MAX_SLOWDOWN:
            raise ValueError(
                f"--emulate-slowdown factor {factor:g} for rank {rank} is above "
                f"{MAX_SLOWDOWN:g}: its rank would sleep {factor - 1:g} times each step's "
                f"compute (a 1 ms step for {factor / 1e3:g} s); use factors up to {MAX_SLOWDOWN:g}"
            )
    return tuple(factors)


def slowdown_for_rank(
    text: str | Sequence[float] | None,
    rank: int,
    world_size: int,
    sleep: Callable[[float], None] = precise_sleep,
) -> Slowdown:
    """The Slowdown of `rank` from an `--emulate-slowdown` value.

    Args:
        text: as for `parse_slowdowns`.
        rank: this rank, in [0, world_size).
        world_size: number of ranks.
        sleep: injectable sleep function.
    """
    if not 0 <= rank < world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]"
        )
    return Slowdown(parse_slowdowns(text, world_size)[rank], sleep=sleep)


def parse_slowdown_changes(
    text: str | None, world_size: int
) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """Parse a schedule of slowdown changes: "3:4,1" makes the factors 4,1 from epoch 3 on.

    Args:
        text: "EPOCH:F0,F1,..." entries separated by ";", epochs counted from 1 and
            increasing, each with one factor per rank (or one for all); None or "" for none.
        world_size: number of ranks in the job.

    Returns:
        ((epoch index from 0, factors), ...) in epoch order.
    """
    if text is None or not text.strip():
        return ()
    changes: list[tuple[int, tuple[float, ...]]] = []
    for entry in (part.strip() for part in text.split(";")):
        head, sep, factors = entry.partition(":")
        try:
            epoch = int(head)
        except ValueError:
            epoch = 0
        if not sep or epoch < 1:
            raise ValueError(
                f"emulate_change={text!r}: {entry!r} is not EPOCH:FACTORS with an epoch >= 1; "
                "write e.g. 3:4,1 (from epoch 3 on, rank 0 is 4x slow and rank 1 full speed)"
            )
        if changes and epoch - 1 <= changes[-1][0]:
            raise ValueError(
                f"emulate_change={text!r}: epochs must increase from one entry to the next"
            )
        try:
            parsed = parse_slowdowns(factors, world_size)
        except ValueError as exc:
            raise ValueError(f"emulate_change={text!r}: {exc}") from None
        changes.append((epoch - 1, parsed))
    return tuple(changes)


def factor_at(
    epoch: int, rank: int, base: float, changes: Sequence[tuple[int, Sequence[float]]]
) -> float:
    """This rank's slowdown factor during `epoch` (from 0): the last change at or before it."""
    factor = base
    for start, factors in changes:
        if start <= epoch:
            factor = float(factors[rank])
    return factor


def slowdown_schedule(
    changes: str | None,
    base: Slowdown,
    rank: int,
    world_size: int,
    epochs: int | None = None,
) -> Callable[[int], Slowdown]:
    """The Slowdown of each epoch (from 0): `base`, then the factors that `changes` sets.

    Args:
        changes: "EPOCH:F0,F1,..." entries (see `parse_slowdown_changes`), or None.
        base: the slowdown the run starts with (from `--emulate-slowdown`).
        rank: this rank.
        world_size: ranks in the job.
        epochs: the run's epochs, if known: a change after the last would never apply.

    Raises:
        ValueError: a bad entry, or one that starts after `epochs`.
    """
    parsed = parse_slowdown_changes(changes, world_size)
    late = [index + 1 for index, _ in parsed if epochs is not None and index + 1 > epochs]
    if late:
        raise ValueError(
            f"emulate_change={changes!r} changes the slowdown from epoch {late[0]}, after the "
            f"run's last (epochs={epochs}); train more epochs, or change it earlier"
        )

    def at(epoch: int) -> Slowdown:
        factor = factor_at(epoch, rank, base.factor, parsed)
        return base if factor == base.factor else Slowdown(factor, sleep=base.sleep)

    return at
