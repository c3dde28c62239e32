"""Collective checks and values: every rank agrees, or every rank stops with one line.

A per-rank problem (say cuda:3 on one node) must not leave the other ranks waiting forever
in their next collective call: each check runs on every rank (or on rank 0 alone, for the
files only it reads and writes), and its failure reaches every rank as one CollectiveError.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from lbtrain.comm import Communicator
from lbtrain.outputs import writing

__all__ = ["USER_ERRORS", "CollectiveError", "agree", "root_value", "write_on_root"]

T = TypeVar("T")

# Errors a check may raise for bad user input or an unusable environment.
USER_ERRORS = (ValueError, RuntimeError, OSError)


class CollectiveError(Exception):
    """A user error that every rank knows about: rank 0 reports it and all ranks stop."""


def agree(comm: Communicator, check: Callable[[], T], *, name_rank: bool = True) -> T:
    """Run `check` on every rank and fail on all ranks together if it failed on any.

    Collective. A per-rank problem (say cuda:3 on one node) would otherwise leave the other
    ranks waiting forever in their next collective call.

    Args:
        comm: the job's communicator.
        check: validation to run; raises ValueError, RuntimeError or OSError on bad input.
        name_rank: prefix "rank R: " when only some ranks failed (off for checks that only
            rank 0 runs, where the rank says nothing).

    Returns:
        What `check` returned on this rank.

    Raises:
        CollectiveError: on every rank, with the first failing rank's message.
    """
    try:
        value, error = check(), None
    except USER_ERRORS as exc:
        value, error = None, " ".join(str(exc).split())
    errors = comm.allgather(error)
    failed = [(rank, message) for rank, message in enumerate(errors) if message is not None]
    if failed:
        rank, message = failed[0]
        if name_rank and comm.size > 1 and len(failed) < comm.size:
            message = f"rank {rank}: {message}"
        raise CollectiveError(message)
    return value  # type: ignore[return-value]


def root_value(comm: Communicator, make: Callable[[], T]) -> T:
    """`make()` on rank 0 alone (its errors reach every rank), then its value on every rank.

    Collective. For files only rank 0 may read: a checkpoint, a plan, an output folder.
    """
    value = agree(comm, lambda: make() if comm.rank == 0 else None, name_rank=False)
    return comm.bcast(value, root=0)


def write_on_root(
    comm: Communicator, option: str, given: str | os.PathLike[str], write: Callable[[], T]
) -> T | None:
    """`write()` on rank 0 alone; collective. An OS failure stops every rank with one line.

    The line names `option` and the `given` path, the real file and a fix
    (:func:`lbtrain.outputs.writing`); under mpiexec every rank stops together.

    Returns:
        What `write` returned on rank 0, None on the other ranks.
    """

    def guarded() -> T | None:
        if comm.rank != 0:
            return None
        with writing(option, given):
            return write()

    return agree(comm, guarded, name_rank=False)
