"""A fully convolutional network over a whole scene, as an lbtrain workload (for what-if).

One sample is a whole hyperspectral scene (30 bands of 1,024 x 1,024 pixels by default)
and the network labels every pixel: 3x3 convolutions at full resolution, then a 1x1
classifier. This is the model for which data parallelism runs out of samples: a step of two
scenes keeps two devices busy however many there are, and `lbtrain what-if --parallelism`
shows spatial decomposition taking over. From the repository root:

    python -m lbtrain what-if --workload examples.scene_fcn:workload --count-flops \
        --cluster "8x v100@4" --global-batch 2 --parallelism

Its data are random scenes whose pixels all carry the scene's one random label: it is for
counting and timing, not for accuracy.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from lbtrain.workloads import Workload

__all__ = ["SceneFCN", "workload"]


class SceneFCN(nn.Module):
    """`depth` 3x3 convolutions of `width` channels at full resolution, then a 1x1 classifier."""

    def __init__(self, bands: int, classes: int, width: int = 64, depth: int = 6) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Conv2d(bands if i == 0 else width, width, 3, padding=1), nn.ReLU()]
        layers.append(nn.Conv2d(width, classes, 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, bands, H, W) scenes to (N, classes, H, W) per-pixel logits."""
        return self.layers(x)


def _per_pixel_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # Each scene's one label stands for all its pixels (the synthetic data have no map).
    pixels = targets[:, None, None].expand(-1, *logits.shape[-2:])
    return nn.functional.cross_entropy(logits, pixels)


class _RandomScenes(Dataset):
    """`count` random scenes, each drawn when asked for (a scene is 126 MB at the default)."""

    def __init__(self, count: int, shape: tuple[int, ...], classes: int, seed: int) -> None:
        self.count, self.shape, self.classes, self.seed = count, shape, classes, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1000 + index)
        label = torch.randint(0, self.classes, (), generator=generator)
        return torch.randn(self.shape, generator=generator), label


def workload(seed: int = 0, bands: int = 30, size: int = 1024, classes: int = 16) -> Workload:
    """The scene FCN on 4 random scenes of `bands` x `size` x `size`."""
    return Workload(
        name="scene-fcn",
        build_model=lambda: SceneFCN(bands, classes),
        sample_shape=(bands, size, size),
        num_classes=classes,
        loss_fn=_per_pixel_loss,
        train_set=_RandomScenes(4, (bands, size, size), classes, seed),
        description=f"fully convolutional, whole {size}x{size} scenes of {bands} bands",
    )
