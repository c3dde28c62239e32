"""Run `lbtrain` on N in-process ranks (threads over `lbtrain.comm.LocalWorld`).

For the logic that only needs "several ranks agree": bad input stopping every rank with one
line, zero shares, re-planning, resume, evaluation shares. A run takes a fraction of a
second instead of an `mpiexec` start that imports torch on every rank. What only a real
MPI job shows (aborts of processes, signals, the launcher's output) stays in tests/mpi/.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from unittest import mock

from lbtrain.cli.entry import main
from lbtrain.comm import run_ranks
from lbtrain.comm.local import current_rank

__all__ = ["Outcome", "lbtrain_ranks"]


@dataclass
class Outcome:
    """How an in-process job ended: each rank's status and everything the ranks printed."""

    codes: list[int]
    stdout: str
    stderr: str
    aborted: bool

    @property
    def code(self) -> int:
        """The job's exit status as mpiexec reports it: the abort's, else the worst rank's."""
        return max(self.codes, key=lambda code: (code != 0, code))

    def output(self) -> str:
        return f"codes {self.codes}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if "error:" in line]


def lbtrain_ranks(ranks: int, *argv: str, timeout: float = 120) -> Outcome:
    """`mpiexec -n ranks lbtrain argv...`, with ranks as threads of this process.

    A collective that waits more than `timeout` seconds fails the run, so a hang is a failed
    test, not a frozen suite. The ranks see no GPU (as under CUDA_VISIBLE_DEVICES=''): they
    are threads of one process, where `--devices auto` on a machine with a GPU would put
    rank 0 on it, and the tests read CPU ranks' figures.
    """
    stdout, stderr = io.StringIO(), io.StringIO()
    # Each thread is the rank its launcher variable (PMI_RANK) would name in a real job, so
    # a command-line mistake is printed once, by rank 0, as under mpiexec.
    as_launched = mock.patch("lbtrain.cli.entry.launcher_rank", lambda: current_rank() or 0)
    no_gpu = mock.patch("torch.cuda.is_available", lambda: False)
    with (
        as_launched,
        no_gpu,
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        results = run_ranks(ranks, lambda comm: main(list(argv), comm=comm), timeout=timeout)
    codes, aborted = [], False
    for result in results:
        if result.aborted:
            aborted = True
            codes.append(result.error.code)  # type: ignore[union-attr]
        elif isinstance(result.error, SystemExit):
            codes.append(int(result.error.code or 0))
        elif result.error is not None:
            raise result.error  # a bug the CLI let through: show its traceback
        else:
            codes.append(int(result.value))
    return Outcome(codes, stdout.getvalue(), stderr.getvalue(), aborted)
