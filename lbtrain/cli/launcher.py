"""This process's rank as the MPI launcher announced it, read before MPI or torch is loaded."""

from __future__ import annotations

import os

__all__ = ["launcher_rank"]

# Rank variables of MPICH/Hydra and Intel MPI, Open MPI, PMIx and Slurm.
_LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    """This process's rank as the launcher announced it, 0 when there is none.

    Read before any communicator exists, so that a message every rank would print (a
    command-line mistake, a Ctrl-C while starting up) is printed once under mpiexec.
    """
    for name in _LAUNCHER_RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0
