"""A complete custom workload: interleaved 2-D spirals, trained and profiled by `lbtrain`.

Run it from the repository root (the folder that holds `examples/`), so that Python finds
the module:

    python -m lbtrain train --workload examples.my_workload:workload --arms 4 --epochs 30 --lr 0.01
    PYTHONPATH=. mpiexec -n 3 lbtrain train --workload examples.my_workload:workload \
        --lr 0.01 --emulate-slowdown 1,2,4
    python -m lbtrain profile --workload examples.my_workload:workload --output spirals.json

docs/workloads.md explains every field; tests/unit/test_example_workload.py trains and
profiles this file, so what it shows keeps working.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain.outputs import atomic_write_text
from lbtrain.workloads import (
    ArtifactContext,
    ConfusionEvaluator,
    Workload,
    WorkloadOption,
    WorkloadPlugin,
    correct_predictions,
)

__all__ = ["GRID", "build", "workload"]

GRID = 24  # the decision map is GRID x GRID points over [-1.5, 1.5]^2


def _spirals(arms: int, points: int, noise: float, seed: int) -> TensorDataset:
    """`points` noisy points on each of `arms` spiral arms; the label is the arm."""
    generator = torch.Generator().manual_seed(seed)
    radius = torch.linspace(0.05, 1.0, points).repeat(arms)
    labels = torch.arange(arms).repeat_interleave(points)
    angle = 3.0 * radius + labels * (2 * math.pi / arms)
    xy = torch.stack([radius * angle.cos(), radius * angle.sin()], dim=1)
    xy += noise * radius[:, None] * torch.randn(xy.shape, generator=generator)
    return TensorDataset(xy, labels)


def _grid() -> TensorDataset:
    """Every point of the decision map, row by row (its targets are ignored)."""
    axis = torch.linspace(-1.5, 1.5, GRID)
    ys, xs = torch.meshgrid(axis.flip(0), axis, indexing="ij")  # the top row first
    return TensorDataset(torch.stack([xs, ys], dim=-1).reshape(-1, 2), torch.zeros(GRID * GRID))


def _draw(ctx: ArtifactContext) -> list[Path]:
    """Rank 0, after the final evaluation: the predicted arm of every map point, as text."""
    rows = ctx.predictions.reshape(GRID, GRID)
    text = "\n".join("".join(str(int(c)) for c in row) for row in rows) + "\n"
    return [atomic_write_text(Path(ctx.out_dir) / "decision.txt", text)]


def build(
    seed: int = 0, arms: int = 3, points: int = 300, noise: float = 0.1, hidden: int = 64
) -> Workload:
    """The workload; every rank calls it with the same seed and options."""
    if arms < 2 or points < 2 or hidden < 1 or not noise >= 0:
        raise ValueError(
            f"--arms {arms}, --points {points}, --hidden {hidden} and --noise {noise}: "
            "need arms >= 2, points >= 2, hidden >= 1 and noise >= 0"
        )
    return Workload(
        name="spirals",
        build_model=lambda: nn.Sequential(
            nn.Linear(2, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, arms),
        ),
        sample_shape=(2,),
        num_classes=arms,
        train_set=_spirals(arms, points, noise, seed),
        eval_set=_spirals(arms, points // 2, noise, seed + 1),
        evaluator=ConfusionEvaluator(arms),
        step_metric=correct_predictions,
        predict_set=_grid(),
        predict_unit=GRID,
        predict_note="the 24x24 grid for decision.txt",
        artifacts=_draw,
        outputs=("decision.txt",),
        signature={
            "workload": "spirals",
            "seed": seed,
            "arms": arms,
            "points": points,
            "noise": noise,
            "hidden": hidden,
        },
        description=f"{arms} spiral arms, {points} training points each",
    )


workload = WorkloadPlugin(
    build=build,
    options=(
        WorkloadOption("arms", 3, "spiral arms, one class each", type=int),
        WorkloadOption("points", 300, "training points per arm", type=int),
        WorkloadOption("noise", 0.1, "noise, relative to the radius", type=float),
        WorkloadOption("hidden", 64, "width of the MLP's two hidden layers", type=int),
    ),
    description="interleaved 2-D spirals, one class per arm (examples/my_workload.py)",
)
