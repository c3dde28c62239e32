"""One way from profiling to a plan: the ladder, the profile, the plan, and re-timing.

`plan_for` (a user's loop) and `lbtrain train` both plan through `measure_and_plan`, so a
library user gets what the trainer does: each rank timed on a short ladder of batch sizes,
the ranks' sync timed together, a plan, and each share that falls outside the measured
batches timed where it falls (no extrapolation) before planning again. Collective.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lbtrain.balancer import BalancePlan, plan_batches
from lbtrain.collective import agree
from lbtrain.comm import Communicator
from lbtrain.emulation import Slowdown
from lbtrain.logs import logger
from lbtrain.profiling.profiler import ProfileConfig, profile_all
from lbtrain.profiling.record import ReplicaProfile, describe_model
from lbtrain.profiling.retime import outside_measured, retime_profiles
from lbtrain.profiling.steps import LossFn, MakeBatch
from lbtrain.profiling.sync import comm_cost

__all__ = [
    "LADDER_SHARE",
    "MIN_REPEATS",
    "REPEATS",
    "RETIME_ROUNDS",
    "PlanRequest",
    "StepSource",
    "ladder_config",
    "measure_and_plan",
]

# Timed steps per batch size, fewer than `lbtrain profile`'s: training measures every epoch,
# and the re-planner refines the first plan from it (issue 20: profile little).
REPEATS, MIN_REPEATS = 3, 2
# The time budget covers re-timing too: the ladder takes this share of it, re-timing what
# is left (its first round runs whatever is left: a plan must not rest on an extrapolation).
LADDER_SHARE = 0.75
# Re-timing converges in one or two rounds; a third is a guard against a plan that flips.
RETIME_ROUNDS = 3


def ladder_config(
    global_batch: int, world_size: int, time_budget: float, seed: int = 0
) -> ProfileConfig:
    """The ladder each rank climbs: from min(4, r) to max(16, 2r), r = B/P, in
    `LADDER_SHARE` of the budget. Small first rungs: a slow rank whose budget affords only
    the first rungs still gets a span wide enough to tell its fixed cost from its
    per-sample one."""
    reference = max(1, global_batch // world_size)
    return ProfileConfig(
        min_batch=min(4, reference),
        max_batch=max(16, 2 * reference),
        time_budget=time_budget * LADDER_SHARE,
        seed=seed,
        reference_batch=reference,
        warmup=1,
        repeats=REPEATS,
        min_repeats=MIN_REPEATS,
    )


@dataclass(frozen=True)
class PlanRequest:
    """What the plan must do: share `global_batch` by `policy`, within `min_batch` and `caps`."""

    global_batch: int
    policy: str
    min_batch: int = 0
    caps: Sequence[int | None] | None = None

    def plan(self, comm: Communicator, profiles: Sequence[ReplicaProfile]) -> BalancePlan:
        """The plan of `profiles` and their measured sync, the same on every rank."""
        return agree(
            comm,
            lambda: plan_batches(
                list(profiles),
                self.global_batch,
                self.policy,
                caps=self.caps,
                min_batch=self.min_batch,
                comm=comm_cost(profiles),
            ),  # fmt: skip
        )


@dataclass
class StepSource:
    """What each rank times, and where.

    Args:
        make_model: builds this rank's model (on `device`) and optimizer; called once, on
            first need (never, when given profiles need no re-timing).
        loss_fn: the mean-reduced loss on (outputs, targets).
        make_batch: `make_batch(b, device)` gives (inputs, targets) of b samples.
        device, slowdown: this rank's device and emulated slowdown.
        seed: seed of the synthetic batches.
        sync_batchnorm: training synchronises BatchNorm (timed as it computes, and its
            collectives in the sync).
        sample_shape: recorded in the profiles, with the model's name.
        host: this rank's host as the job names it (default this machine's).
        workload: the workload's name, recorded in the profiles.
    """

    make_model: Callable[[], tuple[nn.Module, torch.optim.Optimizer]]
    loss_fn: LossFn
    make_batch: MakeBatch
    device: torch.device
    slowdown: Slowdown | None = None
    seed: int = 0
    sync_batchnorm: bool = True
    sample_shape: tuple[int, ...] | None = None
    host: str | None = None
    workload: str = "custom"
    _built: list[tuple[nn.Module, torch.optim.Optimizer]] = field(default_factory=list)

    def model(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model and optimizer, built on the first call."""
        if not self._built:
            self._built.append(self.make_model())
        return self._built[0]

    def profile(
        self, comm: Communicator, config: ProfileConfig, known: ReplicaProfile | None = None
    ) -> list[ReplicaProfile]:
        """Every rank's profile on `config`'s ladder, named after the model (this rank's
        `known` one kept, if given, with only the sync timed again); collective."""
        model, optimizer = self.model()
        extra: dict[str, Any] = {} if self.host is None else {"host": self.host}
        if known is not None:
            extra["known"] = known
        profiles = profile_all(
            comm, model, optimizer, self.loss_fn, self.make_batch, device=self.device,
            config=config, slowdown=self.slowdown, sync_batchnorm=self.sync_batchnorm,
            workload=self.workload, **extra,
        )  # fmt: skip
        name = describe_model(model)
        return [
            dataclasses.replace(p, model=name, sample_shape=self.sample_shape) for p in profiles
        ]

    def retime(
        self, comm: Communicator, profiles: list[ReplicaProfile], wanted: list[int | None]
    ) -> list[ReplicaProfile]:
        """`profiles` with each rank timed at its `wanted` batch; collective."""
        model, optimizer = self.model()
        return retime_profiles(
            comm, model, optimizer, self.loss_fn, self.make_batch, profiles, wanted,
            device=self.device, slowdown=self.slowdown, sync_batchnorm=self.sync_batchnorm,
            # Two timed steps (after an untimed one): the re-planner refines the plan from
            # every epoch, and a third step at the largest batch costs the most.
            config=ProfileConfig(seed=self.seed, repeats=MIN_REPEATS, min_repeats=MIN_REPEATS),
        )  # fmt: skip


