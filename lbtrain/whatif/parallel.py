"""Data, spatial and pipeline parallelism compared on one kind of device (issue 22).

From the per-layer work of `lbtrain.whatif.layers` and one device's speed model
t(b) = alpha + beta x b (beta spread over the layers in proportion to their FLOP), for `n`
identical devices and a global batch B:

- **data**: every device trains ceil(B / n) whole samples (fewer samples than devices leave
  some idle: a sample is not split), then the gradients are allreduced over all n.
- **spatial** over k devices (Dryden et al., IPDPS 2019): n / k groups each take
  ceil(B k / n) samples, and inside a group each device computes a slab of 1/k of every
  image's rows through the spatial layers. Each convolution then exchanges its halo (the rows
  its kernel reads beyond the slab) with both neighbours, forward and backward; the layers
  after the spatial part (pooling to a vector, the classifier) run whole on every device,
  after an allgather of the last spatial output. Every device holds all weights: the
  gradients are allreduced over all n. Needs k <= the smallest height of a spatial layer.
- **pipeline** over k stages (layer-wise model parallelism, as in Castelló et al.): the
  layers are cut into k contiguous stages of near-equal FLOP; each of n / k pipelines takes
  ceil(B k / n) samples in m micro-batches, GPipe-style: (m + k - 1) slots of the slowest
  stage, each slot sending the stage boundary's activations forward and their gradients
  back (m a power of two, or micro-batches of a power of two samples, whichever is best). A
  stage's weights are allreduced over the n / k pipelines. The fixed cost alpha is
  split evenly over the stages, one of the model's assumptions.

Messages of a group whose devices fit one node use the intra-node link, else the
inter-node one. Several kinds of device: `lbtrain.whatif.parallel_mixed`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lbtrain.whatif.cluster import Network
from lbtrain.whatif.network import Link, hierarchical
from lbtrain.whatif.predict import SpeedModel

if TYPE_CHECKING:  # layers.py imports torch; these models are pure
    from lbtrain.whatif.layers import Layer

__all__ = [
    "SCHEMES",
    "Option",
    "Pipeline",
    "SpatialGroup",
    "compare_parallelism",
    "group_link",
    "pipeline",
    "pipeline_stages",
    "spatial_group",
]

SCHEMES = ("data", "spatial", "pipeline")


@dataclass(frozen=True)
class Option:
    """One way to spread a step over the devices, and its predicted time (seconds)."""

    scheme: str
    ways: int  # devices a sample is spread over (1 for data)
    microbatches: int  # pipeline only (1 otherwise)
    samples: int  # samples per device (data) or per group
    compute: float
    communication: float  # halos and gathers, or stage-to-stage transfers
    sync: float  # the gradient allreduce
    global_batch: int
    # A mixed cluster's split: samples per device (data), group or pipeline of each entry.
    shares: tuple[int, ...] = ()

    @property
    def step(self) -> float:
        """Seconds per step."""
        return self.compute + self.communication + self.sync

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.global_batch / self.step


def _allreduce(nbytes: float, devices: int, per_node: int, network: Network) -> float:
    if devices <= 1 or nbytes <= 0:
        return 0.0
    return float(
        hierarchical(nbytes, devices, max(1, per_node), network.intra, network.inter).seconds
    )


def group_link(ways: int, per_node: int, network: Network) -> Link:
    """The link a group of `ways` devices talks over: intra-node when groups tile the nodes."""
    # A group stays inside a node only when groups tile the nodes (k divides per_node).
    return network.intra if ways <= per_node and per_node % ways == 0 else network.inter


def _data(layers, speed, n, per_node, network, batch) -> Option:  # noqa: ANN001
    samples = math.ceil(batch / n)
    grads = sum(layer.parameter_bytes for layer in layers)
    return Option("data", 1, 1, samples, speed.alpha + speed.beta * samples, 0.0,
                  _allreduce(grads, n, per_node, network), batch)  # fmt: skip


@dataclass(frozen=True)
class SpatialGroup:
    """k devices that split each image's rows: t(b) = compute and comm, each alpha + beta b."""

    compute_alpha: float
    compute_beta: float
    comm_alpha: float
    comm_beta: float

    def times(self, samples: int) -> tuple[float, float]:
        """Compute and communication seconds of a step of `samples` images (0: idle)."""
        if samples <= 0:
            return 0.0, 0.0
        return (self.compute_alpha + self.compute_beta * samples,
                self.comm_alpha + self.comm_beta * samples)  # fmt: skip


