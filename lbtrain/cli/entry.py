"""The `lbtrain` command line's one entry: `main()`, and how each exception ends it (EXIT_CODES).

The console script (`lbtrain`) and `python -m lbtrain` call `main()`; tests and programs that
embed the command line call `main(argv)` or `main(argv, comm)`. Nothing heavy is imported
here at import time: the console script tunes malloc before torch is imported (see
lbtrain/malloc.py for why and by how much: one HybridSN CPU step went from 0.95 s to
0.39 s), and under an MPI launcher starts MPI before torch too (lbtrain.comm.mpi.start_mpi
says why: a rank interrupted before MPI_Init would leave the others waiting in it forever).
Under torchrun nothing starts early: the ranks meet only once torch is loaded, and
torchrun's agent ends every worker when one ends. So classes of modules that import torch
are named in EXIT_CODES, not imported.
"""

from __future__ import annotations

import contextlib
import enum
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lbtrain.comm.base import RESTART_EXIT, RankLost
from lbtrain.comm.launchers import (
    MPI,
    TORCHRUN,
    LauncherError,
    LoneRankError,
    detect_launcher,
    launcher_rank,
    restarts_left,
)

if TYPE_CHECKING:
    from lbtrain.comm import Communicator

__all__ = ["EXIT_CODES", "PIPE_EXIT", "ExitCode", "Report", "main"]

# What a shell reports for a process ended by SIGPIPE (128 + 13), as `yes | head` gives.
PIPE_EXIT = 141

# How long a rank other than 0 waits after a signal for rank 0 to end the job; longer than
# a profiling step, after which rank 0 first sees the interrupt.
_ALONE_AFTER = 5.0

# Seconds an interrupted rank waits in MPI_Init for the others before giving up.
_START_LIMIT = 30

# mpiexec may drop an aborting rank's last output when the abort overtakes the pipe (seen in
# about 1 run in 100); a short pause after flushing lets the message reach the user.
_ABORT_GRACE = 0.5


class _Terminated(BaseException):  # noqa: N818 (like KeyboardInterrupt, not an error)
    """SIGTERM while lbtrain starts up (imports, MPI start): ends it as Ctrl-C does.

    lbtrain.trainer.signals.Interrupted takes over once torch is imported (its module
    imports torch).
    """

    code = 143


class _NoMPI(RuntimeError):
    """mpi4py cannot be imported on this rank's node, under an MPI launcher."""


class Report(enum.Enum):
    """Who says what when an exception ends the command.

    Once the job is formed, every report but ONCE then ends every rank (the communicator's
    abort), so that none is left waiting in a collective call; before, only a signal's.
    """

    QUIET = "nothing is said: the reader of standard output left"
    ONCE = "every rank raised it together: rank 0 says it, and each rank exits"
    RANK = (
        "this rank says it, naming itself; before the job is formed, rank 0 says it, as "
        "every rank reads the same launch and command line"
    )
    EVERY = "every process says it: none can speak for another"
    SIGNAL = "said once for the job"
    TRACEBACK = "this rank prints its traceback"


@dataclass(frozen=True)
class ExitCode:
    """One row of EXIT_CODES: the exceptions it covers, the exit status and the report.

    Attributes:
        raised: exception classes, or "module:Name" for those whose module imports torch.
        status: the exit status; None for a signal's own (`code`: 130 SIGINT, 143 SIGTERM).
        report: who says what (Report).
    """

    raised: tuple[type[BaseException] | str, ...]
    status: int | None
    report: Report


# How an exception ends the command: the first row that covers it (subclasses first). Each
# status is in docs/cli.md's table of exit codes (tests/unit/test_cli_exit_codes.py checks).
EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode((BrokenPipeError,), PIPE_EXIT, Report.QUIET),
    # A non-finite loss at the same step on every rank: a failed run, not a usage error.
    ExitCode(("lbtrain.trainer.engine:TrainingDiverged",), 1, Report.ONCE),
    ExitCode(("lbtrain.collective:CollectiveError",), 2, Report.ONCE),
    ExitCode((KeyboardInterrupt,), 130, Report.SIGNAL),
    ExitCode(("lbtrain.trainer.signals:Interrupted", _Terminated), None, Report.SIGNAL),
    # Each process a world of its own; a node without mpi4py, where rank 0's may have it.
    ExitCode((LoneRankError, _NoMPI), 2, Report.EVERY),
    # Another rank vanished (torchrun: killed); this one of the survivors says so.
    ExitCode((RankLost,), RESTART_EXIT, Report.RANK),
    # Bad input: lbtrain.collective.USER_ERRORS and the command line's own.
    ExitCode(("lbtrain.cli.common:CLIError", ValueError, RuntimeError, OSError), 2, Report.RANK),
    ExitCode((Exception,), 1, Report.TRACEBACK),
)


