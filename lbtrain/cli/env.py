"""`lbtrain env`: the versions and hardware a bug report needs."""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import socket
import sys

import torch

import lbtrain
from lbtrain.cli.common import show_defaults
from lbtrain.comm import Communicator, detect_launcher, mpi_library_info
from lbtrain.devices import node_cores, node_layout, rank_threads
from lbtrain.parallel.batchnorm_host import describe as describe_host_kernels

__all__ = ["add_parser", "collect", "run"]

DESCRIPTION = """\
Print the versions of lbtrain, Python, torch, mpi4py and the MPI library, the launcher and
its engine, the CUDA devices, the world size, the ranks per host and the thread settings.
Paste the output into bug reports. Run it under the job's launcher to see every rank, e.g.
`mpiexec -n 2 lbtrain env` or `torchrun --nproc-per-node 2 -m lbtrain env`.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the `env` verb."""
    parser = subparsers.add_parser(
        "env",
        help="print versions, devices and threads for bug reports",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show_defaults(parser)
    parser.set_defaults(run=run)
    return parser


def launcher_line(comm: Communicator) -> str:
    """Which launcher started the job and which engine carries it, for the report."""
    launcher = detect_launcher()
    if launcher == "mpi":
        return "mpiexec (or srun): MPI"
    if launcher == "torchrun":
        backend = getattr(comm, "backend", "auto")
        return (
            "torchrun: torch.distributed, objects and CPU buffers over gloo, CUDA buffers by "
            f"--backend {backend} (auto: NCCL where every rank is on a GPU, else gloo)"
        )
    return "none: one process"


def _torch_engines() -> str:
    dist = torch.distributed
    if not dist.is_available():
        return "not built into this torch"
    engines = (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()))
    return ", ".join(f"{name} {'yes' if present else 'no'}" for name, present in engines)


def _rank_facts(comm: Communicator) -> dict[str, object]:
    layout = node_layout(comm)
    cuda = torch.cuda.is_available()
    return {
        "rank": comm.rank,
        "host": layout.host,
        "local_rank": layout.local_rank,
        "local_size": layout.local_size,
        "cores": node_cores(),
        "default_threads": rank_threads(comm, layout),
        "torch_threads": torch.get_num_threads(),
        "cuda_devices": [
            f"cuda:{i} {torch.cuda.get_device_name(i)} "
            f"({torch.cuda.get_device_properties(i).total_memory / 2**30:.1f} GiB, "
            f"sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
            for i in range(torch.cuda.device_count() if cuda else 0)
        ],
        "batchnorm": describe_host_kernels(),
    }


def collect(comm: Communicator) -> list[tuple[str, str]]:
    """The lines of the report as (label, value) pairs; collective (one allgather)."""
    ranks = comm.allgather(_rank_facts(comm))
    answers = [str(facts["batchnorm"]) for facts in ranks]
    items: list[tuple[str, str]] = [
        ("lbtrain", lbtrain.__version__),
        ("Python", sys.version.split()[0]),
        ("Platform", platform.platform()),
        ("torch", torch.__version__),
        ("torch CUDA build", str(torch.version.cuda)),
        ("CUDA available", str(torch.cuda.is_available())),
    ]
    items += list(mpi_library_info().items())
    items += [
        ("launcher", launcher_line(comm)),
        ("torch.distributed", _torch_engines()),
        ("world size", str(comm.size)),
        ("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "(unset)")),
        # MPICH's progress thread: lets gradient allreduces move while backward computes.
        ("MPIR_CVAR_ASYNC_PROGRESS", os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "(unset)")),
        ("matplotlib", "yes" if importlib.util.find_spec("matplotlib") else "no (--plot off)"),
        # Each rank's answer (a node without a compiler runs torch's kernels: the same sums).
        ("BatchNorm on CPU ranks", _same_or_by_rank(answers)),
    ]
    for facts in ranks:
        devices = ", ".join(facts["cuda_devices"]) or "none"
        items.append(
            (
                f"rank {facts['rank']}",
                f"host {facts['host']} (local rank {facts['local_rank']} of "
                f"{facts['local_size']}), cores {facts['cores']}, default threads "
                f"{facts['default_threads']}, torch threads {facts['torch_threads']}, "
                f"CUDA devices: {devices}"
                + (f", BatchNorm on CPU: {facts['batchnorm']}" if _differ(answers) else ""),
            )
        )
    return items


def _differ(answers: list[str]) -> bool:
    """Whether the ranks run different passes (compiled ones in different caches do not)."""
    return len({"compiled" if a.startswith("compiled") else a for a in answers}) > 1


def _same_or_by_rank(answers: list[str]) -> str:
    return "differs by rank (below)" if _differ(answers) else answers[0]


def run(args: argparse.Namespace, comm: Communicator) -> int:
    """Print the environment on rank 0."""
    items = collect(comm)
    if comm.rank == 0:
        width = max(len(label) for label, _ in items)
        for label, value in items:
            print(f"{label + ':':<{width + 1}} {value}")
        if comm.size == 1:
            print(
                f"(single process on {socket.gethostname()}; run under mpiexec or torchrun to "
                "see every rank)"
            )
    return 0