def spatial_group(
    layers: Sequence[Layer], speed: SpeedModel, k: int, link: Link
) -> SpatialGroup | None:
    """The cost of a group of k devices of `speed` splitting rows over `link`; None when a
    spatial layer has fewer than k rows (or there is none)."""
    spatial = [layer for layer in layers if layer.spatial]
    if not spatial or min(layer.height for layer in spatial) < k:
        return None
    total = sum(layer.flops for layer in layers) or 1.0
    share = (sum(layer.flops for layer in spatial) / k + sum(
        layer.flops for layer in layers if not layer.spatial)) / total  # fmt: skip
    halos = [layer.halo_bytes for layer in spatial if layer.halo_bytes > 0]
    # Both neighbours at once, forward and backward: two exchanges per convolution.
    comm_alpha = 2 * len(halos) * link.alpha
    comm_beta = 2 * sum(halos) / link.beta
    last = spatial[-1].output_bytes if len(spatial) < len(layers) else 0.0
    if last:
        # Forward only: the layers after run whole on every device, so each has the whole
        # gradient of the gathered tensor and keeps its own rows, with no exchange.
        comm_alpha += math.ceil(math.log2(k)) * link.alpha
        comm_beta += last * (k - 1) / k / link.beta
    return SpatialGroup(speed.alpha, speed.beta * share, comm_alpha, comm_beta)


def _spatial(layers, speed, n, k, per_node, network, batch) -> Option | None:  # noqa: ANN001
    group = spatial_group(layers, speed, k, group_link(k, per_node, network))
    if group is None:
        return None
    samples = math.ceil(batch * k / n)
    compute, comm = group.times(samples)
    grads = sum(layer.parameter_bytes for layer in layers)
    return Option("spatial", k, 1, samples, compute, comm,
                  _allreduce(grads, n, per_node, network), batch)  # fmt: skip


