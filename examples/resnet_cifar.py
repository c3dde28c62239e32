"""ResNet-44 for CIFAR-10-sized samples (He et al. 2016, section 4.2), as an lbtrain workload.

It is what `lbtrain what-if --count-flops` counts to compare the what-if model with a
published scaling table (scripts/bench_published_scaling.py, BENCHMARKS.md): 3 stages of 7
basic blocks at 16, 32 and 64 channels, identity shortcuts that subsample and pad with zeros
(the paper's option A, no parameters), 0.66 M parameters. Its data are random images with
random labels: it is for counting and timing, not for accuracy. From the repository root:

    python -m lbtrain what-if --workload examples.resnet_cifar:workload --count-flops \
        --cluster "12x v100@4" --network "intra=150GB/s,5us; inter=100Gb/s,2us" \
        --scaling weak --batch-per-device 128 --max-devices 12
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain.workloads import ConfusionEvaluator, Workload, correct_predictions

__all__ = ["ResNetCifar", "workload"]


class _Block(nn.Module):
    """Two 3x3 convolutions with batch norm; the shortcut subsamples and pads channels."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False),
            nn.BatchNorm2d(outputs),
            nn.ReLU(),
            nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False),
            nn.BatchNorm2d(outputs),
        )
        self.stride, self.extra = stride, outputs - inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x[:, :, :: self.stride, :: self.stride]
        if self.extra:
            shortcut = nn.functional.pad(shortcut, (0, 0, 0, 0, 0, self.extra))
        return torch.relu(self.body(x) + shortcut)


class ResNetCifar(nn.Module):
    """ResNet-(6n+2) for 3x32x32 images: n = 7 gives ResNet-44."""

    def __init__(self, n: int = 7, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        ]  # fmt: skip
        width = 16
        for stage, channels in enumerate((16, 32, 64)):
            for block in range(n):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(_Block(width, channels, stride))
                width = channels
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 3, 32, 32) images to (N, classes) logits."""
        return self.layers(x)


def _random_images(count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(count, 3, 32, 32, generator=generator)
    return TensorDataset(images, torch.randint(0, 10, (count,), generator=generator))


def workload(seed: int = 0) -> Workload:
    """ResNet-44 on 512 random 3x32x32 images of 10 classes (for counting and timing)."""
    return Workload(
        name="resnet44-cifar",
        build_model=ResNetCifar,
        sample_shape=(3, 32, 32),
        num_classes=10,
        train_set=_random_images(512, seed),
        eval_set=_random_images(128, seed + 1),
        evaluator=ConfusionEvaluator(10),
        step_metric=correct_predictions,
        description="ResNet-44 (CIFAR-10 shapes, random data), He et al. 2016",
    )
