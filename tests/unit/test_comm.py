"""The single-process communicator and launcher detection."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lbtrain.comm import SingleProcessCommunicator, launched_by_mpi, world_communicator


def test_world_of_one_needs_no_mpi(monkeypatch):
    for name in (
        "PMI_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "PMIX_SIZE",
        "MPI_LOCALNRANKS",
        "HYDRA_CONTROL_FD",
    ):
        monkeypatch.delenv(name, raising=False)
    assert not launched_by_mpi()
    assert isinstance(world_communicator(), SingleProcessCommunicator)


def test_plain_start_does_not_import_mpi4py():
    # In the same interpreter (one start for both): the train command line, which lists
    # every workload's options, imports no scipy (0.2 s of every rank's start).
    code = (
        "import os, sys\n"
        "for k in ('PMI_SIZE','OMPI_COMM_WORLD_SIZE','PMIX_SIZE','MPI_LOCALNRANKS',"
        "'HYDRA_CONTROL_FD'): os.environ.pop(k, None)\n"
        "from lbtrain import world_communicator; world_communicator()\n"
        "assert 'mpi4py' not in sys.modules\n"
        "from lbtrain.cli.parser import build_parser; build_parser(['train'])\n"
        "assert 'scipy' not in sys.modules, 'scipy'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_single_process_operations():
    comm = SingleProcessCommunicator()
    buffer = torch.arange(4.0)
    comm.allreduce_sum_(buffer)
    assert buffer.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert comm.allgather("x") == ["x"]
    assert comm.bcast(7) == 7
    with pytest.raises(ValueError, match="Invalid root 1"):
        comm.bcast(7, root=1)
    comm.broadcast_(buffer)
    assert buffer.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="Invalid root 2"):
        comm.broadcast_(buffer, root=2)


def test_a_rank_still_running_at_the_timeout_is_named_with_where_it_is():
    # A hang in a test on in-process ranks should say where, not only that: the late
    # rank's innermost frames are in the error's one line.
    import threading

    from lbtrain.comm import run_ranks

    release = threading.Event()

    def stuck_here() -> None:
        release.wait()

    def work(comm) -> int:
        if comm.rank == 1:
            stuck_here()
        return comm.rank

    try:
        with pytest.raises(TimeoutError) as info:
            run_ranks(2, work, timeout=0.05)
    finally:
        release.set()
    message = str(info.value)
    assert "ranks [1]" in message and "rank 1 at threading.py" in message, message
    assert "test_comm.py" in message and "in stuck_here" in message, message
    assert "\n" not in message
