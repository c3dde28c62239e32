"""Per-layer work of a workload's model, for parallelisations other than data parallelism.

`count_layers` runs the model's forward, loss and backward on the *meta* device (shapes
only) with a hook on every leaf module and `torch.utils.flop_counter` per module. For each
leaf it keeps, per sample: the FLOP of its forward and backward, the bytes of its output
(what a pipeline stage boundary after it sends forward, and its gradient backward), and,
for a convolution, the halo: the rows of its input that a neighbour must send when the
image's height is split between devices (Dryden et al., IPDPS 2019).

A layer is *spatial* when its output still has a height (of more than one row) and a width:
it can run on a slab of rows. The first layer that is not (a global
pool, a flatten, a linear classifier) ends the spatial part; it and everything after it
run whole on every device of a spatial group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lbtrain.whatif.work import META_ERRORS, meta_error
from lbtrain.workloads import Workload

__all__ = ["Layer", "count_layers"]

_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class Layer:
    """One leaf module's work per sample, in execution order (`height`: its output's rows,
    0 when not spatial)."""

    name: str
    flops: float
    output_bytes: float
    halo_bytes: float
    spatial: bool
    height: int
    parameter_bytes: int


def _halo_rows(module: nn.Module) -> int:
    """Rows of input beyond its slab a convolution reads on each side (0 for others)."""
    if not isinstance(module, _CONVOLUTIONS) or module.weight.dim() < 4:
        return 0  # 1-D convolutions have no height to split
    kernel, dilation = module.kernel_size[-2], module.dilation[-2]
    # An even kernel reads more rows on one side: count the larger side for both.
    return math.ceil((kernel - 1) * dilation / 2)


def count_layers(workload: Workload, batch: int = 2) -> list[Layer]:
    """Each leaf module's work per sample, in the order the forward pass runs them.

    Raises:
        ValueError: a model whose step cannot run on the meta device, or whose layers do not
            run as one chain (one line).
    """
    model = workload.build_model().to("meta").train()
    leaves = {m: name for name, m in model.named_modules() if not list(m.children())}
    seen: list[tuple[nn.Module, Any, Any]] = []

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and inputs and isinstance(inputs[0], torch.Tensor):
            seen.append((module, inputs[0].shape, output.shape))

    handles = [m.register_forward_hook(record) for m in leaves]
    counter = FlopCounterMode(display=False)
    try:
        inputs, targets = workload.make_batch(batch, torch.device("meta"))
        with counter:
            workload.loss_fn(model(inputs), targets).backward()
    except META_ERRORS as exc:
        raise meta_error(workload, "layers", exc) from None
    finally:
        for handle in handles:
            handle.remove()
    per_module = counter.get_flop_counts()
    root = type(model).__name__
    layers, spatial = [], True
    for module, in_shape, out_shape in seen:
        name = leaves[module]
        flops = sum(per_module.get(f"{root}.{name}", {}).values()) / batch
        # (N, C, H, W) or (N, C, D, H, W) with rows left to split; a global pool ends it.
        spatial = spatial and len(out_shape) >= 4 and out_shape[-2] > 1
        row = in_shape.numel() / batch / in_shape[-2] if len(in_shape) >= 4 else 0.0
        layers.append(Layer(
            name=name,
            flops=flops,
            output_bytes=out_shape.numel() / batch * 4,
            halo_bytes=_halo_rows(module) * row * 4 if spatial else 0.0,
            spatial=spatial,
            height=int(out_shape[-2]) if spatial else 0,
            parameter_bytes=sum(p.numel() * p.element_size() for p in module.parameters()),
        ))  # fmt: skip
    _check_chain(layers, counter.get_total_flops() / batch)
    return layers


def _check_chain(layers: list[Layer], total: float) -> None:
    """Refuse a model whose leaves' FLOPs add up to more than the whole step's.

    Only branches do that: when several layers read the same input (an ensemble's members,
    a multi-branch block), torch's per-module counter charges a branch's backward to the
    next branch's first layer as well. Such a model is not the chain of layers that the
    spatial and pipeline estimates cut, so no figure is better than a wrong one.
    """
    summed = sum(layer.flops for layer in layers)
    if summed > total * (1 + 1e-6):
        raise ValueError(
            f"--parallelism models a chain of layers, but this model's layers run as "
            f"branches (their FLOPs add up to {summed / 1e6:.1f} MFLOP a sample, more than "
            f"the model's {total / 1e6:.1f}), as an ensemble's members do; leave out "
            "--parallelism for data parallelism's figures, or give one model"
        )
