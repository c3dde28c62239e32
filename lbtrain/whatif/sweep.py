"""Sweeps along the five axes of the analytical model (Castelló et al., PDP 2021).

One prediction per value of one axis, everything else held:

- ``batch``: the global batch (samples per step);
- ``devices``: the count of a one-entry cluster (its devices per node kept);
- ``link``: the bandwidth between nodes (its latency kept);
- ``flops``: every device's peak arithmetic rate, as a factor of the table's;
- ``memory-bandwidth``: every device's peak memory bandwidth, as a factor.

The last two change the roofline's bound, so they apply only to devices the roofline times:
a device timed by a profile has a measured speed no spec factor moves, and is refused.
Grammar: ``AXIS=V1,V2,...``, e.g. ``link=10Gb/s,25Gb/s,100Gb/s`` or ``flops=0.5,1,2``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lbtrain.whatif.cluster import Cluster, Network, parse_bandwidth
from lbtrain.whatif.devices import DeviceSpec
from lbtrain.whatif.network import Link
from lbtrain.whatif.predict import Prediction, SpeedModel, predict

__all__ = ["AXES", "Sweep", "SweepPoint", "check_sweep", "parse_sweep", "sweep"]

AXES = ("batch", "devices", "link", "flops", "memory-bandwidth")
_EXAMPLES = {
    "batch": "batch=256,1024,4096",
    "devices": "devices=8,16,32",
    "link": "link=10Gb/s,25Gb/s,100Gb/s",
    "flops": "flops=0.5,1,2",
    "memory-bandwidth": "memory-bandwidth=0.5,1,2",
}
_FACTORS = {"flops": "flops", "memory-bandwidth": "memory_bandwidth"}


@dataclass(frozen=True)
class Sweep:
    """One axis and its values (SI units; factors for ``flops`` and ``memory-bandwidth``)."""

    axis: str
    values: tuple[float, ...]
    labels: tuple[str, ...]


@dataclass(frozen=True)
class SweepPoint:
    """The prediction at one value of the axis."""

    label: str
    value: float
    prediction: Prediction


def _bad(text: str, problem: str) -> ValueError:
    return ValueError(f"--sweep {text!r}: {problem}")


def _value(text: str, axis: str, item: str) -> float:
    """One value of `axis` from its text, or a one-line ValueError."""
    if axis == "link":
        bandwidth = parse_bandwidth(item)
        if bandwidth is None:
            raise _bad(text, f"{item!r} is not a bandwidth: write a number and a unit such as "
                       "Gb/s or GB/s, e.g. link=10Gb/s,100Gb/s")  # fmt: skip
        value = bandwidth
    else:
        try:
            value = float(item.removesuffix("x") if axis in _FACTORS else item)
        except ValueError:
            raise _bad(text, f"{item!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise _bad(text, f"{item!r} must be a finite number > 0")
    if axis in ("batch", "devices") and value != int(value):
        raise _bad(text, f"{axis} {item!r} must be a whole number >= 1")
    return value


def parse_sweep(text: str) -> Sweep:
    """Parse ``AXIS=V1,V2,...`` (module docstring); bad input is one line naming the fix."""
    axis, sep, values = text.partition("=")
    axis = axis.strip().lower()
    if not sep or axis not in AXES:
        raise _bad(text, f"write AXIS=V1,V2,... with AXIS one of {', '.join(AXES)}, e.g. "
                   "link=10Gb/s,25Gb/s,100Gb/s")  # fmt: skip
    items = [item.strip() for item in values.split(",") if item.strip()]
    if not items:
        raise _bad(text, f"no values: give at least one, e.g. {_EXAMPLES[axis]}")
    parsed = [_value(text, axis, item) for item in items]
    if len(set(parsed)) != len(parsed):
        raise _bad(text, "a value is given twice: give each once")
    return Sweep(axis, tuple(parsed), tuple(items))


def _scaled(device: DeviceSpec, key: str, factor: float) -> DeviceSpec:
    return dataclasses.replace(device, **{key: getattr(device, key) * factor})


def check_sweep(axis_values: Sweep, cluster: Cluster) -> None:
    """A one-line ValueError for a sweep the cluster cannot take (before any other work)."""
    axis = axis_values.axis
    if axis == "devices" and len(cluster.groups) != 1:
        raise ValueError(
            f"--sweep devices sets the count of a one-entry cluster, but --cluster has "
            f"{len(cluster.groups)} entries: keep one, or sweep another axis"
        )
    if axis == "link" and cluster.nodes == 1:
        raise ValueError(
            "--sweep link sweeps the link between nodes, but the cluster fits one node: give "
            'more devices than a node holds (e.g. "16x h100@8"), or sweep another axis'
        )


def sweep(
    axis_values: Sweep,
    cluster: Cluster,
    network: Network,
    speeds_for: Callable[[Sequence[DeviceSpec]], Mapping[str, SpeedModel]],
    global_batch: int | None,
    policy: str = "cost",
    gradient_bytes: int = 0,
    min_batch: int = 0,
    caps: Mapping[str, float] | None = None,
) -> list[SweepPoint]:
    """Predict one step at each value of the sweep's axis (see the module docstring).

    `speeds_for` gives the speed models of a list of devices (the CLI's profiles and
    roofline); it is called again with scaled devices on the ``flops`` and
    ``memory-bandwidth`` axes. Raises a one-line ValueError for a sweep the cluster or the
    speed models cannot take.
    """
    axis = axis_values.axis
    check_sweep(axis_values, cluster)
    if global_batch is None and axis != "batch":
        raise ValueError("--sweep needs --global-batch (the samples of one step)")
    devices = [group.device for group in cluster.groups]
    speeds = speeds_for(devices)
    if axis in _FACTORS:
        fixed = [name for name, model in speeds.items() if not model.source.startswith("roofline")]
        if fixed:
            raise ValueError(
                f"--sweep {axis} scales the devices' peaks, which only the roofline uses, but "
                f"{fixed[0]!r} is timed by a profile: drop --profiles for it, or sweep "
                "another axis"
            )
    points = []
    for label, value in zip(axis_values.labels, axis_values.values, strict=True):
        here_cluster, here_network, here_speeds, batch = cluster, network, speeds, global_batch
        if axis == "batch":
            batch = int(value)
        elif axis == "devices":
            here_cluster = cluster.with_counts([int(value)])
        elif axis == "link":
            here_network = Network(network.intra, Link(alpha=network.inter.alpha, beta=value))
        else:
            here_cluster = Cluster(tuple(
                dataclasses.replace(g, device=_scaled(g.device, _FACTORS[axis], value))
                for g in cluster.groups
            ))  # fmt: skip
            here_speeds = speeds_for([g.device for g in here_cluster.groups])
        assert batch is not None  # checked above for every axis but batch
        try:
            result = predict(here_cluster, here_network, here_speeds, batch, policy,
                             gradient_bytes, min_batch, caps)  # fmt: skip
        except ValueError as exc:  # say which value of the sweep could not be planned
            raise ValueError(f"--sweep {axis}={label}: {exc}") from None
        points.append(SweepPoint(label, value, result))
    return points
