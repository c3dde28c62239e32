"""Distributed evaluation and prediction: each rank takes a contiguous share sized by speed.

Evaluation sums the evaluator's state (a confusion matrix) over ranks, so the metrics are
those of the whole set, not averages of per-rank metrics. Prediction of a whole dataset (a
scene's every pixel) is cut into contiguous strips, gathered in order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from lbtrain.comm import Communicator
from lbtrain.workloads import Evaluator

__all__ = ["evaluate", "predict", "share_bounds"]


def share_bounds(total: int, weights: Sequence[float], unit: int = 1) -> list[tuple[int, int]]:
    """Contiguous [start, stop) ranges of `total` items, one per rank, sized by `weights`.

    Boundaries fall on multiples of `unit` (whole rows of a scene), except the last, which
    ends at `total`. Every item belongs to exactly one range; a range may be empty.
    """
    if unit < 1:
        raise ValueError(f"unit={unit} must be >= 1")
    weight_sum = float(sum(weights))
    if not weight_sum > 0:
        raise ValueError(f"weights {list(weights)} must have a positive sum")
    units = math.ceil(total / unit)
    bounds, cumulative = [0], 0.0
    for weight in weights[:-1]:
        cumulative += weight
        bounds.append(min(total, round(units * cumulative / weight_sum) * unit))
    bounds.append(total)
    return [(bounds[i], max(bounds[i], bounds[i + 1])) for i in range(len(weights))]


def _batches(
    dataset: Dataset, start: int, stop: int, batch_size: int, collate_fn: Callable | None
) -> DataLoader:
    # A Subset keeps a dataset's vectorised __getitems__, so a batch is one indexing call.
    # Its own generator: evaluating must not draw from the RNG that training's dropout uses.
    return DataLoader(
        Subset(dataset, range(start, stop)),
        batch_size=batch_size,
        collate_fn=collate_fn,
        generator=torch.Generator(),
    )


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    evaluator: Evaluator,
    comm: Communicator,
    weights: Sequence[float],
    *,
    device: torch.device,
    batch_size: int = 256,
    collate_fn: Callable | None = None,
) -> dict[str, Any]:
    """Score `dataset` across ranks and return the metrics of the summed state; collective."""
    start, stop = share_bounds(len(dataset), weights)[comm.rank]  # type: ignore[arg-type]
    state = evaluator.new_state()
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for inputs, targets in _batches(dataset, start, stop, batch_size, collate_fn):
            evaluator.update(state, model(inputs.to(device)), targets)
    model.train(was_training)
    state = np.ascontiguousarray(state)
    comm.allreduce_sum_(state)
    return evaluator.summarize(state)


def predict(
    model: nn.Module,
    dataset: Dataset,
    comm: Communicator,
    weights: Sequence[float],
    *,
    device: torch.device,
    unit: int = 1,
    batch_size: int = 256,
    collate_fn: Callable | None = None,
) -> np.ndarray:
    """The argmax class of every item of `dataset`, in order, on every rank; collective.

    Each rank predicts one strip of whole units (rows), sized by its weight; the strips are
    gathered in rank order, which is the dataset's order.
    """
    start, stop = share_bounds(len(dataset), weights, unit)[comm.rank]  # type: ignore[arg-type]
    parts = []
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for inputs, _ in _batches(dataset, start, stop, batch_size, collate_fn):
            parts.append(model(inputs.to(device)).argmax(1).to("cpu", torch.int32).numpy())
    model.train(was_training)
    mine = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
    return np.concatenate(comm.allgather(mine))
