"""`lbtrain what-if --parallelism`: data, spatial and pipeline parallelism side by side."""

from __future__ import annotations

from lbtrain.whatif.cluster import Cluster
from lbtrain.whatif.parallel import Option

__all__ = ["format_parallelism"]

_NAMES = {"data": "data", "spatial": "spatial over {k}", "pipeline": "pipeline of {k} stages"}


def _name(option: Option) -> str:
    return _NAMES[option.scheme].format(k=option.ways)


def format_parallelism(cluster: Cluster, options: list[Option]) -> str:
    """The options fastest first, then the verdict against data parallelism."""
    devices = ", ".join(
        f"{g.count:,}x {g.device.name} ({g.per_node} a node)" for g in cluster.groups
    )
    mixed = "; groups and pipelines of one kind each" if len(cluster.groups) > 1 else ""
    lines = [
        "",
        f"parallelism on {devices}, global batch {options[0].global_batch:,}; fastest first "
        f"(each scheme at its best k{mixed}):",
        f"{'scheme':<24}{'micro':>6}{'samples':>9}{'step ms':>11}{'compute ms':>12}"
        f"{'comm ms':>10}{'sync ms':>10}{'samples/s':>13}",
    ]
    for o in options:
        lines.append(
            f"{_name(o):<24}{o.microbatches:>6}{o.samples:>9,}{1e3 * o.step:>11.3f}"
            f"{1e3 * o.compute:>12.3f}{1e3 * o.communication:>10.3f}{1e3 * o.sync:>10.3f}"
            f"{o.throughput:>13,.0f}"
        )
    if len(cluster.groups) > 1:
        lines.append("the most samples a device (data), group or pipeline of each kind takes:")
        for o in options:
            split = ", ".join(
                f"{g.device.name} {n:,}" for g, n in zip(cluster.groups, o.shares, strict=True)
            )
            lines.append(f"  {_name(o)}: {split}")
    missing = [s for s in ("spatial", "pipeline") if s not in {o.scheme for o in options}]
    if missing:
        counts = ", ".join(f"{g.count:,}" for g in cluster.groups)
        lines.append(
            f"no {' or '.join(missing)} option: it needs k >= 2 devices a group dividing every "
            f"entry's count ({counts}), and a model with at least k rows (spatial) or k "
            "layers (pipeline)"
        )
    best = options[0]
    data = next(o for o in options if o.scheme == "data")
    if best.scheme == "data":
        others = [o for o in options if o.scheme != "data"]
        margin = (
            f", {others[0].step / data.step:.2f}x faster than {_name(others[0])}" if others else ""
        )
        lines.append(f"verdict: data parallelism{margin}")
    else:
        lines.append(
            f"verdict: {_name(best)}, {data.step / best.step:.2f}x faster than data parallelism"
        )
    return "\n".join(lines)
