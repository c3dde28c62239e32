"""Device and thread assignment for mixed CPU/GPU jobs.

Each rank resolves `--devices` into one torch device and a thread count. The decisions need
the rank's position on its node (local rank, ranks on the node), which come from one
allgather of host names, so any Communicator works; the one launcher variable read is
torchrun's LOCAL_RANK, for the GPU index, where it describes the job's communicator.
"""

from __future__ import annotations

import os
import re
import socket
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from lbtrain.comm import Communicator
from lbtrain.comm.launchers import torchrun_local_rank
from lbtrain.parallel.checks import require_communicator
from lbtrain.text import plural

__all__ = [
    "DeviceAssignment",
    "NodeLayout",
    "assign_devices",
    "default_threads",
    "device_name",
    "node_cores",
    "node_layout",
    "node_layout_from_hosts",
    "node_threads",
    "rank_threads",
    "parse_devices",
    "resolve_device",
    "synchronize",
]

MAX_THREADS = 4096  # CPU threads a rank may ask for

_ENTRY = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class NodeLayout:
    """Where a rank sits on its node.

    Args:
        host: host name.
        local_rank: index of this rank among the ranks on its host, in rank order.
        local_size: number of ranks on this host.
    """

    host: str
    local_rank: int
    local_size: int


@dataclass(frozen=True)
class DeviceAssignment:
    """The device and CPU threads one rank trains with.

    Args:
        rank: global rank.
        host: host name.
        local_rank: rank index on the node.
        local_size: ranks on the node.
        device: torch device string, "cpu" or "cuda:K".
        threads: intra-op CPU threads for torch.
    """

    rank: int
    host: str
    local_rank: int
    local_size: int
    device: str
    threads: int

    @property
    def torch_device(self) -> torch.device:
        """The device as a torch.device."""
        return torch.device(self.device)

    def apply(self) -> None:
        """Set torch's thread count and, for CUDA, the current device."""
        torch.set_num_threads(self.threads)
        if self.torch_device.type == "cuda":
            torch.cuda.set_device(self.torch_device)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def node_layout_from_hosts(hosts: Sequence[str], rank: int) -> NodeLayout:
    """Local rank and ranks-per-node of `rank`, given every rank's host name in rank order."""
    if not 0 <= rank < len(hosts):
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {len(hosts) - 1}]"
        )
    host = hosts[rank]
    local_rank = sum(1 for h in hosts[:rank] if h == host)
    return NodeLayout(host=host, local_rank=local_rank, local_size=hosts.count(host))


def node_layout(comm: Communicator) -> NodeLayout:
    """This rank's NodeLayout; collective (one allgather of host names)."""
    return node_layout_from_hosts(comm.allgather(socket.gethostname()), comm.rank)


def node_cores() -> int:
    """CPU cores this process may run on (its affinity set), which is the node's in practice."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads(cores: int, ranks_on_node: int) -> int:
    """Cores divided by the ranks on the node, at least 1: oversubscribed ranks ruin timings."""
    return max(1, cores // max(1, ranks_on_node))


def rank_threads(comm: Communicator, layout: NodeLayout, cores: int | None = None) -> int:
    """This rank's default threads: `node_threads`, or `cores` over the node's ranks when
    given. OMP_NUM_THREADS is not read: torchrun sets it to 1 for every job of more than one
    rank per node, and a site may set it to the node's cores; `--threads` says it plainly."""
    if cores is not None:
        return default_threads(cores, layout.local_size)
    return node_threads(comm, layout)


def node_threads(comm: Communicator, layout: NodeLayout) -> int:
    """This rank's default threads: its cores over the ranks of its node that share them.

    Collective (one allgather). A launcher that binds each rank to its own cores (`srun -c 8`,
    `mpiexec -bind-to core`) leaves every rank all of its cores; ranks that share one set
    (no binding) divide it, as `default_threads` does.
    """
    mine = _cpu_set()
    sets = comm.allgather((layout.host, sorted(mine)))
    sharing = sum(1 for host, cpus in sets if host == layout.host and mine.intersection(cpus))
    return default_threads(len(mine), sharing)


def _cpu_set() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def _warn_oversubscribed(threads: int, layout: NodeLayout, cores: int, default: int) -> None:
    """One warning per node (its first rank) when the ranks' threads there come to more
    than twice its cores: each step then waits for descheduled threads (3 ranks of 1,000
    threads on 2 cores ran 14 times slower), and profiles time the contention."""
    wanted = threads * layout.local_size
    if layout.local_rank == 0 and wanted > 2 * cores:
        warnings.warn(
            f"--threads {threads} on each of the {plural(layout.local_size, 'rank')} on host "
            f"{layout.host} is {wanted:,} threads on {plural(cores, 'core')}: oversubscribed "
            f"threads slow every rank; leave --threads out for {default} a rank",
            stacklevel=3,
        )


