"""Predicted step time of a cluster one does not have: per-device speeds, the plan, the sync.

Each device of a `Cluster` is one replica (one rank). Its speed model is
``t(b) = alpha + beta * b`` seconds, from one of two sources:

1. **Profiles** (`lbtrain profile`): a device takes the median alpha and beta of the profiles
   that match it. By default a GPU device matches the ``cuda`` profiles whose device name
   contains the device's name (``h100`` matches ``NVIDIA H100 80GB HBM3``) and ``cpu-core``
   matches every ``cpu`` profile, whose beta is multiplied by its threads (a profile of t
   threads stands for t cores; one core is taken as t times slower, which ignores
   sub-linear thread scaling). `profile_map` replaces the default for a device name: its
   key matches a profile's device kind exactly or its device name as a substring.
2. **Roofline** otherwise: ``beta = max(flops_per_sample / flops, bytes_per_sample /
   memory_bandwidth) / efficiency`` on the device's peak figures, and alpha the median alpha
   of the profiles of its kind (0 without any). The efficiency of a kind is calibrated as
   the median, over the table devices of that kind with matching profiles, of
   ``roofline beta at efficiency 1 / measured beta``; without such a profile it is
   `UNCALIBRATED_EFFICIENCY` (0.5, an assumption, not a measurement).

Pure Python and numpy, no torch; SI units (seconds, bytes, FLOP).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from lbtrain.balancer.rounding import water_fill
from lbtrain.whatif.cluster import Cluster, Network
from lbtrain.whatif.devices import DeviceSpec
from lbtrain.whatif.grouped import GroupShare, grouped_plan
from lbtrain.whatif.network import hierarchical

__all__ = [
    "UNCALIBRATED_EFFICIENCY",
    "GroupPrediction",
    "Prediction",
    "Roofline",
    "ScalingRow",
    "SpeedModel",
    "predict",
    "profile_matches",
    "scaling",
    "speed_models",
]

# The fraction of peak a device reaches when no profile calibrates its kind: an assumption.
UNCALIBRATED_EFFICIENCY = 0.5
_PROFILE_KIND = {"gpu": "cuda", "cpu": "cpu"}


@dataclass(frozen=True)
class SpeedModel:
    """t(b) = alpha + beta * b seconds on one device; `source` says where it comes from."""

    alpha: float
    beta: float
    source: str

    def __post_init__(self) -> None:
        # 1/beta is a throughput the planner divides by: a beta that underflows it (a
        # roofline of 1e-300 FLOP a sample) is refused here, not a ZeroDivisionError later.
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"{self.source}: fixed cost alpha={self.alpha!r} s must be >= 0")
        if not (self.beta > 0 and math.isfinite(1.0 / self.beta) and 1.0 / self.beta < 1e300):
            raise ValueError(
                f"{self.source}: beta={self.beta!r} s per sample is no speed (it must be > 0 "
                "and give a finite throughput); check the FLOPs or bytes per sample"
            )


@dataclass(frozen=True)
class Roofline:
    """Work of one training sample (forward and backward): FLOP and bytes of memory traffic."""

    flops_per_sample: float = 0.0
    bytes_per_sample: float = 0.0

    def __post_init__(self) -> None:
        for key in ("flops_per_sample", "bytes_per_sample"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key}={value!r} must be a finite number >= 0")
        if self.flops_per_sample == 0 and self.bytes_per_sample == 0:
            raise ValueError("a roofline needs flops_per_sample or bytes_per_sample > 0")

    def beta(self, device: DeviceSpec, efficiency: float = 1.0) -> float:
        """Seconds per sample at `efficiency` of the device's peak (the slower roof)."""
        bound = max(
            self.flops_per_sample / device.flops,
            self.bytes_per_sample / device.memory_bandwidth,
        )
        return bound / efficiency


def key_matches(profile: Any, key: str) -> bool:
    """Whether a --profile-map key picks `profile`: its device kind, or part of its name."""
    key = key.lower()
    return str(profile.device_kind).lower() == key or key in str(profile.device_name).lower()


