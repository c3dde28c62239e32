"""Every `lbtrain` command line in README.md and docs/*.md parses, so documented flags stay real.

A command is a line of a fenced code block: in a block marked bash/sh/shell/console every
line, in any other block only lines that start with a `$ ` prompt (output pasted after a
command is not a command). Backslash-continued lines are joined and `#` comments dropped.
The command is what follows the first `lbtrain` word (a path ending in `/lbtrain`, as
`.venv/bin/lbtrain`, too) or `-m lbtrain`, so launcher prefixes (`mpiexec -n 3`, `srun`,
`torchrun ... -m lbtrain`, `python -m lbtrain`, `PYTHONPATH=.`) are stripped; it ends at a
pipe, `;`, `&&` or a redirection. `python -m hyperspectral train ARGS` is parsed as the
`lbtrain train --workload hyperspectral ARGS` it runs, with its legacy flags translated
(hyperspectral/cli.py). Each is given to `lbtrain.cli.parser.build_parser(argv).parse_args`,
which exits on an unknown flag or a bad value: that fails the test with the offending line.

Skipped: a command holding a placeholder word (`...`, or `<...>` such as `<folder>`), which
is a pattern, not something to run. Verbs other engineers add later appear in the docs only
once they exist; the HTML comment that marks their place is not a command.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from hyperspectral.cli import translate_argv
from lbtrain.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"bash", "sh", "shell", "console", "zsh"}
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
STOP = set("|&;<>()")
LAUNCHERS = {"mpiexec", "mpirun", "srun", "torchrun"}


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    line: str  # the joined source line
    argv: tuple[str, ...] | None  # arguments after `lbtrain`; None: a placeholder, skipped


def _block_lines(path: Path) -> list[tuple[int, str, str]]:
    """(line number, text, block language) of every line inside a fenced code block."""
    found, language, fence = [], None, None
    for number, text in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(text)
        if match and (fence is None or match.group(1) == fence):
            if fence is None:
                fence, language = match.group(1), match.group(2).lower()
            else:
                fence = language = None
            continue
        if fence is not None:
            found.append((number, text, language))
    return found


def _joined(lines: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """Backslash-continued lines joined into one, numbered by their first line."""
    out: list[tuple[int, str, str]] = []
    pending: tuple[int, str, str] | None = None
    for number, text, language in lines:
        if pending is not None:
            number, text = pending[0], pending[1] + " " + text.strip()
            pending = None
        if text.rstrip().endswith("\\") and not text.lstrip().startswith("#"):
            pending = (number, text.rstrip()[:-1], language)
            continue
        out.append((number, text, language))
    return out


def _words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _program(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _until_stop(words: list[str]) -> list[str]:
    end = next((j for j, w in enumerate(words) if set(w) <= STOP), len(words))
    return words[:end]


def _lbtrain_argv(words: list[str]) -> list[str] | None:
    """The arguments after `lbtrain` (or `-m lbtrain`), up to a pipe or the like; or None.

    The program is the first word after any `NAME=value`: `lbtrain` itself; a launcher
    (mpiexec, mpirun, srun, torchrun) followed somewhere by `lbtrain` or `-m lbtrain`; or a
    Python running `-m lbtrain` or `-m hyperspectral`. Anything else (make, pip) is not one.
    """
    words = _until_stop(words)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
        words = words[1:]
    if not words:
        return None
    program = _program(words[0])
    if program == "lbtrain":
        return words[1:]
    if program in LAUNCHERS:
        for i, word in enumerate(words[1:], 1):
            if _program(word) == "lbtrain":
                return words[i + 1 :]
            if _program(word).startswith("python") and "-m" not in words[i + 1 : i + 2]:
                return None  # a launched script of the user's, not lbtrain
    if program in LAUNCHERS or program.startswith("python"):
        for i, word in enumerate(words[:-1]):
            if word == "-m" and words[i + 1] == "lbtrain":
                return words[i + 2 :]
            if word == "-m" and words[i + 1] == "hyperspectral":
                rest = words[i + 2 :]
                if rest[:1] != ["train"]:
                    return None
                return ["train", "--workload", "hyperspectral", *translate_argv(rest[1:])]
    return None


def _placeholder(argv: list[str]) -> bool:
    return any(word == "..." or re.fullmatch(r"<[^<>]+>", word) for word in argv)


def documented_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        lines = _block_lines(path)
        for number, text, language in _joined(lines):
            stripped = text.strip()
            prompted = stripped.startswith("$ ")
            if language not in SHELL_BLOCKS and not prompted:
                continue  # output, Python, a diff: not a command line
            if prompted:
                stripped = stripped[2:]
            argv = _lbtrain_argv(_words(stripped))
            if argv is None:
                continue
            where = f"{path.relative_to(ROOT)}:{number}"
            commands.append(Command(where, stripped, None if _placeholder(argv) else tuple(argv)))
    return commands


COMMANDS = documented_commands()


def test_the_docs_hold_commands_of_every_verb() -> None:
    """The extraction finds what is there (a broken extractor would pass every command)."""
    parsed = [c for c in COMMANDS if c.argv is not None]
    assert len(parsed) >= 20, [c.line for c in COMMANDS]
    verbs = {c.argv[0] for c in parsed if c.argv}
    assert {"train", "profile", "balance-report", "env"} <= verbs, verbs
    launched = " ".join(c.line for c in parsed)
    for launcher in ("mpiexec", "torchrun", "python -m lbtrain", "python -m hyperspectral"):
        assert launcher in launched, launcher
    skipped = [c.line for c in COMMANDS if c.argv is None]
    assert len(skipped) <= 2, f"placeholders in documented commands: {skipped}"


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if c.argv is not None], ids=lambda c: c.where
)
def test_documented_command_parses(command: Command) -> None:
    argv = list(command.argv or ())
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser(argv).parse_args(argv)
        return
    except SystemExit as exc:
        if exc.code == 0 and ("--help" in argv or "-h" in argv or "--version" in argv):
            return
        message = stderr.getvalue().strip().splitlines()
        why = message[-1] if message else f"exit status {exc.code}"
    pytest.fail(f"{command.where}: `{command.line}` does not parse: {why}", pytrace=False)


def test_the_extractor_reads_launchers_and_continuations() -> None:
    assert _lbtrain_argv(_words("mpiexec -n 3 .venv/bin/lbtrain env  # note")) == ["env"]
    assert _lbtrain_argv(_words("torchrun --nproc-per-node 2 -m lbtrain env | head")) == ["env"]
    assert _lbtrain_argv(_words("PYTHONPATH=. lbtrain profile -o p.json")) == [
        "profile",
        "-o",
        "p.json",
    ]
    assert _lbtrain_argv(_words("python -m hyperspectral train --scene pavia_u")) == [
        "train",
        "--workload",
        "hyperspectral",
        "--dataset",
        "pavia_u",
    ]
    assert _lbtrain_argv(_words("make demo")) is None
    assert _lbtrain_argv(_words("python -m pip install lbtrain")) is None
    assert _lbtrain_argv(_words("mpiexec -n 3 python -m mpi4py examples/balanced_toy.py")) is None
    assert _lbtrain_argv(_words("lbtrain --version")) == ["--version"]
    joined = _joined([(1, "lbtrain train \\", "bash"), (2, "  --epochs 3", "bash")])
    assert joined == [(1, "lbtrain train  --epochs 3", "bash")]


def test_the_demo_page_shows_what_make_runs() -> None:
    """docs/demo.md shows the commands of `make demo`, `demo-toy` and `demo-hs` as they are."""
    make = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    values = {"$(VENV)": ".venv", "$(PY)": ".venv/bin/python", "$(RANKS)": "3"}
    lines = _joined(_block_lines(ROOT / "docs/demo.md"))
    shown = [_words(text.strip()) for _, text, language in lines if language in SHELL_BLOCKS]
    for target in ("demo", "demo-toy", "demo-hs"):
        recipe = re.search(rf"^{target}:.*\n\t(.*)", make, re.M)
        assert recipe, target
        command = recipe.group(1)
        for name, value in values.items():
            command = command.replace(name, value)
        assert _words(command) in shown, f"docs/demo.md should show `make {target}`: {command}"
