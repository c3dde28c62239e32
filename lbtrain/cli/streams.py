"""Standard output and warnings as the command line shows them: one line each, named.

A warning is one ``lbtrain: warning:`` line, not Python's source dump; a failed write to
standard output (a full disk) names standard output, so that its error can say so; and a
reader that left (`| head`) can be let go of without the interpreter's last flush failing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

__all__ = ["STDOUT", "named_stdout", "one_line_warnings", "silence_stdout"]

# The name a failed write to standard output carries, so that its message says so.
STDOUT = "<standard output>"


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Show warnings as one ``lbtrain: warning: message`` line, not Python's source dump."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = " ".join(str(message).split())
        print(f"lbtrain: warning: {text}", file=file or sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


class _StdoutNamer:
    """Standard output whose write failures (a full disk, /dev/full) name it; else as is."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise  # the reader left: handled quietly
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, STDOUT) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, STDOUT) from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def named_stdout() -> Iterator[None]:
    original = sys.stdout
    if isinstance(original, _StdoutNamer):  # ranks that are threads share one stdout
        yield
        return
    sys.stdout = _StdoutNamer(original)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = original


def silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
