"""Argument checks for the library's entry points: any kind of number, one clear error.

numpy's integer and real scalars are accepted wherever Python's are (`numbers.Integral` and
`numbers.Real`); `bool` is refused, since `True` as a batch size or rank is always a slip.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any

__all__ = ["flag", "listed", "real", "whole"]


def whole(name: str, value: object, *, low: int | None = None) -> int:
    """`value` as an int; TypeError naming `name` for a non-integer, ValueError below `low`."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(
            f"{name}={value!r} ({type(value).__name__}) is not a whole number: pass an int "
            "(numpy integers are fine)"
        )
    number = int(value)
    if low is not None and number < low:
        raise ValueError(f"{name}={number} is invalid: it must be an integer >= {low}")
    return number


def flag(name: str, value: object) -> bool:
    """`value` as a bool; TypeError naming `name` for anything else (a string "False" is
    true to Python, so it is refused rather than read)."""
    # numpy's bool is no subclass of bool; it is told by its type's name, with no import.
    if not isinstance(value, bool) and type(value).__name__ not in ("bool_", "bool"):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) must be True or False")
    return bool(value)


def real(name: str, value: object) -> float:
    """`value` as a float; TypeError naming `name` for anything but a real number."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name}={value!r} ({type(value).__name__}) is not a number: pass a float or int "
            "(numpy scalars are fine)"
        )
    return float(value)


def listed(name: str, value: object, what: str) -> list[Any]:
    """`value` as a list (a generator is read once); TypeError naming `name` otherwise."""
    if value is None or isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{name}={value!r} is not a list: pass a list of {what}")
    return list(value)
