"""Entry point of the `lbtrain` command: dispatch to one module per verb."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import IO, Any, NoReturn, TextIO

import lbtrain
from lbtrain.cli import balance_report, compare, env, profile, show, train, whatif
from lbtrain.cli.common import USER_ERRORS, CLIError, CollectiveError
from lbtrain.cli.launcher import launcher_rank
from lbtrain.comm import Communicator, launched_by_torchrun, world_communicator
from lbtrain.comm.base import RankLost
from lbtrain.comm.launchers import LoneRankError
from lbtrain.denormals import as_before
from lbtrain.trainer.engine import TrainingDiverged
from lbtrain.trainer.signals import Interrupted
from lbtrain.workloads import get_plugin

__all__ = ["build_parser", "main"]

VERBS = (train, profile, balance_report, show, compare, whatif, env)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per verb module.

    Args:
        argv: the command line, read ahead for `train --workload` so that the workload's own
            options are part of the parser (and of `train --help`).
    """
    parser = _Parser(
        prog="lbtrain",
        description="Load-balanced synchronous data-parallel training on heterogeneous "
        "CPU/GPU replicas. Run a subcommand with --help for its options.",
    )
    parser.add_argument("--version", action="version", version=f"lbtrain {lbtrain.__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    # The verbs that build a workload take its own options as flags: read --workload ahead.
    workload = train.workload_from_argv(list(argv or []))
    for verb in VERBS:
        if verb in (train, profile, balance_report, whatif):
            verb.add_parser(subparsers, workload)
        else:
            verb.add_parser(subparsers)
    return parser


# Whether argparse may print on this thread: ranks other than 0 parse the same command line
# silently, so a mistake is printed once. Per thread, not by swapping sys.stderr, which
# every rank shares when ranks are threads of one process (lbtrain.comm.LocalWorld).
_PARSING = threading.local()


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser (its subcommands too) that prints nothing on a quiet thread.

    A usage error is one line naming the flag and what is wrong, then where help is, not
    argparse's usage block first: `train`'s is 25 lines, which hide the one that matters.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `--epoch 3` is no `--epochs 3`: flags are spelt out, as the docs and the read-ahead
        # of --workload (train.workload_from_argv) spell them; the subcommands too.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        if not getattr(_PARSING, "quiet", False):
            super()._print_message(message, file)

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        named = re.fullmatch(r"argument (\S+): (.*)", text)
        if named and named.group(1).split("/")[0] in named.group(2):
            text = named.group(2)  # the type's message names the flag already
        self.exit(2, f"{self.prog}: error: {text}\nsee {self.prog} --help\n")


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    _PARSING.quiet = launcher_rank() != 0
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            # Named by the verb's own parser, so the hint leads to that verb's options.
            verb = _verb_parser(parser, argv) or parser
            verb.error(_unknown_workload(argv) or f"unrecognized arguments: {' '.join(extra)}")
        return args
    finally:
        _PARSING.quiet = False


def _unknown_workload(argv: list[str]) -> str | None:
    """Why the workload's flags were not known: a --workload that names no workload (its
    options could not be added), rather than "unrecognized arguments" for each of them."""
    try:
        get_plugin(train.workload_from_argv(argv))
    except ValueError as exc:
        return str(exc)
    return None


def _verb_parser(
    parser: argparse.ArgumentParser, argv: list[str]
) -> argparse.ArgumentParser | None:
    """The subcommand parser `argv` chose: its first word (the top level has no values)."""
    verb = next((arg for arg in argv if not arg.startswith("-")), None)
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        choices = getattr(action, "choices", None) or {}
        if verb in choices:
            return choices[verb]
    return None


def _error(message: object, comm: Communicator | None = None) -> None:
    prefix = f"rank {comm.rank}: " if comm is not None and comm.size > 1 else ""
    text = " ".join(str(message).split())  # one line, whatever the exception text held
    # The library names its parameter (lbtrain.comm.torchdist.choose_backend); the flag:
    text = re.sub(r"\bbackend='(\w+)'", r"--backend \1", text)
    print(f"lbtrain: error: {prefix}{text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Show warnings as one ``lbtrain: warning: message`` line, not Python's source dump."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = " ".join(str(message).split())
        print(f"lbtrain: warning: {text}", file=file or sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


# The name a failed write to standard output carries, so that its message says so.
STDOUT = "<standard output>"


class _StdoutNamer:
    """Standard output whose write failures (a full disk, /dev/full) name it; else as is."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise  # the reader left: handled quietly
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, STDOUT) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, STDOUT) from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _named_stdout() -> Iterator[None]:
    original = sys.stdout
    if isinstance(original, _StdoutNamer):  # ranks that are threads share one stdout
        yield
        return
    sys.stdout = _StdoutNamer(original)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = original


def main(argv: Sequence[str] | None = None, comm: Communicator | None = None) -> int:
    """Run the `lbtrain` command line.

    Args:
        argv: arguments without the program name; default sys.argv[1:].
        comm: communicator to use; default the job's (MPI under mpiexec, else one process).

    Returns:
        The exit status: 0 on success, 2 on a user error. Under MPI, an error on only some
        ranks aborts the whole job, so nothing is left waiting in a collective call.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = _parse(parser, argv)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return 2
    if comm is None:
        try:
            comm = world_communicator(getattr(args, "backend", "auto"))
        except (RuntimeError, ValueError) as exc:
            # Every rank finds the same: one says it (a lone rank has no other to speak).
            if launcher_rank() == 0 or isinstance(exc, LoneRankError):
                _error(exc)
            return 2
    try:
        with _one_line_warnings(), _named_stdout(), as_before():
            code = int(args.run(args, comm) or 0)
            sys.stdout.flush()  # a reader that left (`| head`) shows here, not at exit
        _close(comm)
        return code
    except BrokenPipeError:
        # The reader of stdout left (`| head`): stop quietly, as standard tools do.
        _silence_stdout()
        _abort(comm, PIPE_EXIT)
        return PIPE_EXIT
    except TrainingDiverged as exc:
        # Every rank saw the same non-finite loss at the same step: a failed run, not a usage
        # error, so status 1.
        if comm.rank == 0:
            _error(exc)
        _close(comm)
        return 1
    except CollectiveError as exc:
        # Every rank raised it together, so each can exit normally; one rank reports.
        if comm.rank == 0:
            _error(exc)
        _close(comm)
        return 2
    except (KeyboardInterrupt, Interrupted) as exc:
        # A signal outside training steps (profiling, evaluation, drawing): no traceback,
        # status 130 (SIGINT) or 143 (SIGTERM), one line for the job.
        with _deaf_to_sigterm():  # a second one must not cut the abort short
            return _signalled(comm, exc.code if isinstance(exc, Interrupted) else 130)
    except RankLost as exc:
        # Another rank vanished without a word (torchrun: killed); this rank is the one of
        # the survivors that says so (the others leave quietly), and the job ends.
        _error(exc, comm)
        _abort(comm, 1)
        return 1
    except OSError as exc:
        if exc.filename == STDOUT:
            exc = CLIError(
                f"standard output cannot be written ({exc.strerror}); send it to a file or "
                "a pipe that can take it"
            )
        _error(exc, comm)
        _abort(comm, 2)
        return 2
    except (CLIError, *USER_ERRORS) as exc:
        _error(exc, comm)
        _abort(comm, 2)
        return 2
    except Exception:
        traceback.print_exc()
        _abort(comm, 1)
        return 1


# What a shell reports for a process ended by SIGPIPE (128 + 13), as `yes | head` gives.
PIPE_EXIT = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


# mpiexec may drop an aborting rank's last output when the abort overtakes the pipe (seen in
# about 1 run in 100); a short pause after flushing lets the message reach the user.
_ABORT_GRACE = 0.5


# How long a rank other than 0 waits after a Ctrl-C for rank 0 to end the job; longer than a
# profiling step, after which rank 0 first sees the interrupt.
_ALONE_AFTER = 5.0


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


def _signalled(comm: Communicator, code: int) -> int:
    """Say it once for the job and end every rank, with `code` (130 or 143)."""
    if comm.rank != 0:
        if launched_by_torchrun():
            # torchrun alone gets a terminal's Ctrl-C and sends it to every worker (each
            # runs in a session of its own): rank 0 says it for all of them.
            _abort(comm, code)
            return code
        # A signal to the job reaches every rank: rank 0 says it once and ends the job,
        # which ends this rank during the pause. A rank interrupted alone says so after.
        time.sleep(_ALONE_AFTER)
    where = f" (rank {comm.rank})" if comm.rank else ""
    what = "interrupted" if code == 130 else "terminated (SIGTERM)"
    print(f"lbtrain: {what}{where}", file=sys.stderr, flush=True)
    _abort(comm, code)  # ranks not interrupted would wait in their next collective call
    return code


# Last: run as `python -m lbtrain.cli.main`, main() needs every name above defined.
if __name__ == "__main__":
    sys.exit(main())
