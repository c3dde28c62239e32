"""The optimizer and learning-rate schedule a run asks for."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["build_optimizer", "build_scheduler"]


def build_optimizer(
    params: Iterable[nn.Parameter],
    name: str = "adam",
    lr: float = 1e-3,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """Adam or SGD with momentum over `params`."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"optimizer={name!r} is unknown; choose adam or sgd")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    schedule: str,
    total_steps: int,
    steps_per_epoch: int,
    step_epochs: int = 30,
    gamma: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step schedule, a pure function of the step count (so its state is one integer).

    Args:
        optimizer: the optimizer whose rate it sets.
        schedule: "cosine" decays to 0 over total_steps; "constant" keeps the rate; "step"
            multiplies it by gamma every step_epochs epochs.
        total_steps: optimizer steps in the whole run.
        steps_per_epoch: optimizer steps in one epoch.
        step_epochs, gamma: the step schedule's period and factor.
    """
    if schedule == "cosine":

        def factor(step: int) -> float:
            return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))

    elif schedule == "constant":

        def factor(step: int) -> float:
            return 1.0

    elif schedule == "step":

        def factor(step: int) -> float:
            return gamma ** ((step // steps_per_epoch) // step_epochs)

    else:
        raise ValueError(f"lr_schedule={schedule!r} is unknown; choose cosine, constant or step")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
