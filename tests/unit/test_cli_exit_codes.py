"""The command line's exit codes: one table (lbtrain.cli.entry.EXIT_CODES), as documented."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

from lbtrain.cli.entry import EXIT_CODES, Report, exit_code_for
from lbtrain.collective import USER_ERRORS, CollectiveError
from lbtrain.comm import RankLost
from lbtrain.comm.launchers import LauncherError, LoneRankError
from lbtrain.trainer.engine import TrainingDiverged
from lbtrain.trainer.signals import SIGNAL_EXIT, Interrupted

REPO = Path(__file__).resolve().parents[2]


def _documented_statuses() -> set[int]:
    """The statuses in docs/cli.md's "Exit codes" table (its first column)."""
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| ")]
    return {int(n) for cell in cells for n in re.findall(r"\b\d+\b", cell)}


def _table_statuses() -> set[int]:
    statuses = {row.status for row in EXIT_CODES if row.status is not None}
    if any(row.status is None for row in EXIT_CODES):  # a signal's own: 130 or 143
        statuses |= set(SIGNAL_EXIT.values())
    return statuses


def test_the_documented_exit_codes_are_the_tables():
    documented = _documented_statuses()
    # 0: success; 9 and 137: SIGKILL, which no handler sees.
    assert documented - {0, 9, 137} == _table_statuses()
    # The check can fail: a status the docs do not list is found.
    assert not {3} | _table_statuses() <= documented


def test_every_class_the_table_names_is_an_exception_class():
    for row in EXIT_CODES:
        for raised in row.raised:
            if isinstance(raised, str):
                module, _, name = raised.partition(":")
                raised = getattr(importlib.import_module(module), name)
            assert isinstance(raised, type) and issubclass(raised, BaseException), raised


def test_each_exception_finds_its_row():
    def row(exc):
        found = exit_code_for(exc)
        return found.status, found.report

    assert row(BrokenPipeError()) == (141, Report.QUIET)  # not OSError's 2
    assert row(TrainingDiverged("nan")) == (1, Report.ONCE)  # not CollectiveError's 2
    assert row(CollectiveError("x")) == (2, Report.ONCE)
    assert row(KeyboardInterrupt()) == (130, Report.SIGNAL)
    assert row(Interrupted(15)) == (None, Report.SIGNAL)
    assert row(LoneRankError("x")) == (2, Report.EVERY)  # not LauncherError's
    assert row(LauncherError("x")) == (2, Report.RANK)
    assert row(RankLost("x")) == (75, Report.RANK)  # restart me: not a mistake
    for error in USER_ERRORS:  # the library's bad input is the command line's
        assert row(error("x")) == (2, Report.RANK)
    assert row(KeyError("x")) == (1, Report.TRACEBACK)
    assert exit_code_for(SystemExit(2)) is None  # argparse's own: not the table's


def test_the_entry_module_imports_neither_torch_nor_mpi4py():
    # The console script tunes malloc before torch is imported (lbtrain/malloc.py).
    code = ("import sys, lbtrain.cli.entry\n"
            "loaded = {'torch', 'mpi4py'} & set(sys.modules)\n"
            "sys.exit(f'imported {sorted(loaded)}' if loaded else 0)")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_the_last_failure_an_elastic_agent_will_not_restart_says_how_to_go_on():
    from lbtrain.cli.entry import restart_hint

    last = {"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "2"}
    assert "no restart left" in restart_hint(75, last) and "--resume auto" in restart_hint(1, last)
    # A restart still to come, the user's own mistake, or no elastic agent: nothing to add.
    assert restart_hint(75, {**last, "TORCHELASTIC_RESTART_COUNT": "1"}) == ""
    assert restart_hint(2, last) == "" and restart_hint(75, {}) == ""