def profile_matches(device: DeviceSpec, profile: Any, key: str | None = None) -> bool:
    """Whether `profile` (a ReplicaProfile) measures `device` (rule in the module docstring)."""
    kind = str(profile.device_kind).lower()
    name = str(profile.device_name).lower()
    if key is not None:
        return key_matches(profile, key)
    if kind != _PROFILE_KIND[device.kind]:
        return False
    return device.kind == "cpu" or device.name.replace("-", " ") in name.replace("-", " ")


def _slowdown(profile: Any) -> float:
    """The emulated slowdown a profile ran under (1: none, or a record without the field)."""
    return max(1.0, float(getattr(profile, "slowdown", 1.0) or 1.0))


def _measured(device: DeviceSpec, profiles: Sequence[Any], key: str | None) -> SpeedModel | None:
    matched = [p for p in profiles if profile_matches(device, p, key)]
    if not matched:
        return None
    # A CPU profile of t threads stands for t one-core replicas of a cpu-core device.
    # Under --profile-map too: the same profiles must give the same core, however matched.
    scale = [max(1, int(p.threads)) if device.kind == "cpu" and p.device_kind == "cpu" else 1
             for p in matched]  # fmt: skip
    # A rank profiled under --emulate-slowdown F slept (F - 1) times each step's compute: the
    # device itself is F times faster than that record, and it is the device that is asked.
    slow = [_slowdown(p) for p in matched]
    beta = median(p.beta * s / f for p, s, f in zip(matched, scale, slow, strict=True))
    alpha = median(p.alpha / f for p, f in zip(matched, slow, strict=True))
    source = f"median of {len(matched)} profile(s)"
    if any(f != 1 for f in slow):
        source += ", emulated slowdowns divided out"
    return SpeedModel(alpha, beta, source)


def speed_models(
    devices: Iterable[DeviceSpec],
    profiles: Sequence[Any] = (),
    roofline: Roofline | None = None,
    profile_map: Mapping[str, str] | None = None,
    table: Iterable[DeviceSpec] = (),
) -> dict[str, SpeedModel]:
    """A speed model for each of `devices`, by name (rules in the module docstring).

    `table` adds devices (the whole device table) whose profiles calibrate the roofline.
    Raises a one-line ValueError naming a device with neither a profile nor a roofline.
    """
    keys = {k.lower(): v for k, v in (profile_map or {}).items()}
    devices, table = list(devices), list(table)
    _check_map_kinds(keys, {d.name.lower(): d for d in [*table, *devices]}, profiles)
    models: dict[str, SpeedModel] = {}
    for device in devices:
        measured = _measured(device, profiles, keys.get(device.name))
        if measured is not None:
            models[device.name] = measured
    for device in devices:
        if device.name in models:
            continue
        if roofline is None:
            raise ValueError(
                f"device {device.name!r} has no matching profile and no roofline: give "
                "--profiles of it (or --profile-map), or --flops-per-sample/--bytes-per-sample"
            )
        efficiency, how = _efficiency(device.kind, [*devices, *table], profiles, keys, roofline)
        kind_alphas = [
            p.alpha / _slowdown(p)
            for p in profiles
            if str(p.device_kind).lower() == _PROFILE_KIND[device.kind]
        ]
        alpha = median(kind_alphas) if kind_alphas else 0.0
        bound = (
            "memory-bound"
            if roofline.bytes_per_sample / device.memory_bandwidth
            > roofline.flops_per_sample / device.flops
            else "FLOP-bound"
        )
        source = f"roofline at {efficiency:.0%} of peak ({bound}), {how}"
        if efficiency < 0.01:
            source = (
                f"roofline at {efficiency:.2%} of peak ({bound}), {how}: implausibly low, "
                "check that the profiles are of this kind of device and the FLOP count"
            )
        models[device.name] = SpeedModel(alpha, roofline.beta(device, efficiency), source)
    return models


def _check_map_kinds(
    keys: Mapping[str, str], specs: Mapping[str, DeviceSpec], profiles: Sequence[Any]
) -> None:
    """Refuse a --profile-map entry that gives a device profiles of another kind: CPU
    timings would stand for a GPU (or calibrate every GPU's roofline), and the reverse."""
    for name, key in keys.items():
        spec = specs.get(name)
        if spec is None:
            continue  # the command line names unknown devices itself
        kinds = {str(p.device_kind).lower() for p in profiles if profile_matches(spec, p, key)} - {
            _PROFILE_KIND[spec.kind]
        }
        if kinds:
            raise ValueError(
                f"--profile-map {name}={key} gives the {spec.kind} device {name!r} profiles "
                f"of {', '.join(sorted(kinds))} ranks; map it to profiles of its own kind "
                f"({_PROFILE_KIND[spec.kind]})"
            )


