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


class _Terminated(BaseException):  # noqa: N818 (like KeyboardInterrupt, not an error)
    """SIGTERM while lbtrain starts up (imports, MPI start): ends it as Ctrl-C does."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


def _raise(exc: BaseException) -> None:
    raise exc


def main() -> int:
    """Run `lbtrain` with sys.argv; Ctrl-C while it starts up is one line and status 130, a
    SIGTERM (a scheduler's) one line and 143."""
    # Until the command line takes signals over: the default action would kill the rank
    # with status 15 and, under mpiexec, the launcher's "BAD TERMINATION" banner.
    signal.signal(signal.SIGTERM, _terminated)
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
        from lbtrain.trainer.signals import Interrupted
    except KeyboardInterrupt:
        # Importing torch takes seconds, and parsing happens before any run: a Ctrl-C there
        # would otherwise be a long traceback. (A run catches its own, and stops every rank.)
        # Under mpiexec every rank gets it: rank 0 says it and ends the job; another rank
        # says it only if it was interrupted alone.
        return _interrupted()
    except _Terminated:
        return _interrupted(143, "terminated (SIGTERM)")
    try:
        # From here the command line reports it (one line, 143, the job ended); a run puts
        # its own handler in place while it trains, and this one back after.
        signal.signal(signal.SIGTERM, lambda signum, frame: _raise(Interrupted(signum)))
        return run()
    except KeyboardInterrupt:
        return _interrupted()  # before the command line's own handling: parsing, meeting
    except Interrupted as exc:
        return _interrupted(exc.code, "interrupted" if exc.code == 130 else "terminated (SIGTERM)")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not through interpreter exit


def _interrupted(code: int = 130, what: str = "interrupted") -> int:
    from lbtrain.comm.launchers import MPI, TORCHRUN, LauncherError, detect_launcher
    from lbtrain.comm.mpi import abort_started, start_mpi

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the abort
    rank = launcher_rank()
    try:
        launcher = detect_launcher()
    except LauncherError:
        launcher = None
    if launcher == TORCHRUN:
        # torchrun starts each worker in a session of its own, so a Ctrl-C reaches only
        # torchrun, which sends it on to every worker: rank 0 says it for all of them.
        if rank == 0:
            print(f"lbtrain: {what}", file=sys.stderr, flush=True)
        return code
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
        print(f"lbtrain: {what}{where}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: still end the job below
    abort_started(code)  # ranks not interrupted would wait in their next collective call
    return code
