"""Which launcher started this process, read from the environment before MPI or torch loads.

Two engines can carry a job: MPI (mpiexec, mpirun, srun with PMI) and torch.distributed
(torchrun, or anything that sets torch's env:// variables, such as Kubernetes' PyTorchJob).
Each launcher announces itself, and this process's rank, through variables in every process
it starts; this module reads them and nothing else, so the console script can decide before
importing anything heavy (MPI must start before torch under an MPI launcher:
lbtrain.comm.mpi.start_mpi) and print once a message every rank would (`launcher_rank`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "BACKENDS",
    "LauncherError",
    "LoneRankError",
    "announced_by",
    "check_backend",
    "detect_launcher",
    "launched_by_mpi",
    "launched_by_torchrun",
    "launcher_rank",
    "mpi_world_size",
    "restarts_left",
    "shared_store_hazard",
    "torchrun_local_rank",
]

# Variables that MPICH/Hydra, Open MPI, Intel MPI, Slurm's PMI and PMIx set in every rank.
MPI_VARIABLES = (
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_SIZE",
    "MPI_LOCALNRANKS",
    "HYDRA_CONTROL_FD",
)
# Rank variables of MPICH/Hydra and Intel MPI, Open MPI, PMIx and Slurm, and torchrun's.
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK")
# Of the MPI variables, the ones that hold the MPI world's size.
_MPI_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
# Any of these says torch's env:// launch: torchrun sets all of them and more (LOCAL_RANK,
# LOCAL_WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RUN_ID, MASTER_ADDR, MASTER_PORT, ...).
_TORCH_VARIABLES = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE")
# What env:// needs to meet the other ranks.
RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

MPI, TORCHRUN = "mpi", "torchrun"

# torch.distributed's transports for CUDA buffers (lbtrain.comm.torchdist.choose_backend).
BACKENDS = ("auto", "gloo", "nccl")


class LauncherError(RuntimeError):
    """The environment names no launcher consistently (one line, with the fix)."""


class LoneRankError(LauncherError):
    """MPI sees one process where the launcher announced more: every process is told, since
    each is a world of its own and no rank 0 speaks for the others."""


def check_backend(backend: str) -> str:
    """`backend` if it is one of BACKENDS, else ValueError naming them."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
    return backend


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """True when an MPI launcher (mpiexec, mpirun, srun with PMI) started this process."""
    env = _env(environ)
    return any(name in env for name in MPI_VARIABLES)


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """True when torchrun, or another launcher of torch's env:// variables, started it.

    Any of TORCHELASTIC_RUN_ID, RANK or WORLD_SIZE set (not empty) counts, so that a launch
    missing the rest is reported (`detect_launcher`) instead of quietly running one process
    per rank.
    """
    env = _env(environ)
    return any(env.get(name, "").strip() for name in _TORCH_VARIABLES)


def mpi_world_size(environ: Mapping[str, str] | None = None) -> int | None:
    """The MPI world's size as the launcher announced it, None when it did not."""
    said = announced_by(environ)
    return int(said.partition("=")[2]) if said else None


def announced_by(environ: Mapping[str, str] | None = None) -> str:
    """The variable that announced the MPI world's size, as NAME=VALUE ('' if none)."""
    env = _env(environ)
    for name in _MPI_SIZE_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return f"{name}={value}"
    return ""


def _whole(env: Mapping[str, str], name: str) -> int:
    value = env[name].strip()
    if not value.isdigit():
        raise LauncherError(
            f"{name}={env[name]!r} is not a whole number; torchrun sets it, so launch with "
            "`torchrun --nproc-per-node N -m lbtrain ...` or set it to this process's "
            f"{'rank' if name == 'RANK' else 'value'}"
        )
    return int(value)


