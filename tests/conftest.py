"""Test tiers: `slow` marks every test that starts programs (tests/mpi, tests/e2e).

`make test-fast` (pytest -m "not slow") runs the rest, in-process, for the edit-test loop;
`make test` runs everything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SLOW_FOLDERS = ("mpi", "e2e")
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        relative = Path(item.fspath).resolve().relative_to(TESTS.resolve())
        if relative.parts[0] in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
