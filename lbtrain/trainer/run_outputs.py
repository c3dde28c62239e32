"""What a run writes into its folder, on rank 0: opened once the engine stands, streamed
while it trains, completed when it ends.

:func:`open_run` starts the folder (created, cleared when overwriting, locked), writes
config.toml, plan.json and profiles.json, and opens metrics.jsonl: one JSON line per epoch,
evaluation and stop, flushed as it happens, so a crash at epoch 59 keeps 58 lines. A resumed
run continues the same file: lines after the checkpoint's position (epochs the crashed run
ran past its last checkpoint) are dropped first, so every epoch appears once.
:func:`write_outputs` writes the rest at the end, summary.json last.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lbtrain.balancer import BalancePlan
from lbtrain.outputs import atomic_write_text
from lbtrain.profiling.record import profiles_to_dict
from lbtrain.text import plural
from lbtrain.trainer.config import save_toml
from lbtrain.trainer.initial_plan import plan_record
from lbtrain.trainer.resume import set_aside_damaged
from lbtrain.trainer.run_folder import release_run_folder, start_run_folder
from lbtrain.trainer.summary import device_label
from lbtrain.viz.records import MetricsStream, truncate_after
from lbtrain.workloads import ArtifactContext

if TYPE_CHECKING:  # setup imports nothing from here; the type is for hints only
    from lbtrain.trainer.setup import Setup

__all__ = [
    "CURVES_FILE",
    "METRICS_FILE",
    "RunOutputs",
    "draw_curves",
    "end_record",
    "open_run",
    "write_outputs",
]

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"


@dataclass
class RunOutputs:
    """Rank 0's hold on its run folder and its metrics stream; the other ranks hold one with
    neither, which writes nothing."""

    lock: IO[str] | None = None
    stream: MetricsStream | None = None

    def write(self, entry: dict[str, Any]) -> None:
        """Add one line to metrics.jsonl (rank 0 only)."""
        if self.stream is not None:
            self.stream.write(entry)

    def close(self) -> None:
        """Close the stream and let go of the folder."""
        if self.stream is not None:
            self.stream.close()
        release_run_folder(self.lock)


@contextmanager
def open_run(setup: Setup, outputs: RunOutputs) -> Iterator[RunOutputs]:
    """Start the run folder and open `outputs`' metrics stream on rank 0 (its first line
    says where the run starts); on the other ranks `outputs` stays one that writes nothing.
    Collective. Opened once the engine stands, so a run that fails while it is built (a
    checkpoint that does not load) leaves the folder as it was."""
    setup.on_root(lambda: _start(setup, outputs))
    try:
        yield outputs
    finally:
        outputs.close()


def _start(setup: Setup, outputs: RunOutputs) -> None:
    out, plan, config, checkpoint = setup.out, setup.plan, setup.config, setup.checkpoint
    lock = start_run_folder(out, setup.given, setup.clear, setup.workload.outputs)
    set_aside_damaged(checkpoint)
    # With a plan file, its policy and smallest batch are what apply: the recipe says so.
    if config.plan:
        config = replace(config, policy=plan.policy, min_batch=plan.min_batch)
    save_toml(out / "config.toml", config)
    atomic_write_text(out / "plan.json", plan_record(plan, setup.workload))
    if setup.profiles is not None:
        text = json.dumps(profiles_to_dict(setup.profiles), indent=2) + "\n"
        atomic_write_text(out / "profiles.json", text)
    epoch, step = (0, 0) if checkpoint is None else (checkpoint["epoch"], checkpoint["step"])
    if checkpoint is not None:
        truncate_after(out / METRICS_FILE, epoch)  # epochs a crashed run ran past its checkpoint
        # A finished run resumed for more epochs is unfinished until it ends again: its old
        # summary.json (written last, so a stop leaves none) must not say otherwise.
        (out / "summary.json").unlink(missing_ok=True)
    outputs.lock, outputs.stream = lock, MetricsStream(out / METRICS_FILE, append=True)
    outputs.write(
        {
            "type": "start",
            "time": time.time(),
            "world_size": setup.comm.size,
            "policy": plan.policy,
            "global_batch": plan.global_batch_size,
            "epochs": config.epochs,
            "batch_sizes": list(plan.batch_sizes),
            "devices": [device_label(d) for d in setup.devices],
            # Where, and from how many ranks (a resume into a new folder has no earlier
            # start record to say).
            "resumed_at": {
                "epoch": epoch,
                "step": step,
                "world_size": len(checkpoint.get("ranks") or []) or None,
            }
            if checkpoint is not None
            else None,
        }
    )
    changed = world_change(setup)
    if changed is not None:
        outputs.write({"type": "world", "time": time.time(), **changed})


def world_change(setup: Setup) -> dict[str, Any] | None:
    """How this session's world differs from the checkpoint's it continues, or None: the
    ranks before and now, the global step it continues from, the batches before and now."""
    checkpoint = setup.checkpoint
    if checkpoint is None:
        return None
    before, now = len(checkpoint.get("ranks") or []), setup.comm.size
    if before in (0, now):
        return None  # the same world (a change, if any, was an earlier session's)
    return {
        "from": before,
        "to": now,
        "global_step": int(checkpoint["global_step"]),
        "old_batch_sizes": list(checkpoint["plan"]["batch_sizes"]),
        "batch_sizes": list(setup.plan.batch_sizes),
    }


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


def write_outputs(
    setup: Setup,
    plan: BalancePlan,
    metrics: dict[str, Any],
    summary: dict[str, Any],
    predictions: Any,
) -> None:
    """On rank 0, after the last epoch: the plan in force, the final metrics, the curves, the
    workload's own files, and summary.json last (a run without it did not finish)."""
    out, workload = setup.out, setup.workload
    atomic_write_text(out / "plan.json", plan_record(plan, workload))  # the plan in force now
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    title = f"{workload.name}, {plural(setup.comm.size, 'rank')}, policy {plan.policy}"
    if setup.config.curves:
        draw_curves(out, title)
    if workload.artifacts is not None:
        workload.artifacts(ArtifactContext(out, metrics, predictions, title))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
