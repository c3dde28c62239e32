"""Launcher detection and the torch.distributed engine, in-process.

Which launcher started a process is read from its environment (lbtrain.comm.launchers), so
every case, good and bad, is an environment set here with monkeypatch. The torch.distributed
communicator runs on a gloo group of one rank in this process; several ranks run under
torchrun in tests/mpi (exactness, `lbtrain train`, faults).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from lbtrain.cli.entry import main
from lbtrain.comm import (
    LauncherError,
    RankLost,
    SingleProcessCommunicator,
    TorchDistCommunicator,
    detect_launcher,
    world_communicator,
)
from lbtrain.comm.launchers import launcher_rank
from lbtrain.comm.torchdist import choose_backend
from tests.fixtures.faulty_runs import faulty
from tests.mpi.scripts.comm_ops import check_ops

LAUNCH_VARIABLES = (
    "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD",
    "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID",
    "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip


def torchrun_env(rank: int = 0, size: int = 2, local: int | None = None) -> dict[str, str]:
    """What `torchrun --nproc-per-node size --standalone` sets (the launch's part of it)."""
    return {
        "TORCHELASTIC_RUN_ID": "test-run", "RANK": str(rank), "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(size if local is None else local),
        "MASTER_ADDR": "localhost", "MASTER_PORT": "29500",
    }  # fmt: skip


@pytest.fixture
def launched(monkeypatch):
    """launched({...}): this process's launch environment is exactly those variables."""

    def launch(variables: dict[str, str]) -> None:
        for name in LAUNCH_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    launch({})
    return launch


def test_the_launcher_is_read_from_the_environment():
    assert detect_launcher({}) is None
    assert detect_launcher({"PMI_SIZE": "3", "PMI_RANK": "0"}) == "mpi"
    assert detect_launcher(torchrun_env()) == "torchrun"
    # Kubernetes' PyTorchJob sets env:// variables without torchrun: the same engine.
    assert detect_launcher({k: v for k, v in torchrun_env().items() if "ELASTIC" not in k}) == (
        "torchrun"
    )
    # srun (PMI) starting one torchrun per node, 2 nodes of 4: torchrun is the launcher.
    nested = {**torchrun_env(5, 8, local=4), "PMI_SIZE": "2", "PMI_RANK": "1"}
    assert detect_launcher(nested) == "torchrun"


@pytest.mark.parametrize(
    ("variables", "needles"),
    [
        # mpiexec starting torchrun --standalone twice: two worlds of 2 that never meet.
        ({**torchrun_env(), "PMI_SIZE": "2"}, ["PMI_SIZE=2", "TORCHELASTIC_RUN_ID", "mpiexec -n"]),
        # A shell's leftover RANK and WORLD_SIZE under mpiexec.
        (
            {
                "RANK": "0",
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "h",
                "MASTER_PORT": "1",
                "PMI_SIZE": "2",
            },
            ["launched by both an MPI launcher (PMI_SIZE=2) and torchrun (RANK=0"],
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2"},
            ["MASTER_ADDR, MASTER_PORT are not", "torchrun --nproc-per-node N -m lbtrain"],
        ),
        ({"TORCHELASTIC_RUN_ID": "x"}, ["RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not"]),
        ({**torchrun_env(), "RANK": "2"}, ["RANK=2 with WORLD_SIZE=2", "[0, 1]"]),
        ({**torchrun_env(), "WORLD_SIZE": "two"}, ["WORLD_SIZE='two' is not a whole number"]),
        ({**torchrun_env(), "MASTER_PORT": "70000"}, ["MASTER_PORT=70000 is not a TCP port"]),
    ],
    ids=[
        "mpiexec-torchrun",
        "leftover-rank",
        "no-rendezvous",
        "elastic-only",
        "rank-range",
        "size-word",
        "port",
    ],  # fmt: skip
)
def test_launches_that_form_no_job_are_one_line_with_the_fix(variables, needles):
    with pytest.raises(LauncherError) as info:
        detect_launcher(variables)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_world_communicator_refuses_bad_launches_and_backends(launched):
    launched({"RANK": "1", "WORLD_SIZE": "2"})
    with pytest.raises(LauncherError, match="MASTER_ADDR, MASTER_PORT are not"):
        world_communicator()
    launched(torchrun_env(0, 1))  # torchrun --nproc-per-node 1: nothing to meet
    assert isinstance(world_communicator("nccl"), SingleProcessCommunicator)
    with pytest.raises(ValueError, match="backend='mpi' is not one of 'auto', 'gloo', 'nccl'"):
        world_communicator("mpi")
    launched({"PMI_SIZE": "2"})
    with pytest.raises(ValueError, match="backend='gloo' picks torch.distributed's transport"):
        world_communicator("gloo")  # refused before MPI starts


def test_launcher_rank_prints_once_under_torchrun_and_mixed_launches(launched):
    launched(torchrun_env(1))
    assert launcher_rank() == 1
    # A refused mix (mpiexec -n 2 torchrun --standalone): 0 only where both launchers say 0.
    launched({**torchrun_env(1), "PMI_SIZE": "2", "PMI_RANK": "0"})
    assert launcher_rank() == 1
    launched({**torchrun_env(0), "PMI_SIZE": "2", "PMI_RANK": "1"})
    assert launcher_rank() == 1
    launched({**torchrun_env(0), "PMI_SIZE": "2", "PMI_RANK": "0"})
    assert launcher_rank() == 0
    # srun starting torchrun per node: torchrun's RANK, whatever node srun numbered 0.
    launched({**torchrun_env(0, 8, local=4), "PMI_SIZE": "2", "PMI_RANK": "1"})
    assert launcher_rank() == 0
    launched({"PMI_RANK": "0"})
    assert launcher_rank() == 0
    # A stale RANK beyond WORLD_SIZE under mpiexec: the MPI rank decides, so one rank says it.
    launched({"PMI_SIZE": "2", "PMI_RANK": "1", "RANK": "2", "WORLD_SIZE": "2"})
    assert launcher_rank() == 1


def test_a_bad_launch_is_one_line_printed_by_rank_0_only(launched, capsys):
    launched({"RANK": "0", "WORLD_SIZE": "2"})
    assert main(["env"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lbtrain: error: torchrun's variables"), lines
    launched({"RANK": "1", "WORLD_SIZE": "2"})
    assert main(["env"]) == 2
    assert capsys.readouterr().err == ""
    # A rank outside the world: no rank 0 would say it, so this one does.
    launched(torchrun_env(rank=2, size=2))
    assert main(["env"]) == 2
    assert "RANK=2 with WORLD_SIZE=2" in capsys.readouterr().err


def test_a_launcher_announcing_more_ranks_than_mpi_sees_is_refused(launched):
    """mpi4py built against another MPI than the launcher's: every process would be a
    world of one, train alone and exit 0."""
    import subprocess
    import sys

    # Rank 1 says it too: each process is a world of its own, with no rank 0 to speak.
    launched({"PMI_SIZE": "2", "PMI_RANK": "1"})
    result = subprocess.run([sys.executable, "-m", "lbtrain", "env"], capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 2
    assert "lbtrain: error: PMI_SIZE=2: the launcher started 2 ranks, but MPI sees this" in (
        result.stderr
    ), result.stderr
    assert "for a run of one process, unset that variable" in result.stderr


@pytest.mark.parametrize(
    ("requested", "devices", "nccl", "expected"),
    [
        ("auto", ["cuda:0", "cuda:1"], True, "nccl"),
        ("auto", ["cuda:0", "cpu", "cpu"], True, "gloo"),
        ("auto", ["cuda:0", "cuda:1"], False, "gloo"),
        ("auto", ["cpu", "cpu"], True, "gloo"),
        ("gloo", ["cuda:0", "cuda:1"], True, "gloo"),
        ("nccl", ["cuda:0", "cuda:0"], True, "nccl"),
    ],
)
def test_the_transport_follows_every_rank_s_device(requested, devices, nccl, expected):
    assert choose_backend(requested, devices, nccl) == expected


def test_nccl_with_a_cpu_rank_or_without_nccl_names_the_rank_and_the_fix():
    with pytest.raises(ValueError) as info:
        choose_backend("nccl", ["cuda:0", "cuda:1", "cpu"])
    assert str(info.value).startswith(
        "backend='nccl' needs a CUDA device on every rank, but rank 2 is on cpu; use "
        "backend='gloo' or backend='auto'"
    )
    with pytest.raises(ValueError, match="built without NCCL"):
        choose_backend("nccl", ["cuda:0"], nccl_available=False)


@pytest.fixture
def gloo_world():
    """torch.distributed initialised as a gloo world of one rank in this process."""
    assert not dist.is_initialized(), "a test left torch.distributed initialised"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_every_operation_on_a_gloo_world(gloo_world):
    comm = TorchDistCommunicator()
    assert (comm.rank, comm.size, comm.transport, comm.thread_safe) == (0, 1, None, True)
    assert check_ops(comm) == "comm ops ok on 1 ranks (TorchDistCommunicator)"
    assert comm.transport == "gloo" and not comm.cuda_aware  # chosen at the first tensor
    with pytest.raises(ValueError, match="Invalid root 1"):
        comm.bcast(None, root=1)
    assert comm.use_device(torch.device("cpu")) == "gloo"


def test_backend_nccl_on_a_cpu_rank_is_one_line_naming_the_flag(gloo_world, tmp_path, capsys):
    comm = TorchDistCommunicator(backend="nccl")
    args = [*faulty("--epochs", "1", "--out", str(tmp_path / "run")), "--backend", "nccl"]
    assert main(args, comm=comm) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "lbtrain: error: --backend nccl needs a CUDA device on every rank, but rank 0 is on "
        "cpu; use --backend gloo or --backend auto (gloo for a CPU+GPU mix), or put every rank "
        "on a GPU"
    ], err
    assert not (tmp_path / "run" / "profiles.json").exists()


def test_a_vanished_peer_is_reported_by_one_survivor_and_other_errors_pass(gloo_world):
    store = dist.HashStore()
    first, second = TorchDistCommunicator(store=store), TorchDistCommunicator(store=store)
    second._rank = 2  # another survivor of the same job
    lost = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:3500: Connection reset by peer")
    with pytest.raises(RankLost, match="lost contact with another rank"):
        with first._guard():
            raise lost
    assert second._claim() == 75  # the key is taken: this one leaves quietly, "restart me"
    store.set("abort", "130:1")  # a rank that aborted with its message left its status
    assert first._claim() == 130
    with pytest.raises(RankLost):  # no store: nobody to agree with, so it says it
        with TorchDistCommunicator()._guard():
            raise lost
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        with first._guard():
            raise RuntimeError("unsupported dtype")


def test_lbtrain_env_names_the_launcher(launched):
    from lbtrain.cli.env import launcher_line

    comm = SingleProcessCommunicator()
    assert launcher_line(comm) == "none: one process"
    launched({"PMI_SIZE": "2"})
    assert launcher_line(comm).startswith("mpiexec")
    launched(torchrun_env())
    assert launcher_line(comm).startswith("torchrun: torch.distributed")


def test_under_torchrun_the_gpu_index_is_local_rank(launched):
    from lbtrain.devices import assign_devices

    comm = SingleProcessCommunicator()
    assert assign_devices(comm, "cuda", cuda_count=2).device == "cuda:0"  # host-based
    # Two torchrun agents on one host, each with its own CUDA_VISIBLE_DEVICES: this worker
    # is its agent's second; torch's convention puts it on cuda:1 of what it sees.
    launched({**torchrun_env(0, 1), "LOCAL_RANK": "1"})
    assert assign_devices(comm, "cuda", cuda_count=2).device == "cuda:1"
    assert assign_devices(comm, "auto", cuda_count=1).device == "cpu"  # no GPU left for it
    launched({**torchrun_env(1, 2), "LOCAL_RANK": "1"})  # describes another world than comm's
    assert assign_devices(comm, "cuda", cuda_count=2).device == "cuda:0"


def test_close_destroys_the_groups_lbtrain_made_and_leaves_a_callers_alone():
    """Left to interpreter exit, gloo's threads can abort the process; the command line closes
    the groups torch_world initialised, never those its caller did."""
    assert not dist.is_initialized(), "a test left torch.distributed initialised"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        comm = TorchDistCommunicator()
        comm.close()  # the caller's group
        assert dist.is_initialized()
        comm.owns_groups = True  # as torch_world marks the group it initialised
        comm.close()
        assert not dist.is_initialized()
        comm.close()  # twice is harmless
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_an_elastic_restart_on_the_agents_shared_store_is_warned_of():
    from lbtrain.comm.launchers import shared_store_hazard

    elastic = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "2"}
    line = shared_store_hazard(elastic)
    assert line is not None and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in line
    assert "--max-restarts 2" in line and "\n" not in line
    # No restarts, a store per round, or no agent: nothing to say.
    assert shared_store_hazard({**elastic, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None
    assert shared_store_hazard({**elastic, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert shared_store_hazard({}) is None
