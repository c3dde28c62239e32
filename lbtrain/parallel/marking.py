"""Routing backward through the wrapper: a scale on every floating output tensor."""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch

__all__ = ["mark"]


class Owner(Protocol):
    def _backward_started(self, token: int, factor: float | None) -> float:
        """Called first in each backward through a marked output; the factor to apply."""


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward asks the owner for a factor and multiplies the gradient."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, factor: float | None, owner: Owner, token: int
    ) -> torch.Tensor:
        # A weak reference, as DDP's _DDPSink holds its reducer: outputs (or a loss) kept
        # past the wrapper's life must not keep the wrapper, its buckets and model alive.
        ctx.factor, ctx.owner, ctx.token = factor, weakref.ref(owner), token
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        owner = ctx.owner()
        if owner is None:
            raise RuntimeError(
                "backward through outputs of a BalancedDataParallel that no longer exists: "
                "keep the wrapper alive until the backward of its outputs"
            )
        factor = owner._backward_started(ctx.token, ctx.factor)
        if factor == 0:
            # A rank with no samples: exact zeros, even where the mean over none is NaN.
            return torch.zeros_like(grad), None, None, None
        return (grad if factor == 1 else grad * factor), None, None, None


def mark(outputs: Any, factor: float | None, owner: Owner, token: int, *, leaf: bool) -> Any:
    """Route backward through `_ScaleGrad` on every floating output tensor.

    `factor` None: the owner decides when backward starts (a loss normalised by a count the
    user gives after the forward). `leaf`: the outputs of a forward run without a graph (a
    rank with no samples), made leaves so that backward still reaches the owner.
    """
    if isinstance(outputs, torch.Tensor):
        if not outputs.is_floating_point():
            return outputs
        if leaf:
            outputs = outputs.detach().requires_grad_()
        elif not outputs.requires_grad:
            return outputs
        return _ScaleGrad.apply(outputs, factor, owner, token)
    if isinstance(outputs, dict):
        return {key: mark(value, factor, owner, token, leaf=leaf) for key, value in outputs.items()}
    if isinstance(outputs, tuple) and hasattr(outputs, "_fields"):  # a namedtuple
        return type(outputs)(*(mark(value, factor, owner, token, leaf=leaf) for value in outputs))
    if isinstance(outputs, list | tuple):
        return type(outputs)(mark(value, factor, owner, token, leaf=leaf) for value in outputs)
    return outputs
