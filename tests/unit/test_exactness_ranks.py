"""Unequal shares, zero shares and every sync mode against one process, on in-process ranks.

The check is tests/mpi/scripts/exactness.py's, run on threads over `lbtrain.comm.LocalWorld`
(milliseconds, no launcher); tests/mpi/test_exactness.py runs it on real MPI ranks.
"""

from __future__ import annotations

import pytest

from lbtrain.comm import run_ranks
from tests.mpi.scripts.exactness import check


@pytest.mark.parametrize(
    ("sizes", "mode"),
    [
        ("5,11,48", "function"),
        ("1,30", "function"),
        ("20,0,44", "function"),
        ("1,30", "overlap"),
        ("20,0,44", "overlap"),
        ("20,0,44", "staged"),
    ],
)
def test_unequal_shares_match_one_process_and_naive_average_does_not(sizes, mode):
    shares = [int(s) for s in sizes.split(",")]
    results = run_ranks(len(shares), lambda comm: check(comm, shares, mode), timeout=60)
    for result in results:
        if result.error is not None:
            raise result.error
    assert results[0].value.startswith("exactness ok")
