"""examples/resnet_cifar.py: the ResNet-44 that what-if counts against the published table."""

from __future__ import annotations

import torch

from examples.resnet_cifar import ResNetCifar, workload
from lbtrain.whatif.work import count_work


def test_resnet44_has_the_papers_size_and_classifies_cifar_shapes():
    # He et al. 2016, table 6: ResNet-44 has 0.66 M parameters (option A shortcuts).
    model = ResNetCifar(n=7)
    assert sum(p.numel() for p in model.parameters()) == 658_586
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) == 43  # + 1 linear


def test_what_if_counts_its_step():
    work = count_work(workload())
    assert work.parameters == 658_586
    assert work.gradient_bytes == 4 * 658_586
    # Forward about 97 M multiply-adds a sample, so about 3 x 2 x 97 M FLOP with backward.
    assert 5e8 < work.flops_per_sample < 7e8
