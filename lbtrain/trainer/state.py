"""What a checkpoint holds, and putting it back: an explicit list, nothing by accident.

Model, optimizer, schedule, each rank's RNG, the run's position, the plan in force and the
profiles it came from, each rank's running totals and its interrupted epoch, and the
state of every callback that has one (the re-planner's memory, the divergence guard, the
evaluations so far). The per-epoch history is not here: it streams to metrics.jsonl, so a
checkpoint's size does not grow with the epochs run.
"""

from __future__ import annotations

from typing import Any

import torch

from lbtrain.balancer import BalancePlan
from lbtrain.profiling import ReplicaProfile
from lbtrain.trainer.config import TrainConfig
from lbtrain.trainer.engine import Engine
from lbtrain.trainer.records import EpochRecord, Totals
from lbtrain.workloads import Workload

__all__ = ["checkpoint_state", "restore", "same_plan"]

FORMAT = 2  # checkpoints of format 1 kept the whole epoch history


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def checkpoint_state(
    engine: Engine,
    profiles: list[ReplicaProfile] | None,
    config: TrainConfig,
    workload: Workload,
    devices: list[dict[str, Any]],
) -> dict[str, Any]:
    """Everything needed to continue exactly; collective (it gathers every rank's RNG
    state, totals and interrupted epoch)."""
    state, comm = engine.state, engine.comm
    record = state.record.to_dict() if state.record is not None and state.step else None
    ranks = comm.allgather(
        {"rng": _rng_state(engine.device), "totals": state.totals.state_dict(), "record": record}
    )
    return {
        "format": FORMAT,
        "model": {k: v.detach().cpu() for k, v in engine.model.state_dict().items()},
        "optimizer": engine.optimizer.state_dict(),
        "scheduler": engine.scheduler.state_dict(),
        "epoch": state.epoch,
        "step": state.step,
        "global_step": state.global_step,
        "ranks": ranks,
        "callbacks": {c.key: c.state_dict() for c in engine.callbacks if c.key},
        "plan": engine.loader.plan.to_dict(),
        "profiles": [p.to_dict() for p in profiles] if profiles else None,
        "config": config.to_dict(),
        "signature": dict(workload.signature),
        "devices": devices,
    }


def restore(checkpoint: dict[str, Any], engine: Engine, *, same_plan: bool) -> None:
    """Load a checkpoint into the engine: weights, optimizer, schedule, position; on the
    same world size also each rank's RNG stream, totals and interrupted epoch, on another
    the job's totals and interrupted epoch (its loss, samples, steps and seconds; each
    rank's time split starts afresh); with the same plan also the callbacks' memories (a
    new plan starts the re-planner afresh)."""
    engine.model.load_state_dict(checkpoint["model"])
    engine.optimizer.load_state_dict(checkpoint["optimizer"])
    engine.scheduler.load_state_dict(checkpoint["scheduler"])
    state, comm = engine.state, engine.comm
    state.epoch, state.step = int(checkpoint["epoch"]), int(checkpoint["step"])
    state.global_step = int(checkpoint["global_step"])
    ranks = checkpoint.get("ranks") or []
    if len(ranks) == comm.size:  # same world: each rank continues its own streams
        mine = ranks[comm.rank]
        torch.set_rng_state(mine["rng"]["cpu"])
        if engine.device.type == "cuda" and "cuda" in mine["rng"]:
            torch.cuda.set_rng_state(mine["rng"]["cuda"], engine.device)
        state.totals = Totals.from_state(mine["totals"])
        if mine.get("record") is not None:
            state.record = EpochRecord(**mine["record"])
    elif ranks:  # another world: the job's figures go on, each rank's time split starts here
        state.totals = Totals.from_state(ranks[0]["totals"]).job_wide()
        if ranks[0].get("record") is not None:
            state.record = EpochRecord(**ranks[0]["record"]).job_wide(
                batch_sizes=list(engine.loader.plan.batch_sizes),
                slowdown=engine.slowdown_at(state.epoch).factor,
            )
    saved = checkpoint.get("callbacks") or {}
    for callback in engine.callbacks:
        if callback.key in saved and saved[callback.key] is not None:
            if callback.key == "replanner" and not (same_plan and len(ranks) == comm.size):
                continue
            callback.load_state_dict(saved[callback.key])


def same_plan(checkpoint: dict[str, Any], plan: BalancePlan) -> bool:
    """Whether the run continues under the checkpoint's plan."""
    return BalancePlan.from_dict(checkpoint["plan"]).to_dict() == plan.to_dict()
