"""What every job does before its real work: place ranks, build the workload, profile.

The trainer and the `profile` / `balance-report` verbs share this orchestration, so it lives
in the library, not in `lbtrain/cli/`. Errors name the library's parameters; the CLI turns
them into flag names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lbtrain.collective import agree, root_value
from lbtrain.comm import Communicator
from lbtrain.denormals import flush_denormals, flushing_threads
from lbtrain.devices import DeviceAssignment, assign_devices
from lbtrain.emulation import Slowdown, slowdown_for_rank
from lbtrain.logs import logger
from lbtrain.profiling import ProfileConfig, ReplicaProfile, load_profiles
from lbtrain.workloads import Workload, get_plugin

if TYPE_CHECKING:
    from lbtrain.profiling.measured_plan import StepSource

__all__ = [
    "Replica",
    "build_workload",
    "load_profiles_collective",
    "profile_workload",
    "setup_replica",
    "workload_steps",
]


@dataclass(frozen=True)
class Replica:
    """Where and how this rank computes.

    Args:
        assignment: device, threads and node position.
        slowdown: the emulated slowdown applied after every compute step.
    """

    assignment: DeviceAssignment

    slowdown: Slowdown

    @property
    def device(self) -> torch.device:
        """This rank's torch device."""
        return self.assignment.torch_device


def setup_replica(
    comm: Communicator,
    devices: str = "auto",
    threads: int | None = None,
    slowdown: str | Iterable[float] | None = None,
    flush: bool | None = None,
) -> Replica:
    """Pick and apply this rank's device, threads and emulated slowdown; collective.

    Args:
        comm: the job's communicator.
        devices: "auto", one entry for all ranks, or one per rank ("cpu,cuda:0").
        threads: CPU threads per rank; default the rank's cores over the node's ranks
            sharing them.
        slowdown: emulated slowdown factors, "1,2,4" or a sequence, or None.
        flush: flush subnormal floats to zero on this rank's CPU threads (True), stop
            (False), or leave them as they are (None); see `lbtrain.flush_denormals`.
    """
    factors = slowdown if slowdown is None or isinstance(slowdown, str) else list(slowdown)
    emulated = agree(comm, lambda: slowdown_for_rank(factors, comm.rank, comm.size))
    assignment = agree(comm, lambda: assign_devices(comm, devices, threads))
    assignment.apply()
    # An engine whose transport depends on the devices (torch.distributed: NCCL only where
    # every rank is on a GPU) chooses it now, before any tensor is sent; it raises the same
    # error on every rank when its backend cannot run on them (NCCL with a CPU rank).
    use_device = getattr(comm, "use_device", None)
    if use_device is not None:
        agree(comm, lambda: use_device(assignment.torch_device))
    # Before the workload's first tensor: torch's worker threads then start flushing.
    if flush is not None and not flush_denormals(flush):
        some = flushing_threads() is None
        (logger.warning if some else logger.info)(
            "rank %d: --flush-denormals %s is not in force on %s",
            comm.rank,
            "on" if flush else "off",
            "all of torch's CPU threads (a thread pool this cannot reach)"
            if some
            else "this CPU (it has no flush-to-zero mode)",
        )
    return Replica(assignment, emulated)


def build_workload(
    comm: Communicator,
    spec: str,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
) -> Workload:
    """Resolve, fetch (rank 0 alone, others wait) and build the workload on every rank.

    Collective. Rank 0 runs the plug-in's `fetch` first, so a download happens once, not
    once per rank into the same cache; then every rank builds from the same seed.

    Args:
        comm: the job's communicator.
        spec: the workload name, entry point or "module:function".
        seed: seed of the workload's data split and model initialisation.
        options: the workload's own options, over their defaults.
    """
    plugin = agree(comm, lambda: get_plugin(spec))
    resolved = agree(comm, lambda: plugin.resolve_options(options))
    if plugin.fetch is not None:
        agree(comm, lambda: comm.rank != 0 or plugin.fetch(**resolved), name_rank=False)
    return agree(comm, lambda: plugin.make(seed, resolved))


def profile_workload(
    comm: Communicator,
    replica: Replica,
    workload: Workload,
    config: ProfileConfig,
    build_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
    sync_batchnorm: bool = True,
) -> list[ReplicaProfile]:
    """Profile every rank on the workload's real model and sample shape; collective.

    Args:
        comm: the job's communicator.
        replica: this rank's device and slowdown (from `setup_replica`).
        workload: what to profile.
        config: ladder, repeats and time budget.
        build_optimizer: the optimizer training will use (its step is part of the cost);
            default the workload's.
        sync_batchnorm: training will synchronise BatchNorm (its collectives join the sync
            time).
    """
    steps = workload_steps(replica, workload, build_optimizer, seed=config.seed,
                           sync_batchnorm=sync_batchnorm)  # fmt: skip
    return steps.profile(comm, config)


def workload_steps(
    replica: Replica,
    workload: Workload,
    build_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
    *,
    seed: int = 0,
    sync_batchnorm: bool = True,
) -> StepSource:
    """What this rank times of `workload`: its real model on the rank's device, with the
    optimizer training will use (default the workload's), named in the profiles with its
    sample shape, so that training can refuse them for another model."""
    from lbtrain.profiling.measured_plan import StepSource  # it plans through `agree`, here

    def make_model() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = workload.build_model().to(replica.device)
        return model, (build_optimizer or workload.build_optimizer)(model.parameters())

    return StepSource(
        make_model, workload.loss_fn, workload.make_batch, replica.device,
        slowdown=replica.slowdown, seed=seed, sync_batchnorm=sync_batchnorm,
        sample_shape=tuple(workload.sample_shape), host=replica.assignment.host,
        workload=workload.name,
    )  # fmt: skip


def load_profiles_collective(
    comm: Communicator, path: str, world_size: int | None = None
) -> list[ReplicaProfile]:
    """Rank 0 reads a profiles file and every rank gets the profiles, or the same error.

    Args:
        comm: the job's communicator.
        path: the profiles JSON.
        world_size: ranks the file must describe; default the job's under mpiexec, any
            number in a one-process run (a report may describe another job). Training passes
            its own world size, since it trains with one plan entry per rank.
    """
    if world_size is None and comm.size > 1:
        world_size = comm.size
    entries = root_value(
        comm, lambda: [p.to_dict() for p in load_profiles(path, world_size=world_size)]
    )
    return [ReplicaProfile.from_dict(entry) for entry in entries]
