"""Per-step phase timings as a Chrome/Perfetto trace (the JSON Trace Event Format).

Each rank records its steps with a :class:`StepTrace`; the trainer gathers every rank's
:meth:`StepTrace.spans` and writes them with :func:`write_trace`. The file opens in
ui.perfetto.dev or chrome://tracing: one track per rank, one slice per phase:

- ``compute``: forward and backward on this rank's batch;
- ``wait``: idle until the slowest rank's gradients are ready;
- ``sync``: gradient communication not hidden behind the backward pass;
- ``optimizer``: the optimizer step.

All ranks are threads (tid = rank) of one process (pid 0, "lbtrain"), not one process each:
Perfetto then shows them as adjacent rows of one group, open at once and sorted by rank,
which is the view that shows fast ranks waiting for slow ones. Moments of the whole job
(a session that continued on another world) are global instant events: a line across
every track at that time.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lbtrain.outputs import atomic_write_text

__all__ = [
    "PHASES",
    "Span",
    "StepTrace",
    "check_trace",
    "chrome_trace",
    "load_trace",
    "write_trace",
]

PHASES = ("compute", "wait", "sync", "optimizer")

# One phase of one step: (epoch, step, phase name, start s, end s), times relative to the
# trainer's common t0. Plain tuples: small to pickle when the trainer gathers them.
Span = tuple[int, int, str, float, float]
# A moment of the whole job: seconds from the trace's start, its name, what it says.
Mark = tuple[float, str, Mapping[str, Any]]

_PID = 0
# Spans that touch may overlap by a rounding error once written in microseconds.
_OVERLAP_TOLERANCE_US = 1e-3


class StepTrace:
    """Record one rank's step phases, in bounded memory.

    Without `every_epoch`, the first `max_steps` steps are recorded and later ones dropped.
    With `every_epoch` = k > 0, the first `max_steps // 2` steps are recorded, then the first
    `sample_steps` steps of every k-th epoch (epochs k, 2k, ...) after that window, until
    `max_steps` steps in all: a long run keeps its start and samples of its later course.

    Args:
        max_steps: the most steps ever recorded.
        every_epoch: sample every k-th epoch after the window (0: no samples).
        sample_steps: steps recorded from each sampled epoch.
    """

    def __init__(self, max_steps: int = 400, every_epoch: int = 0, sample_steps: int = 5) -> None:
        if max_steps < 0 or every_epoch < 0 or sample_steps < 0:
            raise ValueError("max_steps, every_epoch and sample_steps must be >= 0")
        self.max_steps = max_steps
        self.every_epoch = every_epoch
        self.sample_steps = sample_steps
        self._window = max_steps // 2 if every_epoch else max_steps
        self._spans: list[Span] = []
        self._steps = 0
        self._sampled: dict[int, int] = {}  # epoch -> steps recorded in it after the window

    @property
    def steps(self) -> int:
        """How many steps are recorded."""
        return self._steps

    def wants(self, epoch: int) -> bool:
        """Whether the next step of `epoch` would be recorded (lets a caller skip timing it)."""
        if self._steps >= self.max_steps:
            return False
        if self._steps < self._window:
            return True
        return (
            self.every_epoch > 0
            and epoch % self.every_epoch == 0
            and self._sampled.get(epoch, 0) < self.sample_steps
        )

    def room(self, epoch: int) -> int:
        """How many more steps of `epoch`, added one after another, would be recorded."""
        left = self.max_steps - self._steps
        window = max(self._window - self._steps, 0)
        sampled = self.every_epoch > 0 and epoch % self.every_epoch == 0
        samples = self.sample_steps - self._sampled.get(epoch, 0) if sampled else 0
        return max(min(left, window + max(samples, 0)), 0)

    def add(self, epoch: int, step: int, phases: Iterable[tuple[str, float, float]]) -> bool:
        """Record one step's phases as (name, start s, end s); return whether it was kept.

        Raises:
            ValueError: a phase ends before it starts, or a time is not finite.
        """
        if not self.wants(epoch):
            return False
        spans = []
        for name, start, end in phases:
            start, end = float(start), float(end)
            if not (math.isfinite(start) and math.isfinite(end)) or end < start:
                raise ValueError(f"epoch {epoch} step {step}: bad phase {name!r} {start}..{end}")
            spans.append((int(epoch), int(step), str(name), start, end))
        if self._steps >= self._window:
            self._sampled[epoch] = self._sampled.get(epoch, 0) + 1
        self._spans.extend(spans)
        self._steps += 1
        return True

    def spans(self) -> list[Span]:
        """The recorded spans, as small picklable tuples (epoch, step, name, start, end)."""
        return list(self._spans)


def chrome_trace(
    per_rank_spans: Sequence[Sequence[Span]],
    labels: Sequence[str],
    marks: Sequence[Mark] = (),
) -> dict:
    """Build the trace: one named, sorted track per rank and one complete event per span.

    Args:
        per_rank_spans: each rank's :meth:`StepTrace.spans`, in rank order.
        labels: what each rank is, shown after its number, e.g. "cpu x1, batch 40"
            (track "rank 0 (cpu x1, batch 40)"); an empty label shows "rank 0".
        marks: moments of the whole job, (seconds, name, args): a line across every track
            (a global instant event), e.g. where the run continued on another world.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms"}``, times in microseconds.
    """
    if len(labels) != len(per_rank_spans):
        raise ValueError(f"{len(per_rank_spans)} ranks' spans but {len(labels)} labels")
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": _PID, "args": {"name": "lbtrain"}}
    ]
    for rank, (spans, label) in enumerate(zip(per_rank_spans, labels, strict=True)):
        name = f"rank {rank} ({label})" if label else f"rank {rank}"
        events.append(
            {"ph": "M", "name": "thread_name", "pid": _PID, "tid": rank, "args": {"name": name}}
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": _PID,
                "tid": rank,
                "args": {"sort_index": rank},
            }
        )
        for epoch, step, phase, start, end in sorted(spans, key=lambda span: span[3]):
            # Whole nanoseconds first, so a span's end and the next one's start agree exactly.
            start_ns, end_ns = round(start * 1e9), round(end * 1e9)
            events.append(
                {
                    "ph": "X",
                    "name": phase,
                    "cat": "step",
                    "ts": start_ns / 1e3,
                    "dur": (end_ns - start_ns) / 1e3,
                    "pid": _PID,
                    "tid": rank,
                    "args": {"epoch": epoch, "step": step},
                }
            )
    for seconds, name, args in marks:
        events.append(
            {"ph": "i", "s": "g", "name": name, "cat": "run", "ts": round(seconds * 1e9) / 1e3,
             "pid": _PID, "tid": 0, "args": dict(args)}
        )  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(
    path: str | os.PathLike[str],
    per_rank_spans: Sequence[Sequence[Span]],
    labels: Sequence[str],
    marks: Sequence[Mark] = (),
) -> Path:
    """Write :func:`chrome_trace` to `path` as JSON, atomically; return the path."""
    trace = chrome_trace(per_rank_spans, labels, marks)
    return atomic_write_text(path, json.dumps(trace, separators=(",", ":")) + "\n")


def load_trace(trace: dict | str | os.PathLike[str]) -> dict:
    """A trace dict as given, or read from a JSON file."""
    if isinstance(trace, dict):
        return trace
    return json.loads(Path(trace).read_text(encoding="utf-8"))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_trace(trace: dict) -> None:
    """Check what Perfetto's JSON importer needs, and that each track's slices do not overlap.

    Every event has a string ``ph``; metadata (``M``) events a name and args; instant
    (``i``) events a name and a finite ``ts``; complete (``X``) events a name, integer pid
    and tid, finite ``ts`` and ``dur >= 0`` in microseconds, in time order per (pid, tid)
    track and not overlapping (beyond 1 ns).

    Raises:
        ValueError: naming the first offending event and its index.
    """
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("a trace is a dict with a 'traceEvents' list")
    ends: dict[tuple[int, int], float] = {}
    for index, event in enumerate(trace["traceEvents"]):

        def bad(problem: str, index: int = index, event: Any = event) -> ValueError:
            return ValueError(f"trace event {index}: {problem}: {event!r}")

        if not isinstance(event, dict):
            raise bad("not an object")
        if not isinstance(event.get("ph"), str):
            raise bad("no string 'ph'")
        if event["ph"] == "M":
            if not isinstance(event.get("name"), str) or not isinstance(event.get("args"), dict):
                raise bad("a metadata event needs a string 'name' and an 'args' object")
            continue
        if event["ph"] == "i":  # a mark: a name and a finite time are what it needs
            if not isinstance(event.get("name"), str) or not _number(event.get("ts")):
                raise bad("an instant event needs a string 'name' and a finite 'ts'")
            continue
        if event["ph"] != "X":
            continue
        if not isinstance(event.get("name"), str):
            raise bad("no string 'name'")
        for key in ("pid", "tid"):
            if not isinstance(event.get(key), int) or isinstance(event.get(key), bool):
                raise bad(f"no integer {key!r}")
        if not _number(event.get("ts")):
            raise bad("'ts' is not a finite number")
        if not _number(event.get("dur")) or event["dur"] < 0:
            raise bad("'dur' is not a finite number >= 0")
        track = (event["pid"], event["tid"])
        if track in ends and event["ts"] < ends[track] - _OVERLAP_TOLERANCE_US:
            raise bad(f"starts before the previous slice on its track ends ({ends[track]} us)")
        ends[track] = event["ts"] + event["dur"]