def main(argv: Sequence[str] | None = None, comm: Communicator | None = None) -> int:
    """Run the `lbtrain` command line; its exit status (EXIT_CODES, docs/cli.md).

    Called with no arguments (the console script, `python -m lbtrain`), this is the process
    starting: it reads sys.argv, tunes malloc and starts MPI before torch is imported, and
    a Ctrl-C from then on is one line and status 130, a SIGTERM (a scheduler's) 143. Called
    with `argv`, it runs in this process as it is.

    Args:
        argv: arguments without the program name; default sys.argv[1:].
        comm: communicator to use; default the job's (MPI under mpiexec, torch.distributed
            under torchrun, else one process).

    Returns:
        The exit status: 0 on success, 2 on a user error. Under MPI, an error on only some
        ranks aborts the whole job, so nothing is left waiting in a collective call.
    """
    if argv is None and comm is None:
        return _start(sys.argv[1:])
    return _run(sys.argv[1:] if argv is None else list(argv), comm)


def _start(argv: list[str]) -> int:
    """Start this process as a rank of the job, then run the command line."""
    # Until the command line takes signals over: the default action would kill the rank
    # with status 15 and, under mpiexec, the launcher's "BAD TERMINATION" banner.
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        signal.signal(signal.SIGTERM, _raising(lambda signum: _Terminated()))
    try:
        try:
            _prepare()
            from lbtrain.trainer.signals import Interrupted
        except (KeyboardInterrupt, _Terminated, LauncherError, _NoMPI) as exc:
            # Importing torch takes seconds: a Ctrl-C there would otherwise be a long
            # traceback. Under mpiexec every rank gets it: rank 0 says it and ends the job.
            return _ended(exc, None)
        # From here the command line reports it (one line, 143, the job ended); a run puts
        # its own handler in place while it trains, and this one back after.
        if main_thread:
            signal.signal(signal.SIGTERM, _raising(Interrupted))
        try:
            return _run(argv, None)
        except (KeyboardInterrupt, Interrupted) as exc:
            return _ended(exc, None)  # before the run's own handling: parsing, meeting
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not through interpreter exit


def _prepare() -> None:
    """Tune malloc, read the launcher and start MPI under an MPI one, all before torch.

    Raises:
        LauncherError: the launchers' variables do not form one job.
        _NoMPI: an MPI launcher, but no mpi4py.
    """
    from lbtrain.malloc import tune_malloc

    tune_malloc()
    if detect_launcher() == MPI:
        from lbtrain.comm.mpi import start_mpi

        try:
            start_mpi()
        except RuntimeError as exc:
            raise _NoMPI(str(exc)) from exc


def _run(argv: list[str], comm: Communicator | None) -> int:
    """Parse `argv`, form the job (unless `comm` is given) and run the verb."""
    from lbtrain.cli.parser import build_parser, parse
    from lbtrain.cli.streams import named_stdout, one_line_warnings
    from lbtrain.comm import world_communicator
    from lbtrain.denormals import as_before

    parser = build_parser(argv)
    args = parse(parser, argv, quiet=launcher_rank() != 0)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return 2
    if comm is None:
        try:
            comm = world_communicator(getattr(args, "backend", "auto"))
        except (RuntimeError, ValueError) as exc:
            return _ended(exc, None)
    try:
        with one_line_warnings(), named_stdout(), as_before():
            code = int(args.run(args, comm) or 0)
            sys.stdout.flush()  # a reader that left (`| head`) shows here, not at exit
        _close(comm)
        return code
    except BaseException as exc:  # EXIT_CODES says which end the command; others go on
        return _ended(exc, comm)


def exit_code_for(exc: BaseException) -> ExitCode | None:
    """The first row of EXIT_CODES that covers `exc`, None if none does (SystemExit).

    A class named by module is looked up only where its module is loaded: an instance of it
    cannot exist otherwise, and importing it would import torch.
    """
    for row in EXIT_CODES:
        for raised in row.raised:
            if isinstance(raised, str):
                module, _, name = raised.partition(":")
                loaded = sys.modules.get(module)
                raised = getattr(loaded, name) if loaded is not None else None
            if raised is not None and isinstance(exc, raised):
                return row
    return None


def _ended(exc: BaseException, comm: Communicator | None) -> int:
    """Report `exc` as its row of EXIT_CODES says and end the job; the exit status.

    `comm` is None before the job is formed: nothing is ended then but a signal's job.
    """
    row = exit_code_for(exc)
    if row is None:
        raise exc
    status = int(getattr(exc, "code", 0)) if row.status is None else row.status
    if row.report is Report.SIGNAL:
        with _deaf_to_sigterm():  # a second signal must not cut the abort short
            return _signalled(status, comm)
    rank = launcher_rank() if comm is None else comm.rank
    hint = restart_hint(status)
    if row.report is Report.QUIET:
        from lbtrain.cli.streams import silence_stdout

        silence_stdout()
    elif row.report is Report.TRACEBACK:
        traceback.print_exception(exc)
        if hint:
            _error(hint, comm)
    elif row.report is Report.EVERY or (row.report is Report.RANK and comm is not None):
        _error(_message(exc) + _after(hint), comm)
    elif rank == 0:
        _error(_message(exc) + _after(hint))
    if comm is not None and row.report is Report.ONCE:
        _close(comm)  # every rank got here together
    elif comm is not None:
        _abort(comm, status)
    return status


