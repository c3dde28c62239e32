"""Pictures and logs of a training run, as pure pieces the trainer and scripts call.

Nothing here talks to other ranks: the trainer gathers what each rank recorded and hands it
in. matplotlib (``lbtrain[plot]``) and tensorboard (``lbtrain[tensorboard]``) are imported
only when a picture is drawn or a logger made.

- :mod:`~lbtrain.viz.records`: metrics.jsonl, written per epoch and read back.
"""

from __future__ import annotations

from lbtrain.viz.records import (
    MetricsStream,
    epoch_records,
    eval_records,
    read_metrics,
    replan_epochs,
    resume_epochs,
    truncate_after,
)

__all__ = [
    "MetricsStream",
    "epoch_records",
    "eval_records",
    "read_metrics",
    "replan_epochs",
    "resume_epochs",
    "truncate_after",
]
