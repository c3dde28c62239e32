"""The `lbtrain` command line's grammar: one subcommand per verb module, one-line usage errors.

lbtrain.cli.entry parses with it; it imports every verb (and so torch), which the entry
imports only once malloc is tuned.
"""

from __future__ import annotations

import argparse
import re
import threading
from collections.abc import Sequence
from typing import IO, Any, NoReturn

import lbtrain
from lbtrain.cli import balance_report, compare, env, profile, show, train, whatif
from lbtrain.workloads import get_plugin

__all__ = ["VERBS", "build_parser", "parse"]

VERBS = (train, profile, balance_report, show, compare, whatif, env)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per verb module.

    Args:
        argv: the command line, read ahead for `train --workload` so that the workload's own
            options are part of the parser (and of `train --help`).
    """
    parser = _Parser(
        prog="lbtrain",
        description="Load-balanced synchronous data-parallel training on heterogeneous "
        "CPU/GPU replicas. Run a subcommand with --help for its options.",
    )
    parser.add_argument("--version", action="version", version=f"lbtrain {lbtrain.__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    # The verbs that build a workload take its own options as flags: read --workload ahead.
    workload = train.workload_from_argv(list(argv or []))
    for verb in VERBS:
        if verb in (train, profile, balance_report, whatif):
            verb.add_parser(subparsers, workload)
        else:
            verb.add_parser(subparsers)
    return parser


# Whether argparse may print on this thread: ranks other than 0 parse the same command line
# silently, so a mistake is printed once. Per thread, not by swapping sys.stderr, which
# every rank shares when ranks are threads of one process (lbtrain.comm.LocalWorld).
_PARSING = threading.local()


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser (its subcommands too) that prints nothing on a quiet thread.

    A usage error is one line naming the flag and what is wrong, then where help is, not
    argparse's usage block first: `train`'s is 25 lines, which hide the one that matters.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `--epoch 3` is no `--epochs 3`: flags are spelt out, as the docs and the read-ahead
        # of --workload (train.workload_from_argv) spell them; the subcommands too.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        if not getattr(_PARSING, "quiet", False):
            super()._print_message(message, file)

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        named = re.fullmatch(r"argument (\S+): (.*)", text)
        if named and named.group(1).split("/")[0] in named.group(2):
            text = named.group(2)  # the type's message names the flag already
        self.exit(2, f"{self.prog}: error: {text}\nsee {self.prog} --help\n")


def parse(parser: argparse.ArgumentParser, argv: list[str], quiet: bool) -> argparse.Namespace:
    """`argv` parsed by `parser` (built by `build_parser`); a mistake exits 2 with one line.

    Args:
        quiet: print nothing (not even that line): ranks other than 0 parse the same
            command line, so that a mistake is printed once.
    """
    _PARSING.quiet = quiet
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            # Named by the verb's own parser, so the hint leads to that verb's options.
            verb = _verb_parser(parser, argv) or parser
            verb.error(_unknown_workload(argv) or f"unrecognized arguments: {' '.join(extra)}")
        return args
    finally:
        _PARSING.quiet = False


def _unknown_workload(argv: list[str]) -> str | None:
    """Why the workload's flags were not known: a --workload that names no workload (its
    options could not be added), rather than "unrecognized arguments" for each of them."""
    try:
        get_plugin(train.workload_from_argv(argv))
    except ValueError as exc:
        return str(exc)
    return None


def _verb_parser(
    parser: argparse.ArgumentParser, argv: list[str]
) -> argparse.ArgumentParser | None:
    """The subcommand parser `argv` chose: its first word (the top level has no values)."""
    verb = next((arg for arg in argv if not arg.startswith("-")), None)
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        choices = getattr(action, "choices", None) or {}
        if verb in choices:
            return choices[verb]
    return None