def _efficiency(
    kind: str,
    devices: Sequence[DeviceSpec],
    profiles: Sequence[Any],
    keys: Mapping[str, str],
    roofline: Roofline,
) -> tuple[float, str]:
    ratios = []
    for device in {d.name: d for d in devices if d.kind == kind}.values():
        measured = _measured(device, profiles, keys.get(device.name))
        if measured is not None:
            ratios.append(roofline.beta(device) / measured.beta)
    if not ratios:
        return UNCALIBRATED_EFFICIENCY, "uncalibrated"
    ratio = median(ratios)
    # Faster than the peak roofline: the FLOP or byte counts are too high for these profiles.
    capped = ", capped: profiles beat the peak" if ratio > 1 else ""
    return min(1.0, ratio), f"calibrated on {kind} profiles{capped}"


@dataclass(frozen=True)
class GroupPrediction:
    """One cluster entry's share of the step."""

    name: str
    count: int
    batch_min: int
    batch_max: int
    zero: int
    compute: float  # slowest device of the group, seconds
    idle: float  # least wait of a device of the group for the slowest device overall
    speed: SpeedModel


@dataclass(frozen=True)
class Prediction:
    """One synchronous step on a cluster: compute, then a hierarchical allreduce."""

    policy: str
    global_batch: int
    groups: tuple[GroupPrediction, ...]
    compute: float
    sync: float
    sync_algorithm: str
    ideal_compute: float

    @property
    def step(self) -> float:
        """Seconds per step: the slowest device's compute, then the sync."""
        return self.compute + self.sync

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.global_batch / self.step

    @property
    def ideal_step(self) -> float:
        """The continuous optimum (zero shares allowed) plus the same sync."""
        return self.ideal_compute + self.sync

    @property
    def efficiency(self) -> float:
        """ideal step / predicted step, at most 1: what balancing leaves on the table."""
        return self.ideal_step / self.step if self.step > 0 else 1.0


def predict(
    cluster: Cluster,
    network: Network,
    speeds: Mapping[str, SpeedModel],
    global_batch: int,
    policy: str = "cost",
    gradient_bytes: int = 0,
    min_batch: int = 0,
    caps: Mapping[str, float] | None = None,
) -> Prediction:
    """Plan `global_batch` over every device of `cluster` and predict one step.

    `caps` bounds the samples a device holds, by device name (`memory_caps`); a device
    without one has no bound.

    Each device is a replica with its kind's speed model (`speeds`, by device name); the
    sync is `hierarchical` over the cluster's nodes (the fullest node sets the intra-node
    time), every device taking part (idle ones add zeros), as `plan_batches` models it.
    The plan is that of `plan_batches` on replicas of throughput 1/beta and `caps`, computed
    per group of identical devices (`lbtrain.whatif.grouped`): 100,000 devices cost no more
    than a handful of groups.
    """
    missing = [g.device.name for g in cluster.groups if g.device.name not in speeds]
    if missing:
        raise ValueError(f"no speed model for device {missing[0]!r}")
    sync = hierarchical(
        gradient_bytes,
        cluster.devices,
        cluster.max_per_node,
        network.intra,
        network.inter,
        nodes=cluster.nodes,  # entries fill nodes of their own: more leaders than p / g
    )
    models = [speeds[g.device.name] for g in cluster.groups]
    counts = [g.count for g in cluster.groups]
    alphas, betas = [s.alpha for s in models], [s.beta for s in models]
    limits = [
        math.inf if caps is None else caps.get(g.device.name, math.inf) for g in cluster.groups
    ]
    shares = grouped_plan(counts, alphas, betas, global_batch, policy, min_batch, limits)
    slowest = [
        s.alpha + s.beta * x.batch_max if x.batch_max else 0.0
        for s, x in zip(models, shares, strict=True)
    ]
    compute = max(slowest)
    groups = _group_predictions(cluster, models, shares, slowest, compute)
    ideal = _ideal_compute(counts, alphas, betas, global_batch, limits)
    return Prediction(
        policy, global_batch, groups, compute, float(sync.seconds), str(sync.algorithm),
        min(ideal, compute),
    )  # fmt: skip