def measure_and_plan(
    comm: Communicator,
    steps: StepSource,
    request: PlanRequest,
    time_budget: float,
    profiles: Sequence[ReplicaProfile] | None = None,
    say: Callable[[str], None] | None = None,
    known: Sequence[ReplicaProfile | None] | None = None,
) -> tuple[BalancePlan, list[ReplicaProfile]]:
    """Profile every rank (unless `profiles` are given), plan, and re-time; collective.

    `known`: a profile per rank from an earlier world on the same device, or None where
    there is none; those ranks keep theirs instead of profiling (the sync is timed again).

    `time_budget` covers profiling and re-timing together, about: the ladder takes
    `LADDER_SHARE` of it, and re-timing's first round runs whatever is left. `say` gets
    rank 0's progress lines ("timing rank 0 at batch 41 (measured 4..21), then planning
    again"). Returns the plan and the profiles it came from (re-timed points added), the
    same on every rank.
    """
    started = time.perf_counter()
    if profiles is None:
        config = agree(
            comm, lambda: ladder_config(request.global_batch, comm.size, time_budget, steps.seed)
        )
        profiles = steps.profile(comm, config, known[comm.rank] if known else None)
        logger.debug("profiling took %.2f s (time_budget %g s)",
                     time.perf_counter() - started, time_budget)  # fmt: skip
    profiles = list(profiles)
    plan = request.plan(comm, profiles)
    for round_index in range(RETIME_ROUNDS):
        # A share of 1 is not timed: one sample cannot train plain BatchNorm, and a point
        # at 1 lies a short step below any ladder (whose rungs start at min(4, B/P)).
        wanted = [
            b if b >= 2 and outside_measured(p, b) else None
            for p, b in zip(profiles, plan.batch_sizes, strict=True)
        ]
        # The first round always runs (a few steps at batches training will run anyway);
        # later ones while the budget lasts. Rank 0's clock decides for every rank, as a
        # rank that stopped early would leave the others waiting in the next allgather.
        over = comm.bcast(round_index > 0 and time.perf_counter() - started > time_budget, 0)
        if not any(wanted) or over:
            break
        if say is not None and comm.rank == 0:
            say(_timing_line(profiles, wanted))
        profiles = steps.retime(comm, profiles, wanted)
        previous, plan = plan, request.plan(comm, profiles)
        if plan.batch_sizes == previous.batch_sizes:
            break
    logger.debug("profiling, re-timing and planning took %.2f s", time.perf_counter() - started)
    return plan, profiles


def _timing_line(profiles: Sequence[ReplicaProfile], wanted: Sequence[int | None]) -> str:
    ranks = ", ".join(
        f"rank {r} at batch {b} (measured {min(profiles[r].batch_sizes)}.."
        f"{max(profiles[r].batch_sizes)})"
        for r, b in enumerate(wanted)
        if b
    )
    return f"timing {ranks}, then planning again"
