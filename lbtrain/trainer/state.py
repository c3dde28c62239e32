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
    """Everything needed to continue exactly; collective (it gathers every rank's RNG state
    and timing history, so a resumed run reports each rank's own times)."""
    rng = comm.allgather(_rng_state(device))
    histories = comm.allgather([dataclasses.asdict(r) for r in history])
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
        "histories": histories,
        "evaluations": evaluations,
    }


def restore(
    checkpoint: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    comm: Communicator,
    device: torch.device,
) -> tuple[tuple[int, int, int], list[EpochRecord]]:
    """Load a checkpoint into the model, optimizer and schedule; on the same world size also
    each rank's RNG stream and timing history.

    Returns:
        (epoch, step, global_step) to continue from, and this rank's earlier epoch records
        (none when the world size changed: earlier per-rank times no longer map to ranks).
    """
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    rng = checkpoint.get("rng") or []
    histories = checkpoint.get("histories") or []
    history: list[EpochRecord] = []
    if len(rng) == comm.size:  # same world: each rank continues its own random stream
        torch.set_rng_state(rng[comm.rank]["cpu"])
        if device.type == "cuda" and "cuda" in rng[comm.rank]:
            torch.cuda.set_rng_state(rng[comm.rank]["cuda"], device)
    if len(histories) == comm.size:
        history = [EpochRecord(**record) for record in histories[comm.rank]]
    position = int(checkpoint["epoch"]), int(checkpoint["step"]), int(checkpoint["global_step"])
    return position, history
