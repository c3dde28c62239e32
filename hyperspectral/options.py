"""Converters of the workload's options; this module does not import lbtrain.

Each converter takes a command-line string or a TOML value and returns the option's value,
or raises a one-line ``ValueError`` that names the flag, the value and what to use instead.
:mod:`hyperspectral.workload` declares its options with them; argparse shows the messages
after ``argument --flag:``, and ``build`` raises them as they are for Python callers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from .pipeline import DATASET_NAMES, canonical_scene

__all__ = [
    "flag",
    "is_none",
    "parse_bool",
    "parse_choice",
    "parse_dataset",
    "parse_float",
    "parse_int",
    "parse_path",
]


def flag(name: str) -> str:
    """The command-line flag of option ``name``: ``train_ratio`` -> ``--train-ratio``."""
    return "--" + name.replace("_", "-")


def is_none(value: Any) -> bool:
    """True for None, and for the strings ``""`` and ``"none"`` (any case): the option unset."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))


def parse_dataset(value: Any) -> str:
    """A scene name in any case, with or without underscores -> the registry name."""
    name = canonical_scene(value) if isinstance(value, str) else None
    if name is None:
        raise ValueError(
            f"--dataset {value!r} is unknown; choose one of {', '.join(DATASET_NAMES)} "
            "(case and underscores do not matter)"
        )
    return name


def parse_int(name: str, minimum: int, *, optional: bool = False, odd: bool = False) -> Callable:
    """A converter to a whole number >= ``minimum`` (odd if asked; None allowed if optional)."""
    hint = "an odd whole number" if odd else "a whole number"
    unset = " (or leave it unset)" if optional else ""

    def convert(value: Any) -> int | None:
        if optional and is_none(value):
            return None
        try:
            if isinstance(value, bool | float):
                raise ValueError
            number = int(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{flag(name)} {value!r} is not {hint}; give {hint} >= {minimum}{unset}"
            ) from None
        if number < minimum or (odd and number % 2 == 0):
            raise ValueError(f"{flag(name)} {number} is invalid; give {hint} >= {minimum}{unset}")
        return number

    convert.__name__ = name  # argparse names the type in its own messages
    return convert


def parse_float(
    name: str, low: float, high: float, *, low_open: bool, optional: bool = False
) -> Callable:
    """A converter to a number in [low, high), or (low, high) with ``low_open`` (None allowed
    if optional)."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g})"

    def convert(value: Any) -> float | None:
        if optional and is_none(value):
            return None
        try:
            if isinstance(value, bool):
                raise ValueError
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{flag(name)} {value!r} is not a number; give a number in {interval}"
            ) from None
        inside = (number > low if low_open else number >= low) and number < high
        if not inside:
            raise ValueError(
                f"{flag(name)} {number:g} is out of range; give a number in {interval}"
            )
        return number

    convert.__name__ = name
    return convert


def parse_choice(name: str, choices: Iterable[str]) -> Callable:
    """A converter to one of ``choices`` (given in any case)."""
    valid = tuple(choices)

    def convert(value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in valid:
            raise ValueError(f"{flag(name)} {value!r} is unknown; choose one of {', '.join(valid)}")
        return text

    convert.__name__ = name
    return convert


def parse_path(name: str) -> Callable:
    """A converter to an absolute path string, or None when unset.

    Absolute, since the run records it (config.toml, the checkpoint): a resume or a --config
    from another working directory then finds the same folder, not one of the same name.
    (Runs recorded before, and hand-written config files, keep paths relative to the
    working directory of the command that reads them.)
    """

    def convert(value: Any) -> str | None:
        if isinstance(value, str) and not value.strip():
            # An unset shell variable ("--split-file $SPLIT") is not "none": a run without
            # the file would train on another split, or read the scene from elsewhere.
            raise ValueError(
                f"{flag(name)} {value!r} is empty; give a path, or leave the option out"
            )
        if is_none(value):
            return None
        if not isinstance(value, str | os.PathLike):
            raise ValueError(f"{flag(name)} {value!r} is not a path; give a file or folder name")
        return os.path.abspath(os.path.expanduser(os.fspath(value)))

    convert.__name__ = name
    return convert


def parse_bool(name: str, value: Any) -> bool:
    """Strict on/off for ``build`` (the CLI's own flags are --name / --no-name)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{flag(name)} {value!r} is not on or off; give true or false")
