"""A deep ensemble: several copies of one model, trained side by side in one run.

Each member starts from its own initial weights (they are built one after the other, so
each draws its own random numbers) and is trained on its own loss, never on each other's
outputs, as in Lakshminarayanan et al. (2017). Training the mean prediction instead lets the
members lean on one another and loses most of the gain (Jeffares et al., "Joint training of
deep ensembles fails due to learner collusion", 2023). With ``own_batches`` each member also
reads the training samples in its own order (:class:`hyperspectral.patches.MemberBatches`),
as separately trained models would; otherwise all read the same batches.

The ensemble is one ``nn.Module``, so the trainer, the balancer and the exactness of the
multi-rank update treat it like any other model.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["Ensemble", "member_cross_entropy", "member_correct_predictions"]


class Ensemble(nn.Module):
    """``members`` copies of a classifier that maps (N, ...) inputs to (N, K) logits.

    In training mode the forward pass returns every member's logits, stacked as (N, K, M),
    for :func:`member_cross_entropy`. In eval mode it returns the log of the members' mean
    probability, (N, K): its arg-max is the ensemble's prediction, and any (N, K) consumer
    (an evaluator, a map) reads it as it reads one model's logits.
    """

    def __init__(
        self, build: Callable[[], nn.Module], members: int, own_batches: bool = False
    ) -> None:
        super().__init__()
        if members < 2:
            raise ValueError(f"an ensemble needs >= 2 members, got {members}")
        self.members = nn.ModuleList(build() for _ in range(members))
        self.own_batches = own_batches

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, K, M) member logits while training, (N, K) log mean probabilities otherwise.

        With ``own_batches``, a training input holds one sample per member, (N, M, ...),
        and member ``m`` reads ``x[:, m]`` (:class:`hyperspectral.patches.MemberBatches`);
        otherwise every member reads the same (N, ...) input.
        """
        if self.training and self.own_batches:
            if x.dim() < 2 or x.shape[1] != len(self.members):
                raise ValueError(
                    f"an ensemble of {len(self.members)} members with its own batches takes "
                    f"(N, {len(self.members)}, ...) inputs in training, got {tuple(x.shape)}"
                )
            logits = torch.stack([m(x[:, i]) for i, m in enumerate(self.members)], dim=-1)
        else:
            logits = torch.stack([member(x) for member in self.members], dim=-1)
        if self.training:
            return logits
        return logits.log_softmax(dim=1).logsumexp(dim=-1) - math.log(len(self.members))


def member_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (N, K) logits, or the mean of each member's for (N, K, M) ones,
    against (N,) targets or, when each member read its own samples, (N, M) ones.

    A mean over the samples either way, so the trainer's weighting of each rank's gradient
    by its share of the global batch stays exact.
    """
    if outputs.dim() == 3 and targets.dim() == 1:
        targets = targets.unsqueeze(-1).expand(-1, outputs.shape[-1])
    return nn.functional.cross_entropy(outputs, targets)


def member_correct_predictions(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Correct arg-max predictions of (N, K) logits, or of the members' mean probability;
    with (N, M) targets (each member read its own samples) the members' mean count."""
    outputs = outputs.detach()
    if targets.dim() == 2:
        return float((outputs.argmax(1) == targets).float().mean(1).sum())
    if outputs.dim() == 3:
        outputs = outputs.softmax(dim=1).mean(dim=-1)
    return float((outputs.argmax(1) == targets).sum())
