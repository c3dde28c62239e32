"""SSFTT of Sun et al. (2022): a convolutional tokenizer, then a small transformer encoder.

L. Sun, G. Zhao, Y. Zheng, Z. Wu, "Spectral-Spatial Feature Tokenization Transformer for
Hyperspectral Image Classification", IEEE TGRS 60, 2022 (reference code
github.com/zgr6010/HSI_SSFTT: PCA 30, patch 13, 4 tokens of 64, one encoder layer of 8 heads,
dropout 0.1, Adam 1e-3, batch 64, 100 epochs; OA 98.62% on Indian Pines at 10%).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SSFTT", "build_ssftt"]


class _Encoder(nn.Module):
    """One pre-norm transformer layer: multi-head self-attention, then a small MLP."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        # The reference code scales by the model width, not the head width: kept, since
        # it sets how sharp the attention is at the published settings.
        self.scale = dim**-0.5
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.project = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout))
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, tokens, dim = x.shape
        q, k, v = (
            self.qkv(self.norm1(x)).reshape(n, tokens, 3, self.heads, dim // self.heads)
            .permute(2, 0, 3, 1, 4)
        )  # fmt: skip
        weights = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(n, tokens, dim)
        x = x + self.project(attended)
        return x + self.mlp(self.norm2(x))


class SSFTT(nn.Module):
    """Conv3D 8@3x3x3 + BN, Conv2D 64@3x3 + BN, 4 Gaussian-weighted tokens, a class token,
    one transformer layer (8 heads, MLP 8), then a linear classifier on the class token.

    Input: (N, C, P, P) with C >= 3 spectral channels (30 after PCA in the paper) and P >= 5
    odd (default 13): the convolutions leave (P-4)^2 spatial features, which the tokenizer
    pools into 4 tokens by learned attention.
    """

    def __init__(
        self,
        bands: int,
        num_classes: int,
        patch_size: int = 13,
        dropout: float = 0.1,
        tokens: int = 4,
        dim: int = 64,
        heads: int = 8,
        mlp_dim: int = 8,
    ) -> None:
        super().__init__()
        if bands < 3:
            raise ValueError(f"ssftt needs >= 3 spectral channels, got bands={bands}")
        if patch_size < 5 or patch_size % 2 == 0:
            raise ValueError(f"ssftt needs an odd patch_size >= 5, got {patch_size}")
        self.conv3d = nn.Sequential(nn.Conv3d(1, 8, 3), nn.BatchNorm3d(8), nn.ReLU())
        self.conv2d = nn.Sequential(
            nn.Conv2d(8 * (bands - 2), dim, 3), nn.BatchNorm2d(dim), nn.ReLU()
        )
        # Tokenizer: each token is a softmax-weighted sum of the projected spatial features.
        self.token_attention = nn.Parameter(nn.init.xavier_normal_(torch.empty(1, tokens, dim)))
        self.token_value = nn.Parameter(nn.init.xavier_normal_(torch.empty(1, dim, dim)))
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(nn.init.normal_(torch.empty(1, tokens + 1, dim), std=0.02))
        self.embed_dropout = nn.Dropout(dropout)
        self.encoder = _Encoder(dim, heads, mlp_dim, dropout)
        self.classifier = nn.Linear(dim, num_classes)
        nn.init.xavier_uniform_(self.classifier.weight)
        nn.init.normal_(self.classifier.bias, std=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (N, C, P, P) patches to (N, K) logits."""
        h = self.conv3d(x.unsqueeze(1)).flatten(1, 2)  # (N, 8 (C-2), P-2, P-2)
        features = self.conv2d(h).flatten(2).transpose(1, 2)  # (N, (P-4)^2, dim)
        # (N, tokens, features): how much each spatial feature feeds each token.
        weights = (features @ self.token_attention.transpose(1, 2)).transpose(1, 2).softmax(-1)
        tokens = weights @ (features @ self.token_value)
        cls = self.class_token.expand(x.shape[0], -1, -1)
        h = self.embed_dropout(torch.cat([cls, tokens], dim=1) + self.position)
        return self.classifier(self.encoder(h)[:, 0])


def build_ssftt(*, bands: int, num_classes: int, patch_size: int, dropout: float) -> nn.Module:
    """Factory for :class:`SSFTT`."""
    return SSFTT(bands, num_classes, patch_size, dropout)
