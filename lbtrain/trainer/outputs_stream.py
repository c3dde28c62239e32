"""metrics.jsonl: one JSON line per epoch, evaluation and stop, flushed as it happens.

A crash at epoch 59 keeps 58 lines. A resumed run continues the same file: lines after the
checkpoint's position (epochs the crashed run ran past its last checkpoint) are dropped
first, so every epoch appears once.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lbtrain.outputs import atomic_write_text
from lbtrain.trainer.callbacks import MetricsCallback
from lbtrain.trainer.engine import Engine

if TYPE_CHECKING:  # setup imports nothing from here; the type is for hints only
    from lbtrain.trainer.setup import Setup

__all__ = ["METRICS_FILE", "MetricsStream", "clean", "keep_until", "open_metrics"]

METRICS_FILE = "metrics.jsonl"


def clean(value: Any) -> Any:
    """`value` with NaN and infinities as None: a diverged loss still makes valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


class MetricsStream:
    """Appends entries to a metrics.jsonl, one line each, flushed (not fsynced: a crash of
    the process keeps what was flushed; only a crash of the machine may lose the last)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = path.open("a", encoding="utf-8")

    def write(self, entry: dict[str, Any]) -> None:
        """One line, flushed."""
        if self._file is not None:
            self._file.write(json.dumps(clean(entry), allow_nan=False) + "\n")
            self._file.flush()

    def end(self, wall_seconds: float) -> None:
        """The run's last line."""
        self.write({"type": "end", "time": time.time(), "wall_seconds": wall_seconds})

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def keep_until(path: Path, epoch: int) -> None:
    """Drop the lines of `path` past `epoch` (1-based; start lines stay); a torn last line
    goes too."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a crash
        if entry.get("type") in ("start", "end") or int(entry.get("epoch", 0)) <= epoch:
            if entry.get("type") not in ("end", "stop") or int(entry.get("epoch", 0)) <= epoch:
                kept.append(line)
    atomic_write_text(path, "".join(k + "\n" for k in kept))


class _Silent:
    """What ranks other than 0 hold: they write nothing."""

    def end(self, wall_seconds: float) -> None:
        """Only rank 0 writes."""

    def close(self) -> None:
        """Nothing to close."""


@contextmanager
def open_metrics(setup: Setup, engine: Engine) -> Iterator[MetricsStream | _Silent]:
    """The run folder started and rank 0's stream opened (its first line says where the run
    starts); the other ranks get a stand-in. Collective."""
    path = setup.out / METRICS_FILE
    state = engine.state

    def start() -> MetricsStream:
        setup.start_outputs()
        if setup.checkpoint is not None:
            keep_until(path, state.epoch)
        stream = MetricsStream(path)
        stream.write(
            {
                "type": "start",
                "time": time.time(),
                "world_size": setup.comm.size,
                "policy": setup.plan.policy,
                "global_batch": setup.plan.global_batch_size,
                "epochs": state.epochs,
                "batch_sizes": list(engine.loader.plan.batch_sizes),
                "devices": [_device(d) for d in setup.devices],
                "resumed_at": {"epoch": state.epoch, "step": state.step}
                if setup.checkpoint is not None
                else None,
            }
        )
        return stream

    stream = setup.on_root(start) or _Silent()
    writer = engine.callback(MetricsCallback)
    if isinstance(writer, MetricsCallback) and isinstance(stream, MetricsStream):
        writer.write = stream.write
    try:
        yield stream
    finally:
        stream.close()


def _device(entry: dict[str, Any]) -> str:
    slowdown = entry.get("slowdown", 1)
    return str(entry.get("device")) + (f" x{slowdown:g}" if slowdown != 1 else "")
