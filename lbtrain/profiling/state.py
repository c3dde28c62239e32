"""`TrainingState`: snapshot a model and optimizer, and put them back exactly, in place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["TrainingState"]


class TrainingState:
    """A snapshot of everything a training step changes, restored in place.

    Parameters, buffers, optimizer state and hyper-parameters are copied back into the very
    tensors and dicts that existed before, so references held elsewhere (an LR scheduler, a
    gradient hook) stay valid. Gradients are restored by reference.

    Args:
        model: the model.
        optimizer: its optimizer.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._model = model
        self._optimizer = optimizer
        # Host copies, so the snapshot does not shrink the GPU memory the cap probe measures.
        self._tensors = [
            (tensor, tensor.detach().to("cpu", copy=True))
            for tensor in model.state_dict(keep_vars=True).values()
        ]
        self._grads = [(p, p.grad) for p in model.parameters()]
        self._modes = [(module, module.training) for module in model.modules()]
        self._state = {
            param: {key: _host_copy(value) for key, value in state.items()}
            for param, state in optimizer.state.items()
        }
        self._groups = [
            {key: _host_copy(value) for key, value in group.items() if key != "params"}
            for group in optimizer.param_groups
        ]

    def restore(self) -> None:
        """Put the model and optimizer back exactly as they were when snapshotted."""
        with torch.no_grad():
            for tensor, saved in self._tensors:
                tensor.copy_(saved)
            for param, grad in self._grads:
                param.grad = grad
            state = self._optimizer.state
            for param in list(state):
                if param not in self._state:
                    del state[param]
            for param, saved_state in self._state.items():
                current = state[param]
                for key in list(current):
                    if key not in saved_state:
                        del current[key]
                for key, value in saved_state.items():
                    current[key] = _restore_value(current.get(key), value)
            for group, saved_group in zip(self._optimizer.param_groups, self._groups, strict=True):
                for key in list(group):
                    if key != "params" and key not in saved_group:
                        del group[key]
                for key, value in saved_group.items():
                    group[key] = _restore_value(group.get(key), value)
        for module, training in self._modes:
            module.training = training


@dataclass(frozen=True)
class _SavedTensor:
    host: torch.Tensor
    device: torch.device


def _host_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _SavedTensor(value.detach().to("cpu", copy=True), value.device)
    if isinstance(value, dict):
        return {k: _host_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_host_copy(v) for v in value)
    return value


def _restore_value(current: Any, saved: Any) -> Any:
    if isinstance(saved, _SavedTensor):
        host, device = saved.host, saved.device
        if (
            isinstance(current, torch.Tensor)
            and current.shape == host.shape
            and current.dtype == host.dtype
            and current.device == device
        ):
            current.copy_(host)
            return current
        return host.to(device, copy=True)
    if isinstance(saved, dict):
        return {k: _restore_value(None, v) for k, v in saved.items()}
    if isinstance(saved, list | tuple):
        return type(saved)(_restore_value(None, v) for v in saved)
    return saved
