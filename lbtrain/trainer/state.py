"""What a checkpoint holds, and putting it back: model, optimizer, schedule, RNG, position."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from lbtrain.balancer import BalancePlan
from lbtrain.comm import Communicator
from lbtrain.profiling import ReplicaProfile
from lbtrain.trainer.config import TrainConfig
from lbtrain.trainer.loop import EpochRecord
from lbtrain.workloads import Workload

__all__ = ["checkpoint_state", "restore"]


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def checkpoint_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    comm: Communicator,
    device: torch.device,
    epoch: int,
    step: int,
    global_step: int,
    plan: BalancePlan,
    profiles: list[ReplicaProfile] | None,
    config: TrainConfig,
    workload: Workload,
    devices: list[dict[str, Any]],
    history: list[EpochRecord],
    evaluations: list[dict[str, Any]],
) -> dict[str, Any]:
    """Everything needed to continue exactly; collective (it gathers every rank's RNG)."""
    rng = comm.allgather(_rng_state(device))
    return {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": epoch,
        "step": step,
        "global_step": global_step,
        "rng": rng,
        "plan": plan.to_dict(),
        "profiles": [p.to_dict() for p in profiles] if profiles else None,
        "config": config.to_dict(),
        "signature": dict(workload.signature),
        "devices": devices,
        "history": [dataclasses.asdict(r) for r in history],
        "evaluations": evaluations,
    }


def restore(
    checkpoint: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    comm: Communicator,
    device: torch.device,
) -> tuple[int, int, int]:
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint.get("rng") or []
    if len(rng) == comm.size:  # same world: each rank continues its own random stream
        torch.set_rng_state(rng[comm.rank]["cpu"])
        if device.type == "cuda" and "cuda" in rng[comm.rank]:
            torch.cuda.set_rng_state(rng[comm.rank]["cuda"], device)
    return int(checkpoint["epoch"]), int(checkpoint["step"]), int(checkpoint["global_step"])
