"""This process's rank as its launcher announced it, read before MPI or torch is loaded."""

from __future__ import annotations

import os

from lbtrain.comm.launchers import TORCHRUN, LauncherError, detect_launcher

__all__ = ["launcher_rank"]

# Rank variables of MPICH/Hydra and Intel MPI, Open MPI, PMIx and Slurm, and torchrun's.
_LAUNCHER_RANK_VARIABLES = (
    "PMI_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
    "RANK",
)


def launcher_rank() -> int:
    """This process's rank as the launcher announced it, 0 when there is none.

    Read before any communicator exists, so that a message every rank would print (a
    command-line mistake, a Ctrl-C while starting up) is printed once under mpiexec or
    torchrun. Under torchrun, torchrun's RANK, even where srun started torchrun. Where the
    launchers' variables do not form one job (lbtrain.comm.launchers.detect_launcher refuses
    them), the largest of the announced ranks: 0 only for the one process that every
    launcher calls rank 0, so the refusal is printed once.
    """
    try:
        if detect_launcher() == TORCHRUN:
            return int(os.environ["RANK"])
    except LauncherError:
        pass
    # RANK=2 of 2 has no rank 0 to speak for it: the MPI launcher's rank decides, if any.
    names = _LAUNCHER_RANK_VARIABLES[:-1] if _outside_torch_world() else _LAUNCHER_RANK_VARIABLES
    ranks = [
        int(value)
        for value in (os.environ.get(name, "").strip() for name in names)
        if value.isdigit()
    ]
    return max(ranks, default=0)


def _outside_torch_world() -> bool:
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return False
    return not 0 <= rank < size
