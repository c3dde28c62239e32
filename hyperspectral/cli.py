"""Command line of ``python -m hyperspectral``: an alias of ``lbtrain train``.

Its one command, ``train ARGS``, runs ``lbtrain train --workload hyperspectral ARGS`` in this
process (one rank without a launcher), so there is one training loop. The flags of the
former single-process command are translated: ``--scene`` is ``--dataset`` and
``--batch-size`` is ``--global-batch`` (also as ``--flag=value``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["LEGACY_FLAGS", "PROG", "USAGE", "main", "translate_argv"]

# Flags of the former single-process trainer -> their `lbtrain train` names.
LEGACY_FLAGS = {"--scene": "--dataset", "--batch-size": "--global-batch"}

PROG = "python -m hyperspectral"

USAGE = f"""\
usage: {PROG} train [OPTIONS]

Runs `lbtrain train --workload hyperspectral [OPTIONS]` in this process; see
`{PROG} train --help` for the options. --scene is accepted for
--dataset and --batch-size for --global-batch.
"""


def translate_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the legacy flags renamed; everything else is passed as it is."""
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if name in LEGACY_FLAGS:
            arg = LEGACY_FLAGS[name] + eq + value
        out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m hyperspectral`` with ``argv`` (default ``sys.argv[1:]``).

    Returns:
        The exit status of ``lbtrain train`` (0 on success, 2 on a user error), 0 for
        ``--help`` and 2 when the command is not ``train``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "train":
        if argv and argv[0] in ("-h", "--help"):
            print(USAGE, end="")
            return 0
        print(USAGE, end="", file=sys.stderr)
        if argv:
            print(f"error: unknown command {argv[0]!r}; the command is train", file=sys.stderr)
        return 2
    given = {arg.partition("=")[0] for arg in argv[1:]}
    for old, new in LEGACY_FLAGS.items():
        if old in given and new in given:  # argparse would keep the later one, unsaid
            print(USAGE, end="", file=sys.stderr)
            print(f"error: {old} is the older name of {new}: give one of them", file=sys.stderr)
            return 2
    # Imported here: running it imports torch, which `python -m hyperspectral` tunes malloc
    # for first.
    from lbtrain.cli.entry import main as lbtrain_main

    try:
        return lbtrain_main(["train", "--workload", "hyperspectral", *translate_argv(argv[1:])])
    except SystemExit as exc:  # argparse: --help, or a bad flag (its message is printed)
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
