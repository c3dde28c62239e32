"""Flags of the settings: each `TrainConfig` field's flag, built from its metadata.

`lbtrain train --help` (and `profile`'s and `balance-report`'s options that are settings of
training too) take the help, default, choices and bounds that `TrainConfig` declares for
each field (lbtrain.trainer.settings), so they cannot drift from the library. The library's
parameter names become flags here, in help and in error messages alike (`translate`).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from lbtrain.trainer.config import KEYS_ARE, TrainConfig
from lbtrain.trainer.settings import GROUPS, ON_OFF, settings_of, shown_default

__all__ = [
    "CLI_ONLY",
    "SETTINGS",
    "HelpFormatter",
    "OnOffFlag",
    "add_setting",
    "add_settings",
    "file_name",
    "flag",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "seed_int",
    "setting_help",
    "translate",
]

# The settings that have a flag, by their library names.
SETTINGS = {entry.name: entry for entry in settings_of(TrainConfig) if entry.metadata["group"]}

# The flags of `lbtrain train` that are no setting: how to launch, or where settings come from.
CLI_ONLY = ("--help", "--config", "--backend")


def flag(name: str) -> str:
    """The flag of the library's parameter `name`: global_batch is --global-batch."""
    return "--" + name.replace("_", "-")


_FIELD_NAMES = sorted((f.name for f in dataclasses.fields(TrainConfig)), key=len, reverse=True)


def translate(message: str) -> str:
    """Turn the library's parameter names in an error message into flag names; a list of a
    config file's keys (after `KEYS_ARE`) stays as the file spells them."""
    message, keys, listed = message.partition(KEYS_ARE)
    message = message.replace("overwrite=True", "--overwrite")
    for name in _FIELD_NAMES:
        message = re.sub(rf"(?<![\w-]){name}=", flag(name) + " ", message)
        message = re.sub(rf"(?<![\w-]){name} (?=['\"])", flag(name) + " ", message)
        if "_" in name:  # no English word has an underscore: a bare global_batch is the flag
            message = re.sub(rf"(?<![\w-]){name}\b", flag(name), message)
    message = message.replace("global_batch_size=", "--global-batch ")
    return message + keys + listed


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    return _int_at_least(text, 0)


# Seeds reach scikit-learn (a PCA's random_state), which takes 0 to 2^32 - 1.
SEED_LIMIT = 2**32 - 1


def seed_int(text: str) -> int:
    """argparse type: a seed, a whole number from 0 to 2^32 - 1."""
    value = _int_at_least(text, 0)
    if value > SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"{value} must be <= {SEED_LIMIT} (2^32 - 1)")
    return value


def file_name(text: str) -> str:
    """argparse type: a path that is not blank (an unset shell variable, `--plot "$OUT"`,
    must not pass for leaving the option out)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty; name a file, or leave it out")
    return text


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number > 0")
    return value


class OnOffFlag(argparse.Action):
    """`--name` / `--no-name`, which also takes the old `--name on|off` (for one release)."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        default: Any = None,
        required: bool = False,
        help: str | None = None,  # noqa: A002 - argparse passes it by this name
    ) -> None:
        strings = [s for o in option_strings for s in (o, "--no-" + o[2:])]
        super().__init__(strings, dest, nargs="?", default=default, required=required, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        negated = bool(option_string and option_string.startswith("--no-"))
        if values is None:
            setattr(namespace, self.dest, not negated)
        elif not negated and values in ON_OFF:
            setattr(namespace, self.dest, ON_OFF[values])
        else:
            on, off = self.option_strings[:2]
            raise argparse.ArgumentError(
                self, f"{option_string} {values!r}: give {on} or {off} (or the old {on} on|off)"
            )


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows an `OnOffFlag` as `--name, --no-name`, as argparse shows a boolean flag, and
    keeps a flag named in help on one line (--sync-batchnorm, never --sync- / batchnorm)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, OnOffFlag):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if isinstance(action, OnOffFlag):  # the usage line: [--name | --no-name]
            return "| " + action.option_strings[1]
        return super()._format_args(action, default_metavar)


def setting_help(name: str) -> str:
    """The help of a setting's flag: its description in flag names, then its default."""
    entry = SETTINGS[name]
    text = f"{translate(entry.metadata['help'])} (default: {shown_default(entry)}"
    if entry.metadata["on_off"]:
        text += f"; {flag(name)} on|off still accepted"
    return (text + ")").replace("%", "%%")  # argparse formats help with %


def _value_type(entry: dataclasses.Field[Any]) -> Callable[[str], Any] | None:
    """The argparse type of a number: the bounds a flag can check before the run starts."""
    meta = entry.metadata
    if entry.name == "seed":
        return seed_int  # a new run's seed: what every workload here accepts
    if meta["kind"] == "int":
        return positive_int if meta["low"] == 1 else non_negative_int
    if meta["kind"] == "float":
        return positive_float if meta["low"] == 0 and meta["open_low"] else float
    return None


def _switch_action(meta: Any) -> Any:
    """A boolean's action: --name/--no-name (with the old on|off where it had them), or
    --name alone where a --no- would mean nothing (--overwrite)."""
    if meta["on_off"]:
        return OnOffFlag
    return argparse.BooleanOptionalAction if meta["negatable"] else "store_true"


def add_setting(group: Any, name: str, default: Any = argparse.SUPPRESS) -> None:
    """Add the flag of setting `name` to `group`: help, choices and type from its metadata.

    `default` is the parsed value when the flag is left out; `train` leaves it out of the
    namespace (SUPPRESS), so a --config file or a resumed run's settings then apply.
    """
    meta = SETTINGS[name].metadata
    kwargs: dict[str, Any] = {"dest": name, "default": default, "help": setting_help(name)}
    if meta["kind"] == "bool":
        kwargs["action"] = _switch_action(meta)
    elif meta["kind"] == "choice":
        kwargs["choices"] = meta["choices"]
    else:
        kwargs.update(type=_value_type(SETTINGS[name]), metavar=meta["metavar"])
    group.add_argument(flag(name), **kwargs)


def add_settings(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Add every setting's flag, by group, in the fields' order; returns the groups."""
    groups = {title: parser.add_argument_group(title) for title in GROUPS}
    for name, entry in SETTINGS.items():
        add_setting(groups[entry.metadata["group"]], name)
    return groups
