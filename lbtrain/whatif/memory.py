"""Memory caps for what-if: the most samples a device with its own memory holds a step."""

from __future__ import annotations

import math
from collections.abc import Iterable

from lbtrain.whatif.devices import DeviceSpec

__all__ = ["STATE_BYTES_PER_PARAMETER", "USABLE_MEMORY", "memory_caps"]

# Weights, their gradients and Adam's two moments, in FP32: 16 bytes a parameter.
STATE_BYTES_PER_PARAMETER = 16
# What the CUDA context, the framework's buffers and fragmentation leave of device memory.
USABLE_MEMORY = 0.9


def memory_caps(
    devices: Iterable[DeviceSpec], parameters: int, saved_bytes_per_sample: float
) -> dict[str, float]:
    """The most samples each device with its own memory holds in one step, by name.

    A step holds the model's state (`STATE_BYTES_PER_PARAMETER` a parameter) and, per
    sample, what autograd saves for the backward pass; `USABLE_MEMORY` of the device's
    memory is counted. Devices without memory of their own (CPU cores share the host's) and
    a model whose saved bytes were not counted get no cap. A device that cannot hold the
    state and one sample is a one-line ValueError.
    """
    caps: dict[str, float] = {}
    if saved_bytes_per_sample <= 0:
        return caps
    state = parameters * STATE_BYTES_PER_PARAMETER
    for device in devices:
        if device.memory is None:
            continue
        room = device.memory * USABLE_MEMORY - state
        if room < saved_bytes_per_sample:
            raise ValueError(
                f"device {device.name!r}: {device.memory / 1e9:g} GB cannot hold the model's "
                f"weights, gradients and optimizer state ({state / 1e9:.3g} GB) and one "
                f"sample's activations ({saved_bytes_per_sample / 1e6:.3g} MB); leave it out"
            )
        caps[device.name] = math.floor(room / saved_bytes_per_sample)
    return caps
