"""How a `TrainConfig` field describes itself: its help, bounds and flag, written once.

Each field of `TrainConfig` is made by `setting(default, help, ...)`, which keeps the
description in the field's metadata. `TrainConfig.validate`, `lbtrain train --help`, the
options section of docs/cli.md (scripts/cli_docs.py) and `help(TrainConfig)` all read it
from there, so none of them can drift from the others or from the defaults.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "GROUPS",
    "ON_OFF",
    "check_setting",
    "describe",
    "field_default",
    "read_on_off",
    "setting",
    "settings_of",
    "shown_default",
]

# The groups of `lbtrain train --help` (and of docs/cli.md), in their order.
GROUPS = ("run", "balance", "optimisation", "evaluation and checkpoints")

# The spellings of the settings that were the strings "on"/"off" before they were booleans:
# still read, for one release, from a config file, a checkpoint and the command line.
ON_OFF = {"on": True, "off": False}


def setting(
    default: Any,
    text: str,
    group: str | None,
    *,
    kind: str | None = None,
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
    metavar: str | None = None,
    default_text: str | None = None,
    negatable: bool = True,
    on_off: bool = False,
) -> Any:
    """A dataclass field whose metadata describes the setting.

    Args:
        default: the default (a dict is copied for each config).
        text: what the setting does, in the library's parameter names (the CLI turns
            them into flags).
        group: its group in `lbtrain train --help`; None: no flag of its own.
        kind: "int", "float", "bool", "choice" or "str"; by default from `choices` and
            the default's type (give it where the default is None).
        choices: the values allowed.
        low, high, open_low, open_high: the bounds of a number (open: the bound itself
            is refused).
        metavar: the value's name on the command line.
        default_text: how to show a default computed elsewhere (None: the default).
        negatable: a boolean gets a --no- flag too.
        on_off: a boolean that was once "on"/"off": those strings are still read.
    """
    if kind is None:
        kind = "choice" if choices else _kind_of(default)
    meta = {
        "help": text, "group": group, "kind": kind, "choices": choices, "low": low,
        "high": high, "open_low": open_low, "open_high": open_high,
        "metavar": metavar or ("N" if kind == "int" else None), "default_text": default_text,
        "negatable": negatable, "on_off": on_off,
    }  # fmt: skip
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _kind_of(default: Any) -> str:
    for kind, type_ in (("bool", bool), ("int", int), ("float", float)):
        if isinstance(default, type_):
            return kind
    return "str"


def settings_of(config_class: type) -> Iterator[dataclasses.Field[Any]]:
    """The fields of `config_class` made by `setting`, in their order."""
    return (f for f in dataclasses.fields(config_class) if "help" in f.metadata)


def field_default(field: dataclasses.Field[Any]) -> Any:
    """The field's default value (a fresh one from its factory)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def shown_default(field: dataclasses.Field[Any]) -> str:
    """The default as help shows it: "on"/"off" for a boolean, "none" for None."""
    meta, value = field.metadata, field_default(field)
    if meta["default_text"] is not None:
        return meta["default_text"]
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


def describe(config_class: type, indent: str = "    ", width: int = 92) -> str:
    """Every setting as one wrapped paragraph, `name (default): help`, for docstrings."""
    paragraphs = []
    for field in settings_of(config_class):
        value = field_default(field)
        shown = repr(value) if field.metadata["default_text"] is None else shown_default(field)
        paragraphs.append(
            textwrap.fill(
                f"{field.name} ({shown}): {field.metadata['help']}",
                width,
                initial_indent=indent,
                subsequent_indent=indent * 2,
            )
        )
    return "\n".join(paragraphs)


def read_on_off(config_class: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with the old "on"/"off" of the boolean settings read as True/False."""
    read = dict(data)
    for field in settings_of(config_class):
        value = read.get(field.name)
        if field.metadata["on_off"] and isinstance(value, str) and value in ON_OFF:
            read[field.name] = ON_OFF[value]
    return read


# Settings whose empty value says "none", overriding what a resumed checkpoint had (the
# way to drop its emulation when the number of ranks changed, as the refusal says).
CLEARED_BY_EMPTY = ("emulate_slowdown", "emulate_change")


def check_setting(field: dataclasses.Field[Any], value: Any) -> None:
    """Raise one ValueError naming the setting, the value and the fix, if `value` is out."""
    meta, name = field.metadata, field.name
    if value is None and field_default(field) is None:
        return  # an optional setting left out
    kind = meta["kind"]
    if (
        kind == "str"
        and isinstance(value, str)
        and not value.strip()
        and name not in CLEARED_BY_EMPTY
    ):
        # An unset shell variable ("--plan $PLAN") must not pass for leaving the setting out.
        raise ValueError(f"{name}={value!r} is empty; give a value, or leave it out")
    if kind == "bool" and not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False (true or false in a file)")
    if kind == "choice" and value not in meta["choices"]:
        raise ValueError(f"{name}={value!r} is unknown; choose one of {', '.join(meta['choices'])}")
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}={value!r} must be a whole number")
        if meta["low"] is not None and value < meta["low"]:
            raise ValueError(f"{name}={value} must be >= {meta['low']}")
    if kind == "float":
        _check_number(name, value, meta)


def _check_number(name: str, value: Any, meta: Mapping[str, Any]) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    low, high = meta["low"], meta["high"]
    if low is not None and (value < low or (meta["open_low"] and value == low)):
        raise ValueError(f"{name}={value} must be {'>' if meta['open_low'] else '>='} {low:g}")
    if high is not None and (value > high or (meta["open_high"] and value == high)):
        raise ValueError(f"{name}={value} must be {'<' if meta['open_high'] else '<='} {high:g}")
