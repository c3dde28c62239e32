"""What rank 0 shows while training: a tqdm bar per epoch, or plain lines in a log file."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

__all__ = ["Progress", "item_bar"]


@contextmanager
def item_bar(
    enabled: bool, desc: str, stream: TextIO | None = None
) -> Iterator[Callable[[int, int], None] | None]:
    """A bar of this rank's items (evaluation, prediction) while the block runs, on a terminal.

    Yields what `evaluate` and `predict` take as `progress`, or None where no bar shows (not
    `enabled`, or the output is a file or pipe, where a bar would write a line per refresh).
    The bar goes when the block ends: the line after it says what came of the work.
    """
    stream = stream or sys.stdout
    if not (enabled and stream.isatty()):
        yield None
        return
    bar: tqdm | None = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=desc, unit="item", file=stream, leave=False,
                       dynamic_ncols=True)  # fmt: skip
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


class Progress:
    """Per-epoch progress on rank 0; silent on the other ranks and with `quiet`.

    On a terminal it is a tqdm bar per epoch with the running loss, samples/s and ETA; when
    the output is a file or a pipe (mpiexec output, CI logs) a bar would write one line per
    refresh, so it prints one plain line per epoch instead, plus one every `log_every`
    steps if asked.

    Args:
        enabled: show anything at all (rank 0 and not quiet).
        epochs: epochs of the run, for the "epoch 3/20" label.
        log_every: also report every this many steps (0: only at epoch ends).
        stream: where to write; default stderr for bars, stdout for lines.
    """

    def __init__(
        self, enabled: bool, epochs: int, log_every: int = 0, stream: TextIO | None = None
    ) -> None:
        self.enabled = enabled
        self.epochs = epochs
        self.log_every = log_every
        self.stream = stream or sys.stdout
        self.interactive = enabled and self.stream.isatty()
        self._bar: tqdm | None = None
        self._epoch = 0
        self._steps = 0

    def start_epoch(self, epoch: int, steps: int, done: int = 0) -> None:
        """Begin epoch `epoch` (0-based) of `steps` steps, `done` of them already taken."""
        self._epoch, self._steps = epoch, steps
        if self.interactive:
            self._bar = tqdm(
                total=steps,
                initial=done,
                desc=f"epoch {epoch + 1}/{self.epochs}",
                unit="step",
                file=self.stream,
                leave=True,
                dynamic_ncols=True,
            )

    def step(self, step: int, loss: float, samples_per_second: float) -> None:
        """After step `step` (0-based) of the epoch."""
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{samples_per_second:,.0f}")
        elif self.enabled and self.log_every and (step + 1) % self.log_every == 0:
            self.line(
                f"epoch {self._epoch + 1}/{self.epochs} step {step + 1}/{self._steps}  "
                f"loss {loss:.4f}  {samples_per_second:,.0f} samples/s"
            )

    def end_epoch(self, text: str) -> None:
        """Close the epoch's bar and print its summary line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.enabled:
            self.line(text)

    def line(self, text: str) -> None:
        """Print one line (above a bar, if one is running)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """Close a bar left open by an interrupted epoch."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
