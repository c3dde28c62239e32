"""metrics.jsonl: one JSON line per epoch, evaluation and stop, flushed as it happens.

A crash at epoch 59 keeps 58 lines. A resumed run continues the same file: lines after the
checkpoint's position (epochs the crashed run ran past its last checkpoint) are dropped
first, so every epoch appears once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lbtrain.trainer.callbacks import MetricsCallback
from lbtrain.trainer.engine import Engine
from lbtrain.trainer.run_folder import release_run_folder
from lbtrain.trainer.summary import device_label
from lbtrain.viz.records import MetricsStream, truncate_after

if TYPE_CHECKING:  # setup imports nothing from here; the type is for hints only
    from lbtrain.trainer.setup import Setup

__all__ = ["CURVES_FILE", "METRICS_FILE", "draw_curves", "end_record", "open_metrics"]

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"


def end_record(wall_seconds: float) -> dict[str, Any]:
    """The run's last line."""
    return {"type": "end", "time": time.time(), "wall_seconds": wall_seconds}


def draw_curves(out: Path, title: str) -> list[Path]:
    """curves.png from the run's metrics.jsonl; none (and one line why) without matplotlib."""
    from lbtrain.viz.curves import plot_curves
    from lbtrain.viz.records import read_metrics

    try:
        return [plot_curves(read_metrics(out / METRICS_FILE), out / CURVES_FILE, title)]
    except RuntimeError as exc:  # matplotlib missing: the run itself is fine
        print(f"lbtrain: {CURVES_FILE} not drawn: {exc}", flush=True)
        return []


class _Silent:
    """What ranks other than 0 hold: they write nothing."""

    def write(self, entry: dict[str, Any]) -> None:
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
            truncate_after(path, state.epoch)  # epochs a crashed run ran past its checkpoint
            # A finished run resumed for more epochs is unfinished until it ends again: its
            # old summary.json (written last, so a stop leaves none) must not say otherwise.
            (setup.out / "summary.json").unlink(missing_ok=True)
        stream = MetricsStream(path, append=True)
        stream.write(
            {
                "type": "start",
                "time": time.time(),
                "world_size": setup.comm.size,
                "policy": setup.plan.policy,
                "global_batch": setup.plan.global_batch_size,
                "epochs": state.epochs,
                "batch_sizes": list(engine.loader.plan.batch_sizes),
                "devices": [device_label(d) for d in setup.devices],
                # Where, and from how many ranks (a resume into a new folder has no
                # earlier start record to say).
                "resumed_at": {
                    "epoch": state.epoch,
                    "step": state.step,
                    "world_size": len(setup.checkpoint.get("ranks") or []) or None,
                }
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
        engine.close()
        release_run_folder(setup.lock)
