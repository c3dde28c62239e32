"""Pictures and logs of a training run, as pure pieces the trainer and scripts call.

Nothing here talks to other ranks: the trainer gathers what each rank recorded and hands it
in. matplotlib (``lbtrain[plot]``) and tensorboard (``lbtrain[tensorboard]``) are imported
only when a picture is drawn or a logger made.

- :mod:`~lbtrain.viz.records`: metrics.jsonl, written per epoch and read back.
- :mod:`~lbtrain.viz.curves`: loss, accuracy, step time and idle time per epoch.
- :mod:`~lbtrain.viz.trace`: per-step phases of every rank as a Perfetto trace.
- :mod:`~lbtrain.viz.timeline`: such a trace as a picture; two runs one above the other.
- :mod:`~lbtrain.viz.tensorboard`: the same records as TensorBoard scalars.
"""

from __future__ import annotations

from lbtrain.viz.curves import draw_curves, eval_series, plot_curves
from lbtrain.viz.records import (
    MetricsStream,
    epoch_records,
    eval_records,
    read_metrics,
    replan_epochs,
    resume_epochs,
    truncate_after,
)
from lbtrain.viz.tensorboard import TensorBoardLogger
from lbtrain.viz.timeline import compare_timelines, render_timeline, step_window
from lbtrain.viz.trace import StepTrace, check_trace, chrome_trace, load_trace, write_trace

__all__ = [
    "MetricsStream",
    "StepTrace",
    "TensorBoardLogger",
    "check_trace",
    "chrome_trace",
    "compare_timelines",
    "draw_curves",
    "epoch_records",
    "eval_records",
    "eval_series",
    "load_trace",
    "plot_curves",
    "read_metrics",
    "render_timeline",
    "replan_epochs",
    "resume_epochs",
    "step_window",
    "truncate_after",
    "write_trace",
]
