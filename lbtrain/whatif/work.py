"""The work of one training sample, counted from a workload's model: FLOP and bytes moved.

`count_work` runs the forward pass, the loss and the backward pass on the *meta* device
(shapes only: no memory, no arithmetic, milliseconds) under `torch.utils.flop_counter`'s
`FlopCounterMode`, which counts the FLOP of every matrix product and convolution, and under a
dispatch mode that adds up the bytes each operator reads and writes. Counted at two batch
sizes, the difference per sample is what grows with the batch (activations), the rest is
fixed per step (weights, gradients).

The bytes are an upper bound on memory traffic: every operator is taken to read its inputs
from memory and write its outputs back, with no reuse in caches. The roofline built from
them (`lbtrain.whatif.predict.Roofline`) is a bound; a profile of the device kind calibrates
it to what the device reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from lbtrain.workloads import Workload

__all__ = ["META_ERRORS", "ModelWork", "count_work", "meta_error"]

# What a model raises on the meta device when its step needs real values (data-dependent
# shapes, .item()).
META_ERRORS = (RuntimeError, NotImplementedError, TypeError, ValueError)


def meta_error(workload: Workload, what: str, exc: BaseException, hint: str = "") -> ValueError:
    """The one line for a model whose `what` (step, layers) cannot run on the meta device."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ValueError(
        f"workload {workload.name!r}: its model's {what} cannot be counted on the meta "
        f"device ({first}){hint}"
    )


@dataclass(frozen=True)
class ModelWork:
    """One training step's work, per sample and fixed, and the gradient it allreduces.

    Args:
        flops_per_sample: FLOP of forward and backward per sample.
        bytes_per_sample: bytes read and written per sample (upper bound, no cache reuse).
        fixed_bytes: bytes read and written per step whatever the batch (weights, gradients).
        parameters: trainable parameters.
        gradient_bytes: bytes of their gradients: what each step allreduces.
        description: the model and the sample shape counted.
        saved_bytes_per_sample: bytes autograd keeps for the backward pass per sample (the
            activations that bound a device's batch); 0 when not counted.
    """

    flops_per_sample: float
    bytes_per_sample: float
    fixed_bytes: float
    parameters: int
    gradient_bytes: int
    description: str
    saved_bytes_per_sample: float = 0.0


class _ByteCounter(TorchDispatchMode):
    """Adds up the bytes of every tensor each operator takes or returns."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.total += sum(
            t.numel() * t.element_size()
            for t in tree_flatten((args, kwargs, out))[0]
            if isinstance(t, torch.Tensor)
        )
        return out


def _one_step(workload: Workload, model: torch.nn.Module, batch: int) -> tuple[int, int, int]:
    """FLOP, bytes moved and bytes saved for backward of one forward, loss and backward at
    `batch` samples, on meta tensors."""
    inputs, targets = workload.make_batch(batch, torch.device("meta"))
    model.zero_grad(set_to_none=True)
    flops, moved = FlopCounterMode(display=False), _ByteCounter()
    with flops, moved:
        workload.loss_fn(model(inputs), targets).backward()
    return flops.get_total_flops(), moved.total, _saved_bytes(workload, model, inputs, targets)


def _saved_bytes(
    workload: Workload, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> int:
    """Bytes autograd keeps for the backward pass of one forward and loss.

    A pass of its own: the saved-tensor hooks make autograd dispatch operators of its own,
    which the byte counter would count.
    """
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        # A tensor kept by two operators is held once. The graph holds every packed tensor
        # until the pass ends, so no two of them share an id.
        saved[id(tensor)] = tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        workload.loss_fn(model(inputs), targets)
    return sum(saved.values())


def count_work(workload: Workload, batches: tuple[int, int] = (4, 8)) -> ModelWork:
    """Count the work of one training sample of `workload` (see the module docstring).

    Args:
        workload: its model, sample shape, loss and synthetic batches are used.
        batches: the two batch sizes counted; their difference gives the per-sample part.

    Raises:
        ValueError: batch sizes that are not two increasing sizes >= 1, or a model whose
            step cannot run on the meta device.
    """
    small, large = batches
    if not 1 <= small < large:
        raise ValueError(f"batches={batches!r} must be two increasing sizes >= 1")
    model = workload.build_model().to("meta").train()
    try:
        (f1, b1, s1), (f2, b2, s2) = (
            _one_step(workload, model, small),
            _one_step(workload, model, large),
        )
    except META_ERRORS as exc:
        raise meta_error(
            workload, "step", exc, "; give --flops-per-sample and --bytes-per-sample instead"
        ) from None
    per_flops, per_bytes = (f2 - f1) / (large - small), (b2 - b1) / (large - small)
    trainable = [p for p in model.parameters() if p.requires_grad]
    shape = "x".join(str(s) for s in workload.sample_shape)
    return ModelWork(
        flops_per_sample=max(0.0, per_flops),
        bytes_per_sample=max(0.0, per_bytes),
        fixed_bytes=max(0.0, b1 - small * per_bytes),
        parameters=sum(p.numel() for p in trainable),
        gradient_bytes=sum(p.numel() * p.element_size() for p in trainable),
        description=f"{type(model).__name__} on {shape} samples",
        saved_bytes_per_sample=max(0.0, (s2 - s1) / (large - small)),
    )
