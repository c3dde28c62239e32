"""`lbtrain what-if`'s prediction and scaling tables, as text and as a picture."""

from __future__ import annotations

from pathlib import Path

from lbtrain.viz._deps import pyplot, save_figure
from lbtrain.whatif.cluster import Cluster, Network
from lbtrain.whatif.predict import Prediction, ScalingRow
from lbtrain.whatif.subset import Subset
from lbtrain.whatif.work import ModelWork

__all__ = ["format_prediction", "format_scaling", "format_subset", "plot_scaling"]


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3f}"


def _rate(value: float, unit: str) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:g} {prefix}{unit}"
    return f"{value:g} {unit}"


def format_prediction(
    cluster: Cluster,
    network: Network,
    result: Prediction,
    gradient_bytes: int,
    work: ModelWork | None = None,
    caps: dict[str, float] | None = None,
) -> str:
    """The plan per device group and the step's totals, in ms and samples/s."""
    intra, inter = network.intra, network.inter
    lines = [
        f"what-if: {cluster.devices:,} device{'s' * (cluster.devices != 1)} on "
        f"{cluster.nodes:,} node{'s' * (cluster.nodes != 1)}, policy "
        f"{result.policy}, global batch {result.global_batch:,}",
        f"network: intra {_rate(intra.beta, 'B/s')}, {intra.alpha * 1e6:g} us; inter "
        f"{_rate(inter.beta, 'B/s')}, {inter.alpha * 1e6:g} us; gradient "
        f"{_rate(gradient_bytes, 'B')}",
    ]
    if work is not None:
        lines.append(
            f"work: {work.description}, {work.parameters:,} parameters: "
            f"{_rate(work.flops_per_sample, 'FLOP')} and {_rate(work.bytes_per_sample, 'B')} "
            "per sample (counted; the bytes are an upper bound)"
        )
    if caps:
        held = ", ".join(f"{name} {cap:,.0f}" for name, cap in caps.items())
        lines.append(
            f"memory: at most {held} samples a device (weights, gradients, Adam's state "
            "and the activations saved for backward, in 90% of its memory)"
        )
    lines += [
        "",
        f"{'device':<12}{'count':>8}{'batch each':>12}{'zero':>8}{'compute ms':>12}"
        f"{'idle ms':>10}  speed model",
    ]
    for g in result.groups:
        each = str(g.batch_max) if g.batch_min == g.batch_max else f"{g.batch_min}-{g.batch_max}"
        model = (
            f"{1e3 * g.speed.alpha:.4g} ms + {1e3 * g.speed.beta:.4g} ms/sample, {g.speed.source}"
        )
        lines.append(
            f"{g.name:<12}{g.count:>8,}{each:>12}{g.zero:>8,}{_ms(g.compute):>12}"
            f"{_ms(g.idle):>10}  {model}"
        )
    lines += [
        "",
        f"sync        {_ms(result.sync)} ms ({result.sync_algorithm})",
        f"step        {_ms(result.step)} ms (compute {_ms(result.compute)} ms + sync)",
        f"throughput  {result.throughput:,.0f} samples/s",
        f"ideal step  {_ms(result.ideal_step)} ms; the plan reaches {result.efficiency:.1%} of it",
    ]
    return "\n".join(lines)


def format_scaling(
    name: str, kind: str, batch: int, rows: list[ScalingRow], unit: str = "devices"
) -> str:
    """The scaling table: devices (or copies of a mix), step, throughput, speedup and
    efficiency against one."""
    what = f"global batch {batch:,}" if kind == "strong" else f"{batch:,} samples per device"
    base = rows[0].base
    singular = {"copies": "copy", "devices": "device"}.get(unit, unit)
    one = f"{base:,} {singular if base == 1 else unit}"
    lines = [
        "",
        f"{kind} scaling of {name} ({what}; speedup against {one}):",
        f"{unit:>8}{'batch':>10}{'step ms':>12}{'samples/s':>14}{'speedup':>9}{'efficiency':>12}",
    ]
    for r in rows:
        lines.append(
            f"{r.devices:>8,}{r.global_batch:>10,}{_ms(r.step):>12}{r.throughput:>14,.0f}"
            f"{r.speedup:>9.2f}{r.efficiency:>12.1%}"
        )
    # Say it where more devices lose: a table alone reads like a mistake.
    peak = max(rows, key=lambda r: r.throughput)
    if rows[-1].throughput < 0.99 * peak.throughput:  # a plateau is not a loss
        lines.append(
            f"note: past {peak.devices:,} {unit} the throughput falls: the sync grows faster "
            "than the compute shrinks (a new node's slower link, say)"
        )
    return "\n".join(lines)


def plot_scaling(rows: list[ScalingRow], kind: str, path: str, unit: str = "devices") -> Path:
    """The speedup against the device count (or copies of a mix), beside perfect scaling
    (log-log)."""
    plt = pyplot()
    devices = [r.devices for r in rows]
    figure, axis = plt.subplots(figsize=(5, 4))
    axis.plot(devices, [r.speedup for r in rows], marker="o", label="predicted")
    axis.plot(devices, [n / rows[0].base for n in devices], linestyle="--", color="gray",
              label="perfect")  # fmt: skip
    axis.set_xscale("log", base=2)
    axis.set_yscale("log", base=2)
    axis.set(xlabel=unit, ylabel="speedup", title=f"{kind} scaling (what-if)")
    axis.legend()
    figure.tight_layout()
    return save_figure(figure, plt, path)


def format_subset(cluster: Cluster, best: Subset, whole: Prediction) -> str:
    """The best subset's line: what to keep of each entry, and the step it gives."""
    everything = tuple(g.count for g in cluster.groups)
    if best.counts == everything:
        return "best subset  every device: leaving any out makes the step no shorter"
    kept, left = [], []
    for group, count in zip(cluster.groups, best.counts, strict=True):
        name = f"{group.count:,}x {group.device.name}"
        if count == group.count:
            kept.append(name)
        elif count == 0:
            left.append(name)
        else:
            kept.append(f"{count:,} of {name}")
    dropped = f", leaving out {', '.join(left)}" if left else ""
    step = best.prediction.step
    gain = whole.step / step
    how = (
        f"{gain:.2f}x faster than every device"
        if gain >= 1.005
        else "as fast as every device (the rest add less than 0.5%)"
    )
    return f"best subset  {', '.join(kept)}{dropped}: step {1e3 * step:.3f} ms, {how}"
