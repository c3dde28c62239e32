"""3-D CNN of Ben Hamida et al. (2018)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["HamidaEtAl", "build_hamida"]


class HamidaEtAl(nn.Module):
    """3-D CNN alternating 3x3x3 convolutions and spectral strided "pooling" convolutions.

    A. Ben Hamida, A. Benoit, P. Lambert, C. Ben Amar, "3-D Deep Learning Approach for Remote
    Sensing Image Classification", IEEE TGRS 56(8), 2018, doi:10.1109/TGRS.2018.2818945.
    Layer sizes as in DeepHyperX's ``HamidaEtAl``.

    Input: (N, B, P, P), P >= 3 odd (default 5); treated as a 1-channel volume B x P x P.
    """

    def __init__(
        self, bands: int, num_classes: int, patch_size: int = 5, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if patch_size < 3 or patch_size % 2 == 0:
            raise ValueError(f"hamida needs an odd patch_size >= 3, got {patch_size}")
        # A 3x3 patch would vanish after two unpadded 3x3 convolutions.
        pad = 1 if patch_size == 3 else 0
        self.features = nn.Sequential(
            nn.Conv3d(1, 20, (3, 3, 3), padding=(1, pad, pad)),
            nn.ReLU(),
            nn.Conv3d(20, 20, (3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0)),
            nn.ReLU(),
            nn.Conv3d(20, 35, (3, 3, 3), padding=(1, 0, 0)),
            nn.ReLU(),
            nn.Conv3d(35, 35, (3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0)),
            nn.ReLU(),
            nn.Conv3d(35, 35, (3, 1, 1), padding=(1, 0, 0)),
            nn.ReLU(),
            nn.Conv3d(35, 35, (2, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0)),
            nn.ReLU(),
        )
        with torch.no_grad():
            n = self.features(torch.zeros(1, 1, bands, patch_size, patch_size)).numel()
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(n, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (N, B, P, P) patches to (N, K) logits."""
        return self.fc(self.drop(self.features(x.unsqueeze(1)).flatten(1)))


def build_hamida(*, bands: int, num_classes: int, patch_size: int, dropout: float) -> nn.Module:
    """Factory for :class:`HamidaEtAl`."""
    return HamidaEtAl(bands, num_classes, patch_size, dropout)
