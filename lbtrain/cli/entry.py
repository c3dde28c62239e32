"""The `lbtrain` console script: tune malloc, start MPI, then run the command line.

Kept apart from `lbtrain.cli.main` because malloc must be tuned before torch is imported,
and importing `lbtrain.cli.main` imports torch (see lbtrain/malloc.py for why and by how
much: one HybridSN CPU step went from 0.95 s to 0.39 s). Under an MPI launcher, MPI starts
before torch too (lbtrain.comm.mpi.start_mpi says why: a rank interrupted before MPI_Init
would leave the others waiting in it forever). Under torchrun nothing starts early: the
ranks meet only once torch is loaded, and torchrun's agent ends every worker when one ends.
"""

from __future__ import annotations

import signal
import sys
import time

from lbtrain.cli.launcher import launcher_rank

__all__ = ["main"]

# How long a rank other than 0 waits after a Ctrl-C for rank 0 to end the job (the same
# pause as lbtrain.cli.main's, for an interrupt while the command starts).
_ALONE_AFTER = 5.0

# Seconds an interrupted rank waits in MPI_Init for the others before giving up.
_START_LIMIT = 30


def main() -> int:
    """Run `lbtrain` with sys.argv; Ctrl-C while it starts up is one line and status 130."""
    try:
        from lbtrain.malloc import tune_malloc

        tune_malloc()
        from lbtrain.comm.launchers import MPI, LauncherError, detect_launcher

        try:
            launcher = detect_launcher()
        except LauncherError as exc:
            if launcher_rank() == 0:  # every rank finds the same: one says it
                print(f"lbtrain: error: {exc}", file=sys.stderr, flush=True)
            return 2
        if launcher == MPI:
            from lbtrain.comm.mpi import start_mpi

            try:
                start_mpi()
            except RuntimeError as exc:
                print(f"lbtrain: error: {exc}", file=sys.stderr, flush=True)
                return 2
        from lbtrain.cli.main import main as run

        return run()
    except KeyboardInterrupt:
        # Importing torch takes seconds, and parsing happens before any run: a Ctrl-C there
        # would otherwise be a long traceback. (A run catches its own, and stops every rank.)
        # Under mpiexec every rank gets it: rank 0 says it and ends the job; another rank
        # says it only if it was interrupted alone.
        return _interrupted()


def _interrupted() -> int:
    from lbtrain.comm.launchers import MPI, TORCHRUN, LauncherError, detect_launcher
    from lbtrain.comm.mpi import abort_started, start_mpi

    rank = launcher_rank()
    try:
        launcher = detect_launcher()
    except LauncherError:
        launcher = None
    if launcher == TORCHRUN:
        # torchrun starts each worker in a session of its own, so a Ctrl-C reaches only
        # torchrun, which sends it on to every worker: rank 0 says it for all of them.
        if rank == 0:
            print("lbtrain: interrupted", file=sys.stderr, flush=True)
        return 130
    try:
        if launcher == MPI:
            # Ranks that were not interrupted wait for this one in MPI_Init: meet them there,
            # so that the abort below reaches them. Should a rank never get there (one that
            # died before lbtrain ran), the alarm's default action ends this rank instead,
            # and the launcher the job, rather than a hang.
            signal.alarm(_START_LIMIT)
            try:
                start_mpi()
            except RuntimeError:
                pass  # no mpi4py: nothing to meet, nothing to abort
            signal.alarm(0)
        if rank != 0:
            time.sleep(_ALONE_AFTER)
        where = f" (rank {rank})" if rank else ""
        print(f"lbtrain: interrupted{where}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: still end the job below
    abort_started(130)  # ranks not interrupted would wait in their next collective call
    return 130
