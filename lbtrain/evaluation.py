"""Evaluation state that ranks can sum, and what a workload's artifact hook receives."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["ArtifactContext", "ConfusionEvaluator", "Evaluator"]


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
