"""A run's metrics.jsonl: one JSON object a line, appended and flushed by the trainer per epoch.

Record types (the ``type`` key); times are Unix seconds, epochs are 1-based:

- ``start``: ``time, world_size, policy, global_batch, epochs, batch_sizes, devices,
  resumed_at`` (null, or ``{"epoch": E, "step": S, "world_size": N}`` for a resumed run:
  epochs done, steps of the next, and the checkpoint's ranks; a resumed run's file holds
  one start record per attempt).
- ``epoch``: ``epoch, time, steps, samples, loss, accuracy`` (null for a workload without
  one), ``lr, seconds, step_seconds, predicted_step_seconds, idle_fraction, batch_sizes,
  ranks`` (a list of ``{rank, samples, compute, wait, comm, seconds, busy_steps}``) and
  ``replan`` (null, or ``{old_batch_sizes, new_batch_sizes, old_step_seconds,
  new_step_seconds, reason}``: the plan switched after this epoch, so the new sizes apply
  from the next one).
- ``eval``: ``epoch, time, metrics`` (any names; values in [0, 1] are fractions).
- ``stop``: ``epoch, step, reason, code``; ``end``: ``time, wall_seconds``.

A number that is not finite (a diverged loss) is written as null, so every line stays JSON.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from lbtrain.outputs import atomic_write_text

__all__ = [
    "MetricsStream",
    "epoch_records",
    "eval_records",
    "read_metrics",
    "replan_epochs",
    "resume_epochs",
    "truncate_after",
    "world_changes",
]


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None and numpy/torch scalars unwrapped."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    item = getattr(value, "item", None)
    if callable(item):  # a numpy or torch scalar: json knows neither
        return _finite(item())
    return value  # json.dumps names the type it cannot write


def _dumps(record: Mapping[str, Any]) -> str:
    if not isinstance(record.get("type"), str):
        raise ValueError(f"a metrics record needs a string 'type', got {dict(record)!r}")
    return json.dumps(_finite(record), allow_nan=False)


class MetricsStream:
    """Write metrics records to a JSON-lines file, one line per record, flushed at once.

    Each line goes out in a single write and is flushed, so a crashed process leaves every
    finished record on disk and at most a torn last line, which :func:`read_metrics` skips.
    There is no fsync per record: a flushed line already survives the process dying, and
    fsync costs milliseconds (far more on network file systems) per call; only a crash of
    the whole machine can lose the last lines. :meth:`close` fsyncs once.

    Args:
        path: the file (its folder must exist).
        append: add to an existing file (a resumed run, after :func:`truncate_after`);
            otherwise the file is started anew.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = False) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = self.path.open("a" if append else "w", encoding="utf-8")
        if append and self._file.tell() > 0 and not _ends_in_newline(self.path):
            # A torn or unterminated last line must not swallow the first appended record.
            self._file.write("\n")

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (a dict with a string ``type``) as one line and flush it."""
        if self._file is None:
            raise ValueError(f"{self.path}: the metrics stream is closed")
        self._file.write(_dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Flush, fsync and close the file; closing twice is harmless."""
        if self._file is None:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsStream:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _ends_in_newline(path: Path) -> bool:
    with path.open("rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1) == b"\n"


def _parse(path: Path, text: str) -> list[dict[str, Any]]:
    lines = text.split("\n")
    # Every record ends in a newline; whatever follows the last one was being written.
    last = len(lines) - 1
    records: list[dict[str, Any]] = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            problem = None
        except json.JSONDecodeError as exc:
            problem = f"not a JSON line ({exc.msg})"
        if problem is None and not (
            isinstance(record, dict) and isinstance(record.get("type"), str)
        ):
            problem = "not a metrics record (a JSON object with a string 'type')"
        elif problem is None and record["type"] in ("epoch", "eval"):
            epoch = record.get("epoch")
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                # Readers sort and match records by it.
                problem = f"an {record['type']} record whose epoch is {epoch!r:.40}, not a count"
        if problem is not None:
            if index == last:
                break  # a torn last line: the process died while writing it
            raise ValueError(f"{path}:{index + 1}: {problem}")
        records.append(record)
    return records


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read every record of a metrics.jsonl file, in the order written.

    A torn last line (a run that died while writing it) is skipped; a bad line anywhere
    else raises.

    Raises:
        ValueError: a line other than the last is not a JSON object with a string ``type``;
            the message names the file and the 1-based line number.
    """
    path = Path(path)
    return _parse(path, path.read_text(encoding="utf-8"))


def truncate_after(path: str | os.PathLike[str], epoch: int) -> list[dict[str, Any]]:
    """Cut a metrics file back to a resume point: what was written after `epoch` goes.

    The file is chronological, so it is cut just before the first ``epoch`` or ``eval``
    record of a later epoch: everything before stays (the start records, an earlier
    attempt's stop record), everything from there on goes (later epochs, their evals, the
    stop or end record of the attempt being replaced). A torn last line goes too. The file
    is rewritten atomically; a missing file is left missing.

    Args:
        path: the metrics.jsonl of the run being resumed.
        epoch: the last epoch the checkpoint completed (0 keeps only what precedes epoch 1).

    Returns:
        The records kept.
    """
    path = Path(path)
    if not path.exists():
        return []
    records = read_metrics(path)
    kept: list[dict[str, Any]] = []
    for record in records:
        at = record.get("epoch")
        if record["type"] in ("epoch", "eval") and isinstance(at, int) and at > epoch:
            break
        kept.append(record)
    atomic_write_text(path, "".join(_dumps(record) + "\n" for record in kept))
    return kept


def epoch_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``epoch`` records by epoch; where an epoch appears twice (a resume), the later wins."""
    latest = {r["epoch"]: r for r in records if r["type"] == "epoch" and "epoch" in r}
    return [latest[e] for e in sorted(latest)]


def eval_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``eval`` records by epoch; where an epoch appears twice (a resume), the later wins."""
    latest = {r["epoch"]: r for r in records if r["type"] == "eval" and "epoch" in r}
    return [latest[e] for e in sorted(latest)]


def replan_epochs(records: list[dict[str, Any]]) -> list[tuple[int, list[int]]]:
    """Each re-plan as (epoch after which it took effect, the new batch sizes)."""
    return [
        (r["epoch"], list(r["replan"].get("new_batch_sizes") or []))
        for r in epoch_records(records)
        if r.get("replan")
    ]


def world_changes(records: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(epoch it continued after, ranks before, ranks now) of each resume on another world,
    from its ``world`` record and the start record before it."""
    changes, epoch = [], None
    for r in records:
        if r["type"] == "start":
            at = r.get("resumed_at")
            epoch = int(at.get("epoch", 0)) if isinstance(at, dict) else None
        elif r["type"] == "world" and epoch is not None:
            changes.append((epoch, int(r.get("from", 0)), int(r.get("to", 0))))
    return changes


def resume_epochs(records: list[dict[str, Any]]) -> list[int]:
    """The epoch each resumed attempt started after (from its start record's ``resumed_at``)."""
    return [
        int(r["resumed_at"].get("epoch", 0))
        for r in records
        if r["type"] == "start" and isinstance(r.get("resumed_at"), dict)
    ]
