"""examples/resnet_cifar.py: the ResNet-44 that what-if counts against the published table."""

from __future__ import annotations

import torch

from examples.resnet_cifar import ResNetCifar


def test_resnet44_has_the_papers_size_and_classifies_cifar_shapes():
    # He et al. 2016, table 6: ResNet-44 has 0.66 M parameters (option A shortcuts).
    model = ResNetCifar(n=7)
    assert sum(p.numel() for p in model.parameters()) == 658_586
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) == 43  # + 1 linear
