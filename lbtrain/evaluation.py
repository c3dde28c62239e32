"""Evaluation across ranks: a state that ranks can sum, shares sized by speed, prediction.

Evaluation sums the evaluator's state (a confusion matrix) over ranks, so the metrics are
those of the whole set, not averages of per-rank metrics. Prediction of a whole dataset (a
scene's every pixel) is cut into contiguous strips, gathered in order. Also what a
workload's artifact hook receives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from lbtrain.comm import Communicator

# Told (items done, items in all) on this rank: once before the first batch, then after each.
Progress = Callable[[int, int], None]

__all__ = [
    "ArtifactContext",
    "ConfusionEvaluator",
    "Evaluator",
    "evaluate",
    "predict",
    "share_bounds",
]


class Evaluator(Protocol):
    """Scores predictions into a state that ranks can sum, then summarises the total.

    The state is a numpy array (a confusion matrix, counts), so a distributed evaluation is
    one sum-allreduce of it: metrics such as kappa are not averages of per-rank values.
    """

    headline: tuple[str, ...]

    def new_state(self) -> np.ndarray:
        """An all-zero state."""

    def update(self, state: np.ndarray, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Add one batch's (outputs, targets) to `state`, in place."""

    def summarize(self, state: np.ndarray) -> dict[str, Any]:
        """JSON-ready metrics of a (summed) state; keys in `headline` are shown to the user."""


def _accuracy(confusion: np.ndarray) -> dict[str, Any]:
    total = int(confusion.sum())
    if total == 0:
        raise ValueError("no evaluation samples were scored; the evaluation set is empty")
    return {"accuracy": float(np.trace(confusion) / total), "total": total}


class ConfusionEvaluator:
    """Classification scored by a (K, K) confusion matrix: rows true class, columns predicted.

    Args:
        num_classes: K.
        summarize: metrics of a summed confusion matrix; default overall accuracy.
        headline: metric names to print at the end of training.
    """

    def __init__(
        self,
        num_classes: int,
        summarize: Callable[[np.ndarray], dict[str, Any]] | None = None,
        headline: tuple[str, ...] = ("accuracy",),
    ) -> None:
        if num_classes < 2:
            raise ValueError(f"num_classes={num_classes} must be >= 2")
        self.num_classes = num_classes
        self._summarize = summarize or _accuracy
        self.headline = headline

    def new_state(self) -> np.ndarray:
        """A zero (K, K) int64 matrix."""
        return np.zeros((self.num_classes, self.num_classes), dtype=np.int64)

    def update(self, state: np.ndarray, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Count (target, argmax) pairs of one batch into `state`."""
        k = self.num_classes
        pred = outputs.argmax(1).to("cpu", torch.int64)
        true = targets.to("cpu", torch.int64)
        counts = torch.bincount(true * k + pred, minlength=k * k)
        state += counts.reshape(k, k).numpy()

    def summarize(self, state: np.ndarray) -> dict[str, Any]:
        """The metrics of a summed confusion matrix."""
        return self._summarize(state)


@dataclass(frozen=True)
class ArtifactContext:
    """What a workload's rank-0 artifact hook receives after the final evaluation.

    Args:
        out_dir: the run's output folder (exists).
        metrics: the final metrics from the evaluator's `summarize`.
        predictions: the model's class for every item of the workload's `predict_set`, in
            order (None when the workload has no predict_set).
        title: a short line naming the run, for figure titles.
    """

    out_dir: Path
    metrics: Mapping[str, Any]
    predictions: np.ndarray | None
    title: str = ""


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


def _counted(batches: DataLoader, total: int, progress: Progress | None) -> Iterator[Any]:
    """The `batches`, telling `progress` how many of the `total` items have gone by (every
    batch is full but the last, whatever a collate function makes of the items)."""
    if progress is None:
        yield from batches
        return
    done, size = 0, batches.batch_size or 1
    progress(done, total)
    for batch in batches:
        yield batch
        done = min(done + size, total)
        progress(done, total)


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
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Score `dataset` across ranks and return the metrics of the summed state; collective.
    `progress` hears this rank's items done and in all, before the first batch and after each.
    """
    start, stop = share_bounds(len(dataset), weights)[comm.rank]  # type: ignore[arg-type]
    state = evaluator.new_state()
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for inputs, targets in _counted(
            _batches(dataset, start, stop, batch_size, collate_fn), stop - start, progress
        ):
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
    progress: Progress | None = None,
) -> np.ndarray:
    """The argmax class of every item of `dataset`, in order, on every rank; collective.

    Each rank predicts one strip of whole units (rows), sized by its weight; the strips are
    gathered in rank order, which is the dataset's order. `progress` as in `evaluate`.
    """
    start, stop = share_bounds(len(dataset), weights, unit)[comm.rank]  # type: ignore[arg-type]
    parts = []
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        batches = _batches(dataset, start, stop, batch_size, collate_fn)
        for inputs, _ in _counted(batches, stop - start, progress):
            parts.append(model(inputs.to(device)).argmax(1).to("cpu", torch.int32).numpy())
    model.train(was_training)
    mine = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
    return np.concatenate(comm.allgather(mine))
