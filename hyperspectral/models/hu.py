"""1-D spectral CNN of Hu et al. (2015)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["HuEtAl", "build_hu"]


class HuEtAl(nn.Module):
    """Spectral 1-D CNN: conv(20 filters) -> max-pool -> tanh -> FC 100 -> tanh -> classes.

    W. Hu, Y. Huang, L. Wei, F. Zhang, H. Li, "Deep Convolutional Neural Networks for
    Hyperspectral Image Classification", Journal of Sensors, 2015, doi:10.1155/2015/258619.
    Kernel ``ceil(B / 9)`` and pool ``ceil(kernel / 5)`` follow the paper (and DeepHyperX).

    Input: (N, B, P, P); only the centre pixel's spectrum is used (default P = 1).
    """

    def __init__(self, bands: int, num_classes: int, dropout: float = 0.0) -> None:
        super().__init__()
        kernel = math.ceil(bands / 9)
        pool = math.ceil(kernel / 5)
        self.conv = nn.Conv1d(1, 20, kernel)
        self.pool = nn.MaxPool1d(pool)
        features = 20 * ((bands - kernel + 1) // pool)
        self.fc1 = nn.Linear(features, 100)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(100, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (N, B, P, P) patches to (N, K) logits."""
        c = x.shape[-1] // 2
        spectrum = x[:, :, c, c].unsqueeze(1)
        h = torch.tanh(self.pool(self.conv(spectrum))).flatten(1)
        return self.fc2(self.drop(torch.tanh(self.fc1(h))))


def build_hu(*, bands: int, num_classes: int, patch_size: int, dropout: float) -> nn.Module:
    """Factory for :class:`HuEtAl`; any odd ``patch_size`` works (the centre is used)."""
    return HuEtAl(bands, num_classes, dropout)
