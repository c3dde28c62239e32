"""SIGINT and SIGTERM for a whole run: requests while steps run, an immediate end elsewhere.

A scheduler's SIGTERM (or a Ctrl-C) can land at any moment: before the first step, between
two steps, during an evaluation or while a map is drawn. While training steps run, it is a
request that every rank reads in the next step's control allreduce, so all ranks stop after
the same step and save one checkpoint. Outside the steps there is no step to wait for: the
handler raises at once, and the CLI ends the job with 130 or 143 and one line.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["SIGNAL_EXIT", "Interrupted", "StopSignal", "held_signals"]

# Exit statuses of a run stopped by a signal, as shells report them (128 + signal number).
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
_SECOND_PRESS = (
    "lbtrain: stopping after this step, with a checkpoint; Ctrl-C again stops at once, "
    "without one\n"
)


class Interrupted(BaseException):  # noqa: N818 (like KeyboardInterrupt, not an error)
    """A signal outside the training steps; `code` is the exit status (130 or 143)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.code = SIGNAL_EXIT.get(signum, 128 + int(signum))
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


class StopSignal:
    """Catches SIGINT and SIGTERM for the length of a run (see the module docstring).

    A second Ctrl-C while a request waits interrupts at once, for a user who will not wait.
    With `announce` (rank 0's), the first one says so on stderr, since the step and the
    checkpoint it waits for may take a while and a second press loses that checkpoint.
    """

    def __init__(self, announce: bool = False) -> None:
        self.signals: list[int] = []
        self.deferred = False
        self.announce = announce
        self._announce_to: tuple[int, bool] | None = None  # stderr's descriptor, a terminal?

    def request(self, signum: int) -> None:
        """Ask for a stop as a signal would (tests, and ranks that are threads)."""
        self.signals.append(signum)

    @property
    def code(self) -> int:
        """The exit status asked for: 143 if any SIGTERM came, 130 for SIGINT, else 0."""
        if signal.SIGTERM in self.signals:
            return SIGNAL_EXIT[signal.SIGTERM]
        return SIGNAL_EXIT[signal.SIGINT] if self.signals else 0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and signal.SIGINT in self.signals:
            raise KeyboardInterrupt
        self.signals.append(signum)
        if not self.deferred:
            raise Interrupted(signum)
        if self._announce_to is not None and signum == signal.SIGINT:
            fd, terminal = self._announce_to
            # os.write: print() inside a handler can re-enter a write that it interrupted.
            # On a terminal a progress bar may hold the line: start a new one.
            # Only when the write cannot block (a paused `| less`): the step waits on it.
            with contextlib.suppress(OSError, ValueError):  # nor break the step
                if select.select([], [fd], [], 0)[1]:
                    os.write(fd, (("\n" if terminal else "") + _SECOND_PRESS).encode())

    @contextmanager
    def deferring(self) -> Iterator[StopSignal]:
        """While the block runs, a signal is a request read at the next step's control."""
        before, self.deferred = self.deferred, True
        try:
            yield self
        finally:
            self.deferred = before

    @contextmanager
    def installed(self) -> Iterator[StopSignal]:
        """Catch the signals while the block runs, then restore the previous handlers.

        Only a process's main thread receives signals (and may install handlers); a rank
        that is another thread (`lbtrain.comm.LocalWorld`) runs without, and stops when a
        rank that has them asks.
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._announce_to = _stderr() if self.announce else None
        previous = {s: signal.signal(s, self._handle) for s in SIGNAL_EXIT}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


@contextmanager
def held_signals() -> Iterator[None]:
    """SIGINT and SIGTERM that come during the block reach their handlers after it.

    For an import of third-party code: a handler's exception raised inside it may come out
    as another. Python 3.11 wraps one raised in a class body's `__set_name__` (torch._dynamo
    has such classes) in a RuntimeError: a Ctrl-C there ended a run with "Error calling
    __set_name__" and status 2, not one line and 130; and code that catches Exception around
    it would lose the signal. Only the main thread runs handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {
        s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in SIGNAL_EXIT
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in caught:
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def _stderr() -> tuple[int, bool] | None:
    """sys.stderr's descriptor and whether it is a terminal; None where there is none (a
    process started with stderr closed: descriptor 2 may then be any file it opened)."""
    stream = sys.stderr
    if stream is None:
        return None
    try:
        fd = stream.fileno()
        return fd, os.isatty(fd)
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor
        return None
