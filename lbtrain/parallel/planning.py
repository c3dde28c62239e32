"""`plan_for`: profile this rank's real model on its device, then plan together."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from lbtrain.balancer import BalancePlan
from lbtrain.balancer.checks import real, whole
from lbtrain.collective import agree
from lbtrain.comm import Communicator
from lbtrain.emulation import Slowdown
from lbtrain.parallel.checks import require_communicator
from lbtrain.profiling import ReplicaProfile
from lbtrain.profiling.measured_plan import PlanRequest, StepSource, measure_and_plan

__all__ = ["plan_for", "tile_batch"]

POLICIES = ("equal", "proportional", "cost")


def tile_batch(sample: Any, size: int, device: torch.device | str) -> Any:
    """A batch of `size` rows made by repeating the rows of `sample`, on `device`."""
    if isinstance(sample, torch.Tensor):
        rows = torch.arange(size) % sample.shape[0]
        return sample[rows.to(sample.device)].to(device)
    if isinstance(sample, dict):
        return {key: tile_batch(value, size, device) for key, value in sample.items()}
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):  # a namedtuple
        return type(sample)(*(tile_batch(value, size, device) for value in sample))
    if isinstance(sample, list | tuple):
        return type(sample)(tile_batch(value, size, device) for value in sample)
    return sample


def _rows(sample: Any) -> int | None:
    if isinstance(sample, torch.Tensor):
        return int(sample.shape[0]) if sample.dim() else 0
    if isinstance(sample, dict):
        sample = list(sample.values())
    if isinstance(sample, list | tuple):
        counts = [_rows(value) for value in sample]
        counts = [c for c in counts if c is not None]
        return min(counts) if counts else None
    return None


def plan_for(
    model: nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    sample: tuple[Any, Any],
    comm: Communicator,
    global_batch: int,
    policy: str = "cost",
    *,
    optimizer: torch.optim.Optimizer | None = None,
    caps: Sequence[int | None] | None = None,
    min_batch: int = 0,
    time_budget: float = 10.0,
    slowdown: float = 1.0,
    profiles: list[ReplicaProfile] | None = None,
    sync_batchnorm: bool = True,
) -> BalancePlan:
    """Measure how fast this rank trains `model`, and plan the global batch; collective.

    Every rank times training steps of its own model on its own device (batch sizes made
    from `sample`), the ranks share those and their sync time, and every rank gets the same
    plan; a share outside the measured batches is timed and the plan made again, as `lbtrain
    train` does. The model and optimizer are left as found.

    Args:
        model: the model, on this rank's device, the same on every rank.
        loss_fn: mean-reduced loss on (outputs, targets).
        sample: one batch (inputs, targets) with at least one row, as the loader yields it;
            larger batches repeat its rows.
        comm: the job's communicator.
        global_batch: B, the samples of one global batch.
        policy: "cost" (fixed and per-sample cost, and the sync), "proportional" or "equal".
        optimizer: the optimizer training will use (its step is timed); default plain SGD.
        caps: largest batch per rank (memory); combined with the cap profiling finds.
        min_batch: smallest share a rank may get (0 lets `cost` idle a rank it cannot use).
        time_budget: seconds each rank spends profiling and re-timing, about.
        slowdown: emulated slowdown of this rank (a testing aid; 1 = none).
        profiles: earlier profiles (`lbtrain.load_profiles`) to plan from instead of
            profiling; a share outside them is still timed where it falls.
        sync_batchnorm: as passed to `BalancedDataParallel`: its BatchNorm collectives join
            the measured sync time.

    Returns: the BalancePlan, for `balanced_loader`.
    """

    caps = _check_arguments(
        comm, model, sample, global_batch, policy, min_batch, caps, time_budget, optimizer
    )
    device = next(model.parameters(), torch.empty(0)).device

    def make_batch(size: int, where: torch.device) -> tuple[Any, Any]:
        inputs, targets = sample
        return tile_batch(inputs, size, where), tile_batch(targets, size, where)

    def make_model() -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer or torch.optim.SGD(model.parameters(), lr=0.0)

    steps = StepSource(make_model, loss_fn, make_batch, device, slowdown=Slowdown(slowdown),
                       sync_batchnorm=sync_batchnorm)  # fmt: skip
    request = PlanRequest(global_batch, policy, min_batch=min_batch, caps=caps)
    return measure_and_plan(comm, steps, request, time_budget, profiles)[0]


def _check_what_is_timed(model: Any, sample: Any, optimizer: Any) -> None:
    """The model, its optimizer and the sample batch: each of these, wrong, once failed deep
    in profiling in torch's words (a bare tensor as `sample` split into rows)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model={model!r:.60} is not an nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"model {type(model).__name__} has no trainable parameters: there is nothing "
            "to train, or to time; pass the model training will update"
        )
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(
            f"optimizer={optimizer!r:.60} is not a torch.optim.Optimizer; pass the one "
            "training will use (over this model's parameters), or leave it out"
        )
    if not (isinstance(sample, tuple | list) and len(sample) == 2):
        raise ValueError(
            f"sample must be one batch as a pair (inputs, targets), not a "
            f"{type(sample).__name__}, e.g. next(iter(DataLoader(dataset, batch_size=8)))"
        )


def _check_arguments(
    comm: Communicator,
    model: nn.Module,
    sample: Any,
    global_batch: int,
    policy: str,
    min_batch: int,
    caps: Sequence[int | None] | None,
    time_budget: float,
    optimizer: Any = None,
) -> Sequence[int | None] | None:
    """Refuse bad arguments on every rank alike, and arguments that differ between ranks;
    `caps` read once (a generator)."""
    require_communicator(comm)

    def check() -> int:
        try:
            whole("global_batch", global_batch, low=1)
        except TypeError as exc:  # the same on every rank, but agree() passes only these on
            raise ValueError(str(exc)) from None
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} must be one of {', '.join(POLICIES)}")
        try:
            budget = real("time_budget", time_budget)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(
                f"time_budget={time_budget!r} must be a positive number of seconds (each "
                "rank's profiling, about), e.g. 10"
            )
        _check_what_is_timed(model, sample, optimizer)
        rows = _rows(sample)
        if not rows:
            raise ValueError(
                "sample must be one batch (inputs, targets) with at least one row, e.g. "
                "next(iter(DataLoader(dataset, batch_size=8)))"
            )
        return rows

    agree(comm, check)
    # Each rank plans on its own: arguments that differ would give plans that differ, found
    # only later as "the ranks' loaders disagree on the plan", far from the cause.
    if isinstance(caps, Iterable) and not isinstance(caps, str | bytes):
        caps = list(caps)  # read a generator once, for the comparison and the plan alike
    given = {"global_batch": global_batch, "policy": policy, "min_batch": min_batch,
             "caps": caps}  # fmt: skip
    rows = comm.allgather(given)
    agree(comm, lambda: _same_arguments(rows), name_rank=False)
    return caps


def _same_arguments(rows: list[dict[str, Any]]) -> None:
    for rank, row in enumerate(rows):
        for name, value in row.items():
            if value != rows[0][name]:
                raise ValueError(
                    f"plan_for got {name}={value!r} on rank {rank} but {name}="
                    f"{rows[0][name]!r} on rank 0; pass the same {name} on every rank"
                )
