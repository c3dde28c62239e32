"""HybridSN of Roy et al. (2019): 3-D convolutions, then a 2-D convolution, then dense layers."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["HybridSN", "build_hybridsn"]


class HybridSN(nn.Module):
    """Conv3D 8@7x3x3 -> 16@5x3x3 -> 32@3x3x3, Conv2D 64@3x3, dense 256 -> 128, classifier.

    S. K. Roy, G. Krishna, S. R. Dubey, B. B. Chaudhuri, "HybridSN: Exploring 3-D-2-D CNN
    Feature Hierarchy for Hyperspectral Image Classification", IEEE GRSL 17(2), 2020,
    arXiv:1902.06701; reference Keras code github.com/gokriznastic/HybridSN (PCA 30,
    patch 25, dropout 0.4, Adam 1e-3, batch 256).

    Input: (N, C, P, P) with C >= 13 spectral channels (30 after PCA in the paper) and
    P >= 9 odd (default 25).
    """

    def __init__(
        self, bands: int, num_classes: int, patch_size: int = 25, dropout: float = 0.4
    ) -> None:
        super().__init__()
        if bands < 13:
            raise ValueError(f"hybridsn needs >= 13 spectral channels, got bands={bands}")
        if patch_size < 9 or patch_size % 2 == 0:
            raise ValueError(f"hybridsn needs an odd patch_size >= 9, got {patch_size}")
        self.conv3d = nn.Sequential(
            nn.Conv3d(1, 8, (7, 3, 3)),
            nn.ReLU(),
            nn.Conv3d(8, 16, (5, 3, 3)),
            nn.ReLU(),
            nn.Conv3d(16, 32, (3, 3, 3)),
            nn.ReLU(),
        )
        depth, side = bands - 12, patch_size - 6
        self.conv2d = nn.Sequential(nn.Conv2d(32 * depth, 64, 3), nn.ReLU())
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * (side - 2) ** 2, 256),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(256, 128),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(128, num_classes),
        )
        # Glorot-uniform weights and zero biases, as Keras (the reference code) initialises.
        for m in self.modules():
            if isinstance(m, nn.Conv3d | nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (N, C, P, P) patches to (N, K) logits."""
        h = self.conv3d(x.unsqueeze(1))  # (N, 32, C-12, P-6, P-6)
        h = h.flatten(1, 2)  # fold spectral depth into channels for the 2-D stage
        return self.head(self.conv2d(h))


def build_hybridsn(*, bands: int, num_classes: int, patch_size: int, dropout: float) -> nn.Module:
    """Factory for :class:`HybridSN`."""
    return HybridSN(bands, num_classes, patch_size, dropout)
