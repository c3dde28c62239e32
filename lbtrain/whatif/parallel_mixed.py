"""Data, spatial and pipeline parallelism on a cluster of several kinds of device (issue 22).

`lbtrain.whatif.parallel` compares the schemes on n identical devices. On a mixed cluster
each scheme is the same, with the batch balanced as lbtrain balances it:

- **data**: `predict` under `cost`: every device a share of the batch matched to its speed.
- **spatial over k**: each entry's devices form groups of k of their own kind (k must
  divide every entry's count; a group's halos cross the intra-node link when k divides
  the entry's devices per node, else the inter-node one); a group splits each image's rows
  evenly, and the groups share the batch so that the slowest group is as fast as it can
  be. The gradients are allreduced over every device.
- **pipeline of k stages**: each entry's devices form pipelines of k stages of their own
  kind, the pipelines share the batch the same way, and each stage's gradients are
  allreduced over the pipelines.

The balance is the integer min-max: the least step T at which the units (groups or
pipelines) can hold the whole batch, each unit i taking the most samples b with
t_i(b) <= T. t_i is non-decreasing in b, so T is found by bisection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from lbtrain.whatif.cluster import Cluster, Network
from lbtrain.whatif.network import hierarchical
from lbtrain.whatif.parallel import Option, group_link, pipeline, spatial_group
from lbtrain.whatif.predict import SpeedModel, predict

if TYPE_CHECKING:  # layers.py imports torch; these models are pure
    from lbtrain.whatif.layers import Layer

__all__ = ["compare_mixed"]

# A unit's compute and communication seconds for b samples (0, 0 at b = 0).
Times = Callable[[int], tuple[float, float]]


def _capacity(times: Times, bound: float, batch: int) -> int:
    """The most samples (<= batch) that one unit computes within `bound` seconds."""
    low, high = 0, batch
    while low < high:
        middle = (low + high + 1) // 2
        if sum(times(middle)) <= bound:
            low = middle
        else:
            high = middle - 1
    return low


def _min_max(units: Sequence[tuple[int, Times]], batch: int) -> list[int]:
    """Samples per unit of each entry ((count, times) pairs) that hold exactly `batch` with
    the least slowest unit; one figure per entry, the most any of its units takes."""
    high = min(sum(times(-(-batch // count))) for count, times in units)  # one entry alone
    low = 0.0
    for _ in range(100):
        middle = (low + high) / 2
        held = sum(count * _capacity(times, middle, batch) for count, times in units)
        low, high = (low, middle) if held >= batch else (middle, high)
    # Below the least step the units hold less than the batch, at it at least the batch:
    # the units that can take more at it share what is left, evenly inside an entry.
    most = [_capacity(times, high, batch) for _, times in units]
    base = [_capacity(times, low, batch) for _, times in units]
    if sum(count * b for (count, _), b in zip(units, base, strict=True)) >= batch:
        base = [0] * len(units)  # every unit is free (no time at all): fill from nothing
    left = batch - sum(count * b for (count, _), b in zip(units, base, strict=True))
    shares = []
    for (count, _), b, m in zip(units, base, most, strict=True):
        take = min(left, count * (m - b))
        left -= take
        shares.append(b + -(-take // count))
    return shares


def _option(
    scheme: str,
    k: int,
    units: Sequence[tuple[int, Times]],
    batch: int,
    sync: float,
    micro: Callable[[int, int], int] = lambda entry, samples: 1,
) -> Option:
    """The option: the slowest unit sets the step (and its split of compute and messages);
    `samples` and the micro-batches are those of the unit that takes the most samples."""
    samples = _min_max(units, batch)
    slowest = max(range(len(units)), key=lambda i: sum(units[i][1](samples[i])))
    compute, comm = units[slowest][1](samples[slowest])
    busiest = max(range(len(units)), key=lambda i: samples[i])
    return Option(scheme, k, micro(busiest, samples[busiest]), samples[busiest], compute, comm,
                  sync, batch, tuple(samples))  # fmt: skip


def compare_mixed(
    layers: Sequence[Layer],
    cluster: Cluster,
    network: Network,
    speeds: Mapping[str, SpeedModel],
    global_batch: int,
    gradient_bytes: float | None = None,
) -> list[Option]:
    """The data option, then for each scheme its fastest k where it applies (k >= 2 divides
    every entry's count); fastest first. As `compare_parallelism`, for several kinds."""
    if global_batch < 1:
        raise ValueError("compare_mixed needs a global batch >= 1")
    total = sum(layer.parameter_bytes for layer in layers)
    if gradient_bytes is not None and total > 0:
        scale = gradient_bytes / total
        layers = [dataclasses.replace(x, parameter_bytes=x.parameter_bytes * scale) for x in layers]
    grads = sum(layer.parameter_bytes for layer in layers)
    data = predict(cluster, network, speeds, global_batch, "cost", int(grads))
    top = max(g.batch_max for g in data.groups)
    shares = tuple(g.batch_max for g in data.groups)
    options = [Option("data", 1, 1, top, data.compute, 0.0, data.sync, global_batch, shares)]
    counts = [g.count for g in cluster.groups]
    ways = [k for k in range(2, cluster.devices + 1) if all(c % k == 0 for c in counts)]
    spatial = [_spatial(layers, cluster, network, speeds, k, global_batch) for k in ways]
    pipelines = [_pipeline(layers, cluster, network, speeds, k, global_batch) for k in ways]
    for found in (spatial, pipelines):
        found = [option for option in found if option is not None]
        if found:
            options.append(min(found, key=lambda option: option.step))
    return sorted(options, key=lambda option: option.step)


def _sync(nbytes: float, devices: int, per_node: int, nodes: int, network: Network) -> float:
    if devices <= 1 or nbytes <= 0:
        return 0.0
    return float(
        hierarchical(
            nbytes, devices, max(1, per_node), network.intra, network.inter, nodes=max(1, nodes)
        ).seconds
    )


def _spatial(layers, cluster, network, speeds, k, batch) -> Option | None:  # noqa: ANN001
    units = []
    for g in cluster.groups:
        group = spatial_group(layers, speeds[g.device.name], k, group_link(k, g.per_node, network))
        if group is None:
            return None
        units.append((g.count // k, group.times))
    grads = sum(layer.parameter_bytes for layer in layers)
    sync = _sync(grads, cluster.devices, cluster.max_per_node, cluster.nodes, network)
    return _option("spatial", k, units, batch, sync)


def _pipeline(layers, cluster, network, speeds, k, batch) -> Option | None:  # noqa: ANN001
    stages = pipeline(layers, k)
    if stages is None:
        return None
    units, models = [], []
    for g in cluster.groups:
        speed, link = speeds[g.device.name], group_link(k, g.per_node, network)
        models.append((speed, link))

        def times(b: int, speed: SpeedModel = speed, link=link) -> tuple[float, float]:  # noqa: ANN001
            compute, transfer, _ = stages.times(speed, link, b)
            return compute, transfer

        units.append((g.count // k, times))
    # Each stage syncs over the pipelines, which fill nodes of their entry's kind.
    nodes = sum(-(-(g.count // k) // max(1, g.per_node // k)) for g in cluster.groups)
    per_node = max(max(1, g.per_node // k) for g in cluster.groups)
    sync = _sync(stages.stage_grads, cluster.devices // k, per_node, nodes, network)

    def micro(entry: int, samples: int) -> int:
        return stages.times(*models[entry], samples)[2]

    return _option("pipeline", k, units, batch, sync, micro)