def pipeline_stages(flops: Sequence[float], k: int) -> list[int]:
    """Where k contiguous stages start (indices into `flops`), the slowest stage as light as
    possible: a binary search on the bound, each stage filled greedily up to it."""
    total = sum(flops)

    def cuts(bound: float) -> list[int] | None:
        starts, load = [0], 0.0
        for i, f in enumerate(flops):
            if load + f > bound and load > 0:
                starts.append(i)
                load = 0.0
            load += f
        return starts if len(starts) <= k and load <= bound else None

    low, high = max(flops, default=0.0), total
    for _ in range(60):
        middle = (low + high) / 2
        if cuts(middle) is None:
            low = middle
        else:
            high = middle
    starts = cuts(high) or [0]
    # Fewer stages than asked for still use k devices: split the longest stages further.
    while len(starts) < k:
        bounds = [*starts, len(flops)]
        widest = max(range(len(starts)), key=lambda s: bounds[s + 1] - bounds[s])
        if bounds[widest + 1] - bounds[widest] < 2:
            break
        starts.insert(widest + 1, (bounds[widest] + bounds[widest + 1]) // 2)
    return starts


@dataclass(frozen=True)
class Pipeline:
    """k stages of one device each: the heaviest stage's share of the FLOP, the bytes that
    cross the busiest boundary per sample, and the largest stage's gradient bytes."""

    k: int
    heaviest: float
    boundary: float
    stage_grads: float

    def times(self, speed: SpeedModel, link: Link, samples: int) -> tuple[float, float, int]:
        """Compute and transfer seconds of `samples` through the pipeline, and the number of
        micro-batches that makes their sum least; (0, 0, 0) when idle.

        The candidates: a power of two micro-batches (or one a sample) of ceil(samples / m)
        each, and micro-batches of a power of two samples (or all in one). Each family's time
        never falls as samples grow, so neither does the best of both, which balancing
        pipelines of several kinds relies on."""
        if samples <= 0:
            return 0.0, 0.0, 0
        powers = [1 << i for i in range(samples.bit_length())]  # 1, 2, 4, ... <= samples
        candidates = {(m, math.ceil(samples / m)) for m in [*powers, samples]}
        candidates |= {(math.ceil(samples / size), size) for size in [*powers, samples]}
        best = (0.0, 0.0, 0)
        for m, micro in sorted(candidates):
            slot = speed.alpha / self.k + speed.beta * micro * self.heaviest
            transfer = 2 * (link.alpha + micro * self.boundary / link.beta)
            times = ((m + self.k - 1) * slot, (m + self.k - 1) * transfer, m)
            if best[2] == 0 or sum(times[:2]) < sum(best[:2]):
                best = times
        return best


def pipeline(layers: Sequence[Layer], k: int) -> Pipeline | None:
    """The stages of a k-stage pipeline of `layers`; None with fewer layers than stages."""
    if len(layers) < k:
        return None
    flops = [layer.flops for layer in layers]
    starts = pipeline_stages(flops, k)
    if len(starts) < k:
        return None
    bounds = [*starts, len(layers)]
    total = sum(flops) or 1.0
    stages = list(zip(bounds, bounds[1:], strict=False))
    return Pipeline(
        k,
        max(sum(flops[a:b]) for a, b in stages) / total,
        max(layers[b - 1].output_bytes for b in bounds[1:-1]),
        max(sum(x.parameter_bytes for x in layers[a:b]) for a, b in stages),
    )


def _pipeline(layers, speed, n, k, per_node, network, batch) -> Option | None:  # noqa: ANN001
    stages = pipeline(layers, k)
    if stages is None:
        return None
    samples = math.ceil(batch * k / n)
    sync = _allreduce(stages.stage_grads, n // k, max(1, per_node // k), network)
    compute, transfer, m = stages.times(speed, group_link(k, per_node, network), samples)
    return Option("pipeline", k, m, samples, compute, transfer, sync, batch)


def compare_parallelism(
    layers: Sequence,
    speed: SpeedModel,
    devices: int,
    per_node: int,
    network: Network,
    global_batch: int,
    gradient_bytes: float | None = None,
) -> list[Option]:
    """The data option, then for each scheme its fastest k (a divisor of `devices`, k >= 2)
    where it applies; fastest first. `layers` are `lbtrain.whatif.layers.Layer`s;
    `gradient_bytes`, when given, replaces their parameter bytes as what is allreduced
    (spread over the layers in proportion, so a stage syncs its share)."""
    if devices < 1 or global_batch < 1:
        raise ValueError("compare_parallelism needs devices >= 1 and a global batch >= 1")
    total = sum(layer.parameter_bytes for layer in layers)
    if gradient_bytes is not None and total > 0:
        scale = gradient_bytes / total
        layers = [dataclasses.replace(x, parameter_bytes=x.parameter_bytes * scale) for x in layers]
    options = [_data(layers, speed, devices, per_node, network, global_batch)]
    for scheme in (_spatial, _pipeline):
        found = [
            scheme(layers, speed, devices, k, per_node, network, global_batch)
            for k in range(2, devices + 1)
            if devices % k == 0
        ]
        found = [option for option in found if option is not None]
        if found:
            options.append(min(found, key=lambda option: option.step))
    return sorted(options, key=lambda option: option.step)
