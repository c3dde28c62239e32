"""Scaling a mixed cluster: copies of every entry together, against one copy.

A cluster such as ``"4x h100, 64x cpu-core@16"`` is a unit a site buys or books; `mix_scaling`
predicts f copies of it (each entry's count times f, its devices per node kept) under
strong scaling (the global batch fixed) or weak scaling (a fixed batch per device, so the
global batch grows with the devices), as the one-kind `scaling` table does for devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lbtrain.whatif.cluster import Cluster, Network
from lbtrain.whatif.predict import ScalingRow, SpeedModel, predict, scaled_rows

__all__ = ["mix_scaling"]


def mix_scaling(
    cluster: Cluster,
    copies: Sequence[int],
    network: Network,
    speeds: Mapping[str, SpeedModel],
    batch: int,
    weak: bool = False,
    policy: str = "cost",
    gradient_bytes: int = 0,
    caps: Mapping[str, float] | None = None,
) -> list[ScalingRow]:
    """One row per number of copies; a row's `devices` is the copies, its speedup the
    throughput over the first row's (one copy, or the fewest copies that hold the batch)."""

    def run(f: int):  # noqa: ANN202
        scaled = cluster.with_counts([g.count * f for g in cluster.groups])
        total = batch * scaled.devices if weak else batch
        return predict(scaled, network, speeds, total, policy, gradient_bytes, caps=caps)

    return scaled_rows(copies, run, weak)