def parse_devices(text: str, world_size: int) -> list[str]:
    """Parse `--devices` into one entry per rank: "auto", "cpu", "cuda" or "cuda:K".

    Args:
        text: "auto", a single entry for every rank, or a comma list with one entry per rank
            such as "cpu,cpu,cuda:0,cuda:1".
        world_size: number of ranks.
    """
    items = [item.strip().lower() for item in str(text).split(",")]
    for item in items:
        if item != "auto" and not _ENTRY.match(item):
            raise ValueError(
                f"--devices {text!r}: unknown device {item!r}; use auto, cpu, cuda or cuda:K, "
                "e.g. --devices auto or --devices cpu,cpu,cuda:0,cuda:1"
            )
    if len(items) == 1:
        return items * world_size
    if len(items) != world_size:
        raise ValueError(
            f"--devices {text!r} lists {len(items)} devices but the job has {world_size} ranks; "
            f"give one device per rank or a single one (such as auto) for all"
        )
    return items


def resolve_device(entry: str, layout: NodeLayout, cuda_count: int) -> str:
    """Turn one `--devices` entry into a concrete device string for this rank.

    "auto" puts the rank on cuda:<local rank> when its node has a GPU for it (local rank <
    GPU count), and on the CPU otherwise, so three ranks on a two-GPU node become two GPU
    ranks and one CPU rank. "cuda" means cuda:<local rank>.

    Args:
        entry: "auto", "cpu", "cuda" or "cuda:K".
        layout: this rank's NodeLayout.
        cuda_count: CUDA devices visible to this process.
    """
    match = _ENTRY.match(entry)
    if entry == "auto":
        return f"cuda:{layout.local_rank}" if layout.local_rank < cuda_count else "cpu"
    if match is None:
        raise ValueError(f"--devices: unknown device {entry!r}; use auto, cpu, cuda or cuda:K")
    if match.group(1) == "cpu":
        if match.group(2) is not None:
            raise ValueError(f"--devices: {entry!r} is not a device; write plain 'cpu'")
        return "cpu"
    index = layout.local_rank if match.group(2) is None else int(match.group(2))
    if cuda_count == 0:
        raise ValueError(
            f"--devices asks for cuda:{index} on host {layout.host}, but CUDA is not available "
            f"there (torch {torch.__version__}, torch.cuda.is_available() is False); use "
            "--devices cpu or auto, or install a CUDA build of torch"
        )
    if index >= cuda_count:
        raise ValueError(
            f"--devices asks for cuda:{index} on host {layout.host}, which has {cuda_count} "
            f"CUDA device(s) (cuda:0..cuda:{cuda_count - 1}); pick an index below {cuda_count} "
            "or use --devices auto"
        )
    return f"cuda:{index}"


def assign_devices(
    comm: Communicator,
    devices: str = "auto",
    threads: int | None = None,
    *,
    cuda_count: int | None = None,
    cores: int | None = None,
) -> DeviceAssignment:
    """Pick this rank's device and thread count; collective (allgathers host names).

    Args:
        comm: the job's communicator.
        devices: "auto", one entry for all ranks, or one comma-separated entry per rank.
        threads: CPU threads per rank; default the rank's cores over the ranks of its node
            that share them (`node_threads`).
        cuda_count: CUDA devices visible here; default torch.cuda.device_count().
        cores: cores of the node; default this process's CPU affinity.

    Returns:
        The DeviceAssignment; call `.apply()` to set torch's threads and current device.
    """
    require_communicator(comm)
    layout = node_layout(comm)
    # Collective: before anything that may raise on one rank alone (a device it lacks).
    default = rank_threads(comm, layout, cores)
    entries = parse_devices(devices, comm.size)
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # Under torchrun a rank's GPU is cuda:LOCAL_RANK, as in every torchrun script. It is the
    # host-based local rank when one torchrun runs per host, and stays right where several
    # share a host, each with its own CUDA_VISIBLE_DEVICES.
    local = torchrun_local_rank(comm.rank, comm.size)
    gpu_layout = layout if local is None else replace(layout, local_rank=local)
    device = resolve_device(entries[comm.rank], gpu_layout, cuda_count)
    if threads is None:
        threads = default
    elif isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"--threads {threads!r} is invalid; give a whole number >= 1")
    elif threads > MAX_THREADS:  # torch would try to allocate a pool of that many
        raise ValueError(
            f"--threads {threads:,} is more than any node has cores; give at most "
            f"{MAX_THREADS:,}, or leave --threads out for {default} a rank here"
        )
    else:
        _warn_oversubscribed(threads, layout, cores if cores is not None else node_cores(), default)
    return DeviceAssignment(
        rank=comm.rank,
        host=layout.host,
        local_rank=layout.local_rank,
        local_size=layout.local_size,
        device=device,
        threads=threads,
    )


def device_name(device: torch.device | str) -> str:
    """Human-readable name: the GPU model for CUDA, the CPU model for CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def synchronize(device: torch.device | str) -> None:
    """Wait for queued work on `device`; a no-op on CPU, where ops run synchronously."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