def restart_hint(status: int, environ: Mapping[str, str] | None = None) -> str:
    """Under torchrun's elastic agent with no restart left, for a failure that is not the
    user's (status 1 or 75): how to go on; else ""."""
    if status not in (1, RESTART_EXIT) or restarts_left(environ) != 0:
        return ""
    return (
        "torchrun's agent has no restart left (--max-restarts): run the same command again; "
        "with --resume auto it continues from the run's newest checkpoint"
    )


def _after(hint: str) -> str:
    return f"; {hint}" if hint else ""


def _message(exc: BaseException) -> str:
    from lbtrain.cli.streams import STDOUT

    if isinstance(exc, OSError) and exc.filename == STDOUT:
        return (
            f"standard output cannot be written ({exc.strerror}); send it to a file or a pipe "
            "that can take it"
        )
    return str(exc)


def _error(message: object, comm: Communicator | None = None) -> None:
    prefix = f"rank {comm.rank}: " if comm is not None and comm.size > 1 else ""
    text = " ".join(str(message).split())  # one line, whatever the exception text held
    # The library names its parameter (lbtrain.comm.torchdist.choose_backend); the flag:
    text = re.sub(r"\bbackend='(\w+)'", r"--backend \1", text)
    print(f"lbtrain: error: {prefix}{text}", file=sys.stderr, flush=True)


def _signalled(code: int, comm: Communicator | None) -> int:
    """Say once for the job that a signal ended it, and end every rank with `code`.

    A signal to the job reaches every rank: rank 0 says it once and ends the job, which
    ends the others during their pause; a rank interrupted alone says so after it. Before
    the job is formed (`comm` None), the launcher's rank speaks, and under an MPI launcher
    this rank first meets the others in MPI_Init, so that the end reaches them.
    """
    launcher = _launcher()
    rank = launcher_rank() if comm is None else comm.rank
    if launcher == TORCHRUN and rank != 0:
        # torchrun alone gets a terminal's Ctrl-C and sends it to every worker (each runs in
        # a session of its own): rank 0 says it for all of them.
        _end_job(comm, code)
        return code
    try:
        if comm is None and launcher == MPI:
            _meet_in_mpi_init()
        if rank != 0:
            time.sleep(_ALONE_AFTER)
        where = f" (rank {rank})" if rank else ""
        what = "interrupted" if code == 130 else "terminated (SIGTERM)"
        print(f"lbtrain: {what}{where}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: still end the job below
    _end_job(comm, code)  # ranks not interrupted would wait in their next collective call
    return code


def _launcher() -> str | None:
    try:
        return detect_launcher()
    except LauncherError:
        return None


def _meet_in_mpi_init() -> None:
    """Ranks that were not interrupted wait for this one in MPI_Init: meet them there.

    Should a rank never get there (one that died before lbtrain ran), the alarm's default
    action ends this rank instead, and the launcher the job, rather than a hang.
    """
    from lbtrain.comm.mpi import start_mpi

    signal.alarm(_START_LIMIT)
    try:
        start_mpi()
    except RuntimeError:
        pass  # no mpi4py: nothing to meet, nothing to abort
    signal.alarm(0)


def _end_job(comm: Communicator | None, code: int) -> None:
    if comm is not None:
        _abort(comm, code)
        return
    from lbtrain.comm.mpi import abort_started

    abort_started(code, grace=_ABORT_GRACE)  # as `_abort`: this rank's line leaves first


def _abort(comm: Communicator, code: int) -> None:
    """End every rank of a multi-rank job, after this rank's message has left."""
    if comm.size > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(_ABORT_GRACE)
        comm.abort(code)


def _close(comm: Communicator) -> None:
    """Release the engine's groups where every rank got here together (torch.distributed's;
    left to interpreter exit, gloo can abort the process). Not on paths where some ranks
    may still be inside a collective: destroying then could hang them."""
    close = getattr(comm, "close", None)
    if close is not None:
        close()


def _raising(make: Callable[[int], BaseException]) -> Callable[[int, object], None]:
    """A signal handler that raises `make(signum)`."""

    def handler(signum: int, frame: object) -> None:
        raise make(signum)

    return handler


@contextlib.contextmanager
def _deaf_to_sigterm() -> Iterator[None]:
    """Ignore SIGTERM (on the main thread, where handlers live) and restore it after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
