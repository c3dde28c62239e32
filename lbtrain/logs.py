"""Rank-aware logging for library messages: rank 0 speaks, every rank with debug.

The `lbtrain` logger carries the library's diagnostic lines (the re-planner's reasoning,
the plan's notes); what a run reports to its user is printed by the CLI. `configure` is
idempotent and process-wide; the rank of each record is the calling rank's, read at the
time of the call, so ranks that are threads of one process (`lbtrain.comm.LocalWorld`) tag
their own lines.
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["LEVELS", "configure", "logger", "set_rank"]

LEVELS = ("debug", "info", "warning")
logger = logging.getLogger("lbtrain")

_RANK = threading.local()
_PROCESS_RANK = {"rank": 0}


def set_rank(rank: int, *, thread: bool = False) -> None:
    """Record the calling rank (a thread's own in an in-process world, else the process's)."""
    if thread:
        _RANK.value = rank
    else:
        _PROCESS_RANK["rank"] = rank


def _rank() -> int:
    return getattr(_RANK, "value", _PROCESS_RANK["rank"])


class _RankFilter(logging.Filter):
    """Tags each record with its rank; below warning, only rank 0's pass unless debug."""

    def __init__(self) -> None:
        super().__init__()
        self.every_rank = False

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = _rank()
        return self.every_rank or record.rank == 0 or record.levelno >= logging.WARNING


_FILTER = _RankFilter()


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (a redirected or captured one too)."""

    _lbtrain = True

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure(level: str = "info") -> None:
    """Send the `lbtrain` logger's records at `level` and above to stderr, one line each.

    Args:
        level: "debug" (every rank, every record), "info" (rank 0; warnings from any rank)
            or "warning".
    """
    if level not in LEVELS:
        raise ValueError(f"log_level={level!r} is unknown; choose one of {', '.join(LEVELS)}")
    if not any(getattr(h, "_lbtrain", False) for h in logger.handlers):
        handler = _Stderr(sys.stderr)
        handler.setFormatter(logging.Formatter("lbtrain[rank %(rank)s] %(levelname)s: %(message)s"))
        handler.addFilter(_FILTER)
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())
    _FILTER.every_rank = level == "debug"
