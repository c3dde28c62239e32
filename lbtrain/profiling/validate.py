"""A profile record checked as data: each field's type, range, and fit with the measurements.

A profiles file may be edited, spliced or damaged. Every field is checked before the record
is built, so whatever JSON a file holds, loading it either succeeds or raises one ValueError
that names the field, never a TypeError, OverflowError or a plan built on nonsense.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

from lbtrain.profiling.fit import fit_step_time

__all__ = ["check_fit", "check_profile_fields"]

# Float noise allowed when comparing the fitted intercept with the measured steps (the fit
# clamps alpha to the smallest median, so a genuine file meets it exactly).
_ALPHA_SLACK = 1e-9
# How far a file's line may stray from the fit of its own measurements. Profiling writes
# the fit itself, so a genuine file meets it to rounding; the margin leaves room for files
# of an older fit, and catches an edited alpha or beta.
_FIT_TOLERANCE = 0.10


def _whole(low: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"must be a whole number >= {low}"
        return None

    return check


def _number(low: float, *, above: bool = False, high: float | None = None) -> Callable:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        if not math.isfinite(value):
            return "must be finite"
        if value < low or (above and value == low) or (high is not None and value > high):
            bound = f"> {low}" if above else f">= {low}"
            return f"must be {bound}" + (f" and <= {high}" if high is not None else "")
        return None

    return check


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "must be a string"


def _timestamp(value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be an ISO 8601 time string"
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return "must be an ISO 8601 time string"
    return None


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda value: None if value is None else check(value)


def _batch_sizes(value: Any) -> str | None:
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of batch sizes"
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in value):
        return "must hold whole numbers >= 1"
    if any(a >= b for a, b in zip(value, value[1:], strict=False)):
        return "must be increasing (the ladder of batches timed)"
    return None


def _shape(value: Any) -> str | None:
    if not isinstance(value, list) or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in value
    ):
        return "must be a list of whole numbers >= 1 (one sample's shape)"
    return None


# Longer than any training step measured (11.6 days); also keeps the fit's sums of squares
# within floating point (a step time of 1e154 s overflowed them).
_MAX_STEP_SECONDS = 1e6


def _step_times(value: Any) -> str | None:
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of seconds"
    if any(_number(0.0, above=True)(t) for t in value):
        return "must hold finite seconds > 0"
    if any(t > _MAX_STEP_SECONDS for t in value):
        return f"must hold seconds <= {_MAX_STEP_SECONDS:g} (a step of days is no measurement)"
    return None


_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "rank": _whole(0),
    "host": _text,
    "device": _text,
    "device_kind": _text,
    "device_name": _text,
    "threads": _whole(1),
    "workload": _text,
    "batch_sizes": _batch_sizes,
    "step_times": _step_times,
    "alpha": _number(0.0),
    "beta": _number(0.0, above=True),
    "r_squared": _optional(_number(-math.inf, high=1.0)),
    "cap": _optional(_whole(1)),
    "cap_source": _text,
    "memory_per_sample": _optional(_number(0.0)),
    "slowdown": _number(1.0),
    "repeats": _whole(1),
    "started_at": _timestamp,
    "finished_at": _timestamp,
    "reference_batch": _optional(_whole(1)),
    "fit_relative_error": _optional(_number(0.0)),
    "sync_time": _optional(_number(0.0)),
    "sync_bytes": _optional(_whole(0)),
    "sync_ranks": _optional(_whole(1)),
    "model": _optional(_text),
    "sample_shape": _optional(_shape),
}


def check_profile_fields(data: dict[str, Any]) -> None:
    """Raise ValueError("field ...: problem") for the first field that is not valid data.

    Fields absent from `data` are left to the caller (required or optional); values are
    checked one by one, then against each other: as many step times as batch sizes, and an
    intercept alpha no larger than the smallest measured step (a fixed cost per step above
    every whole step measured is not a fit of those measurements).
    """
    for name, check in _FIELDS.items():
        if name in data:
            problem = check(data[name])
            if problem is not None:
                raise ValueError(f"field {name}={_short(data[name])} {problem}")
    sizes, times = data.get("batch_sizes"), data.get("step_times")
    if isinstance(sizes, list) and isinstance(times, list) and len(sizes) != len(times):
        raise ValueError(
            f"field batch_sizes holds {len(sizes)} entries but step_times {len(times)}; "
            "each batch size needs its step time"
        )
    alpha = data.get("alpha")
    if isinstance(alpha, int | float) and isinstance(times, list) and times:
        if alpha > min(times) * (1 + _ALPHA_SLACK):
            raise ValueError(
                f"field alpha={alpha!r} is larger than the smallest of step_times "
                f"({min(times)!r} s); the fixed cost per step cannot exceed a whole step"
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_fit(data: dict[str, Any]) -> None:
    """Raise ValueError unless alpha and beta are the fit of the record's own step times.

    The plans use the line: `cost` through alpha and beta, `proportional` through the
    throughput the line gives. A line that does not describe the measured steps (an edited
    beta, say) would make the two policies disagree on nonsense. Call it on records read
    from a file, after :func:`check_profile_fields`.
    """
    sizes, times = data["batch_sizes"], data["step_times"]
    alpha, beta = data["alpha"], data["beta"]
    fit = fit_step_time(sizes, times)
    for b in sizes:
        given, fitted = alpha + beta * b, fit.step_time(b)
        if abs(given - fitted) > _FIT_TOLERANCE * fitted:
            raise ValueError(
                f"field beta={beta!r} with alpha={alpha!r} gives {given:.4g} s per step at "
                f"batch {b}, but the fit of its batch_sizes and step_times gives {fitted:.4g} s; "
                "the line must be the fit of the measured steps (was alpha, beta or a step "
                "time edited?)"
            )
