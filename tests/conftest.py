"""Test tiers: `slow` marks every test that starts programs (tests/mpi, tests/e2e).

`make test-fast` (pytest -m "not slow") runs the rest, in-process, for the edit-test loop;
`make test` runs everything.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.shared_runs import shared_run

SLOW_FOLDERS = ("mpi", "e2e")
TESTS = Path(__file__).parent

# The MPI jobs the tests launch share this machine's cores with each other and with the
# other pytest worker. MPICH's ranks busy-poll while they wait in a call (for a slower or
# emulated-slow rank, for MPI_Init): a waiting rank then takes a core from a rank that
# computes. Here they sleep between polls instead (nanosleep; about 0.2 ms more a
# collective). What the tests check does not depend on how a rank waits; a user's job keeps
# MPICH's default.
os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow, fast = [], []
    for item in items:
        relative = Path(item.fspath).resolve().relative_to(TESTS.resolve())
        if relative.parts[0] in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
            slow.append(item)
        else:
            fast.append(item)
    # Each worker's share of the collection begins with its part of the slow tests (every
    # k-th one): pytest-xdist's worksteal hands each of k workers a k-th of the items in
    # order, and an idle worker steals from the end of another's queue. With the slow tests
    # all at the front, one worker was left at the end running launches of 8-30 s that the
    # other could not share; now every worker ends on short in-process tests.
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    ordered, start, left = [], 0, len(items)
    for worker in range(workers):
        own = slow[worker::workers]
        share = left // (workers - worker)  # what worksteal hands this worker first
        take = max(0, share - len(own))
        ordered += [*own, *fast[start : start + take]]
        start, left = start + take, left - len(own) - take
    items[:] = [*ordered, *fast[start:]]


@pytest.fixture(scope="session")
def one_process(tmp_path_factory):
    """The exactness runs' reference: `lbtrain train` in one process (tests/fixtures/exact_runs.py).

    Once per session: the in-process and the mpiexec exactness tests compare with the same run.
    """
    from lbtrain import SingleProcessCommunicator
    from lbtrain.cli.entry import main
    from tests.fixtures.exact_runs import COMMON, trained

    def make(folder: Path) -> None:
        code = main([*COMMON, "--out", str(folder / "run")], comm=SingleProcessCommunicator())
        assert code == 0

    return trained(shared_run(tmp_path_factory, "one-process", make) / "run")[0]
