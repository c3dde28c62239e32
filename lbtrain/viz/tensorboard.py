"""The metrics records as TensorBoard scalars, one point per epoch.

Needs the ``tensorboard`` package (``pip install 'lbtrain[tensorboard]'``), which torch's
SummaryWriter writes event files for; torch itself is already an lbtrain dependency.
"""

from __future__ import annotations

import json
import math
import os
from types import TracebackType
from typing import Any

from lbtrain.viz._deps import summary_writer_class

__all__ = ["TensorBoardLogger", "scalars"]

# Record key -> tag; times stay in seconds and shares in fractions, as in metrics.jsonl.
_EPOCH_SCALARS = {
    "loss": "train/loss",
    "accuracy": "train/accuracy",
    "lr": "train/lr",
    "step_seconds": "time/step_seconds",
    "predicted_step_seconds": "time/predicted_step_seconds",
    "idle_fraction": "time/idle_fraction",
}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The (tag, value) pairs :class:`TensorBoardLogger` logs for a record; nulls skipped."""
    out: dict[str, float] = {}
    if record.get("type") == "epoch":
        for key, tag in _EPOCH_SCALARS.items():
            if _number(record.get(key)):
                out[tag] = float(record[key])
        for rank, size in enumerate(record.get("batch_sizes") or []):
            if _number(size):
                out[f"batch_size/rank{rank}"] = float(size)
        for entry in record.get("ranks") or []:
            wait, seconds = entry.get("wait"), entry.get("seconds")
            if _number(wait) and _number(seconds) and seconds > 0:
                out[f"wait_fraction/rank{entry.get('rank')}"] = wait / seconds
    elif record.get("type") == "eval":
        for name, value in (record.get("metrics") or {}).items():
            if _number(value):
                out[f"eval/{name}"] = float(value)
    return out


class TensorBoardLogger:
    """Log epoch and eval records (as written to metrics.jsonl) to a TensorBoard folder.

    The global step is the record's epoch. A start record is logged as text (the run's
    settings); stop and end records are not logged.

    Raises:
        RuntimeError: tensorboard cannot be imported; the message names the extra to install.
    """

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self.logdir = os.fspath(logdir)
        self._writer = summary_writer_class()(log_dir=self.logdir)

    def log(self, record: dict[str, Any]) -> None:
        """Log one metrics record."""
        if record.get("type") == "start":
            settings = {k: v for k, v in record.items() if k != "type"}
            self._writer.add_text("run/start", json.dumps(settings), global_step=0)
            return
        epoch = record.get("epoch")
        if not isinstance(epoch, int):
            return
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=epoch)
        self._writer.flush()  # once a record: a TensorBoard watching the run sees each epoch

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