def _group_predictions(
    cluster: Cluster,
    models: Sequence[SpeedModel],
    shares: Sequence[GroupShare],
    slowest: Sequence[float],
    compute: float,
) -> tuple[GroupPrediction, ...]:
    """Each group's share of the step: its batches, idle devices, compute and wait."""
    return tuple(
        GroupPrediction(
            g.device.name,
            g.count,
            x.batch_min,
            x.batch_max,
            0 if x.batch_min else g.count - x.extra,
            t,
            compute - t,
            s,
        )
        for g, s, x, t in zip(cluster.groups, models, shares, slowest, strict=True)
    )


def _ideal_compute(
    counts: Sequence[int],
    alphas: Sequence[float],
    betas: Sequence[float],
    total: int,
    caps: Sequence[float],
) -> float:
    """T*: the continuous water-filling optimum, one entry per group (devices of a group
    are identical, so a group of n devices is one device n times as fast at the same alpha)."""
    group_betas = [b / n for b, n in zip(betas, counts, strict=True)]
    count = len(counts)
    upper = [n * cap for n, cap in zip(counts, caps, strict=True)]
    shares = water_fill(total, alphas, group_betas, [0] * count, upper)
    return max(a + b * x for a, b, x in zip(alphas, group_betas, shares, strict=True) if x > 0)


@dataclass(frozen=True)
class ScalingRow:
    """One row of a scaling table."""

    devices: int
    global_batch: int
    step: float
    throughput: float
    speedup: float  # throughput over the base row's
    base: int = 1  # devices of the base row: the fewest that hold the batch

    @property
    def efficiency(self) -> float:
        """speedup / (devices / base) (1 is perfect scaling)."""
        return self.speedup * self.base / self.devices


def scaling(
    device: DeviceSpec,
    counts: Sequence[int],
    network: Network,
    speeds: Mapping[str, SpeedModel],
    batch: int,
    weak: bool = False,
    gradient_bytes: int = 0,
    per_node: int | None = None,
    caps: Mapping[str, float] | None = None,
) -> list[ScalingRow]:
    """Strong scaling (global batch `batch` fixed) or weak (`batch` per device) over `counts`
    devices of one kind, `per_node` to a node (default: the kind's), against one device."""
    from lbtrain.whatif.cluster import DEFAULT_PER_NODE, DeviceGroup

    node = per_node or DEFAULT_PER_NODE[device.kind]

    def run(n: int) -> Prediction:
        cluster = Cluster((DeviceGroup(n, device, node),))
        total = batch * n if weak else batch
        return predict(cluster, network, speeds, total, "cost", gradient_bytes, caps=caps)

    return scaled_rows(counts, run, weak)


def scaled_rows(
    counts: Sequence[int], run: Callable[[int], Prediction], weak: bool
) -> list[ScalingRow]:
    """The rows of `counts` (devices, or copies of a mix) that `run` can plan, against the
    first of them; strong scaling skips counts whose memory cannot hold the batch, weak
    scaling (the batch per device fixed) names the flag when one device cannot."""
    rows: list[ScalingRow] = []
    first: Exception | None = None
    for n in counts:
        try:
            p = run(n)
        except ValueError as exc:
            if weak:  # every count holds the same batch per device: none would
                # The inner fix (a smaller global batch, more devices) means nothing here.
                reason = str(exc).split("; lower the global batch")[0]
                raise ValueError(
                    f"--batch-per-device is more than a device holds, at {n:,} device(s): "
                    f"{reason}; lower --batch-per-device"
                ) from None
            first = first or exc
            continue
        base = rows[0] if rows else None
        speedup = p.throughput / base.throughput if base else 1.0
        rows.append(ScalingRow(n, p.global_batch, p.step, p.throughput, speedup,
                               base.devices if base else n))  # fmt: skip
    if not rows:
        raise ValueError(f"--scaling strong: none of {counts[-1]:,} or fewer holds it: {first}")
    return rows