def torchrun_world(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(rank, world size) from torch's env:// variables, checked; LauncherError if unusable."""
    env = _env(environ)
    missing = [name for name in RENDEZVOUS_VARIABLES if not env.get(name, "").strip()]
    if missing:
        names = (*_TORCH_VARIABLES, *RENDEZVOUS_VARIABLES)
        given = [name for name in names if env.get(name, "").strip()]
        shown = ", ".join(dict.fromkeys(given))
        raise LauncherError(
            f"torchrun's variables are partly set ({shown}) but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: launch with `torchrun "
            "--nproc-per-node N -m lbtrain ...`, which sets them all, or set RANK, WORLD_SIZE, "
            "MASTER_ADDR and MASTER_PORT (the rendezvous host and a free port) on every rank; "
            "for a run without a launcher, unset them"
        )
    rank, size, port = (_whole(env, name) for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"))
    if size < 1 or rank >= size:
        raise LauncherError(
            f"RANK={rank} with WORLD_SIZE={size}: rank should be in the interval "
            f"[0, {max(size - 1, 0)}]; let torchrun set them (`torchrun --nproc-per-node N`)"
        )
    if not 0 < port < 65536:
        raise LauncherError(f"MASTER_PORT={port} is not a TCP port; pick a free one in 1..65535")
    return rank, size


def detect_launcher(environ: Mapping[str, str] | None = None) -> str | None:
    """ "mpi", "torchrun" or None (no launcher: one process), from the environment.

    A process can carry two launchers' variables when one launcher starts the other: Slurm's
    `srun` (with PMI) starting one torchrun per node is how torchrun runs on many clusters,
    and then torchrun, this process's parent, is the launcher. That is accepted only when
    the worlds agree: torchrun's world is the MPI launcher's copies of torchrun times the
    ranks each one starts. Anything else (torchrun variables under mpiexec, copies of
    `torchrun --standalone` that never meet) is refused, as the job would not be one world.

    Raises:
        LauncherError: mixed launchers, or torchrun's variables without the rendezvous ones.
    """
    env = _env(environ)
    mpi, torch = launched_by_mpi(env), launched_by_torchrun(env)
    if not torch:
        return MPI if mpi else None
    _, size = torchrun_world(env)
    if not mpi:
        return TORCHRUN
    mpi_size = mpi_world_size(env)
    local = env.get("LOCAL_WORLD_SIZE", "").strip()
    if (
        "TORCHELASTIC_RUN_ID" in env
        and mpi_size is not None
        and local.isdigit()
        and mpi_size * int(local) == size
    ):
        return TORCHRUN  # e.g. srun --ntasks-per-node 1 torchrun --nnodes N ...
    mpi_name = next(name for name in MPI_VARIABLES if name in env)
    torch_name = next(name for name in _TORCH_VARIABLES if env.get(name, "").strip())
    raise LauncherError(
        f"launched by both an MPI launcher ({mpi_name}={env[mpi_name]}) and torchrun "
        f"({torch_name}={env[torch_name]}, WORLD_SIZE={size}), which do not form one job: "
        "start lbtrain under one of them, `mpiexec -n N lbtrain ...` or `torchrun "
        "--nproc-per-node N -m lbtrain ...` (on Slurm, one torchrun per node: `srun "
        "--ntasks-per-node 1 torchrun --nnodes $SLURM_NNODES --rdzv-backend c10d ...`), or "
        f"unset the other's variables (here {mpi_name} or {torch_name})"
    )


def restarts_left(environ: Mapping[str, str] | None = None) -> int | None:
    """How many more times torchrun's elastic agent will start this worker after a failure
    (its --max-restarts less the restarts so far), or None outside an elastic agent."""
    env = _env(environ)
    done, most = env.get("TORCHELASTIC_RESTART_COUNT", ""), env.get("TORCHELASTIC_MAX_RESTARTS", "")
    if not (done.isdigit() and most.isdigit()):
        return None
    return max(0, int(most) - int(done))


def shared_store_hazard(environ: Mapping[str, str] | None = None) -> str | None:
    """One line when torchrun's elastic agent may restart these workers on the store it
    shares across restarts, where a restarted worker connects to a lost rank's address and
    hangs (torch 2.13: pytorch#135712; scripts/elastic_probe.py shows it); else None."""
    env = _env(environ)
    restarts = env.get("TORCHELASTIC_MAX_RESTARTS", "0")
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not restarts.isdigit():
        return None
    if int(restarts) == 0:
        return None
    return (
        f"torchrun may restart these workers (--max-restarts {restarts}) on the store its agents "
        "share across restarts, where a restarted worker can hang connecting to a lost rank; "
        "start the agents with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in their environment"
    )


def torchrun_local_rank(
    rank: int, size: int, environ: Mapping[str, str] | None = None
) -> int | None:
    """torchrun's LOCAL_RANK when torchrun launched this process as `rank` of `size`.

    None without torchrun, or when the environment describes another world than the one
    asking (ranks that are threads of one process, a communicator split from the job's).
    """
    env = _env(environ)
    try:
        if detect_launcher(env) != TORCHRUN:
            return None
    except LauncherError:
        return None
    if (int(env["RANK"]), int(env["WORLD_SIZE"])) != (rank, size):
        return None
    local = env.get("LOCAL_RANK", "").strip()
    return int(local) if local.isdigit() else None


def launcher_rank() -> int:
    """This process's rank as the launcher announced it, 0 when there is none.

    Read before any communicator exists, so that a message every rank would print (a
    command-line mistake, a Ctrl-C while starting up) is printed once under mpiexec or
    torchrun. Under torchrun, torchrun's RANK, even where srun started torchrun. Where the
    launchers' variables do not form one job (`detect_launcher` refuses them), the largest
    of the announced ranks: 0 only for the one process that every launcher calls rank 0, so
    the refusal is printed once.
    """
    try:
        if detect_launcher() == TORCHRUN:
            return int(os.environ["RANK"])
    except LauncherError:
        pass
    # RANK=2 of 2 has no rank 0 to speak for it: the MPI launcher's rank decides, if any.
    names = _RANK_VARIABLES[:-1] if _outside_torch_world() else _RANK_VARIABLES
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
