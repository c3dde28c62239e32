"""`lbtrain what-if --parallelism`: data, spatial and pipeline parallelism side by side."""

from __future__ import annotations

from lbtrain.whatif.parallel import Option

__all__ = ["format_parallelism"]

_NAMES = {"data": "data", "spatial": "spatial over {k}", "pipeline": "pipeline of {k} stages"}


def _name(option: Option) -> str:
    return _NAMES[option.scheme].format(k=option.ways)


def format_parallelism(device: str, count: int, per_node: int, options: list[Option]) -> str:
    """The options fastest first, then the verdict against data parallelism."""
    lines = [
        "",
        f"parallelism on {count:,}x {device} ({per_node} a node), global batch "
        f"{options[0].global_batch:,}; fastest first (each scheme at its best k):",
        f"{'scheme':<24}{'micro':>6}{'samples':>9}{'step ms':>11}{'compute ms':>12}"
        f"{'comm ms':>10}{'sync ms':>10}{'samples/s':>13}",
    ]
    for o in options:
        lines.append(
            f"{_name(o):<24}{o.microbatches:>6}{o.samples:>9,}{1e3 * o.step:>11.3f}"
            f"{1e3 * o.compute:>12.3f}{1e3 * o.communication:>10.3f}{1e3 * o.sync:>10.3f}"
            f"{o.throughput:>13,.0f}"
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
