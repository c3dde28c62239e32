"""What-if against a published scaling table (issue 22): PyDDP's 10.11x on 12 V100s.

The CCGRID 2020 evaluation this project cites measured PyTorch DDP at a 10.11x throughput
speedup on 12 V100 GPUs (a ResNet-44-class model on CIFAR-10-sized samples). This script
predicts the same with `lbtrain.whatif` from nothing measured:

- the work of one sample, counted from ResNet-44 itself (examples/resnet_cifar.py) by
  `count_work` (FLOP and bytes of forward, loss and backward; the gradient bytes);
- the V100 of the built-in table (spec sheet: 15.7 TFLOP/s FP32, 900 GB/s), the roofline
  at what-if's uncalibrated 50% of peak, no fixed cost per step (alpha 0: nothing measured);
- a network of its class: NVLink inside a node, 100 Gb/s between nodes.

Weak scaling (a fixed batch per GPU, as throughput benchmarks run) from 1 to 12 GPUs. What
the paper does not state here (the batch per GPU, GPUs per node, the real bandwidth between
nodes) is swept, and the script prints the sync share a 10.11x speedup implies.

    .venv/bin/python scripts/bench_published_scaling.py [--plot docs/published-scaling.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PUBLISHED = 10.11  # speedup of PyTorch DDP on 12 V100s
GPUS = 12
HEADLINE = {"batch": 128, "per_node": 4, "inter": "100Gb/s,2us"}
INTRA = "150GB/s,5us"  # V100 SXM2 NVLink 2.0: 6 links of 25 GB/s each way
BATCHES = (32, 64, 128, 256)
PER_NODE = (1, 2, 4, 8)
INTER = ("100Gb/s,2us", "25Gb/s,2us", "10Gb/s,10us")


def _setup():
    from examples.resnet_cifar import workload
    from lbtrain.whatif.devices import BUILTIN_DEVICES
    from lbtrain.whatif.predict import Roofline, speed_models
    from lbtrain.whatif.work import count_work

    work = count_work(workload())
    v100 = BUILTIN_DEVICES["v100"]
    roofline = Roofline(work.flops_per_sample, work.bytes_per_sample)
    return work, v100, speed_models([v100], roofline=roofline)


def _speedups(v100, speeds, work, batch: int, per_node: int, inter: str) -> list:
    from lbtrain.whatif.cluster import parse_network
    from lbtrain.whatif.predict import scaling

    network = parse_network(f"intra={INTRA}; inter={inter}")
    return scaling(v100, list(range(1, GPUS + 1)), network, speeds, batch, weak=True,
                   gradient_bytes=work.gradient_bytes, per_node=per_node)  # fmt: skip


def _plot(rows, path: Path) -> None:
    from lbtrain.viz._deps import pyplot, save_figure

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 4.2))
    n = [r.devices for r in rows]
    axis.plot(n, n, color="0.6", linestyle=":", label="linear")
    axis.plot(n, [r.speedup for r in rows], marker="o", label="what-if (128/GPU, 4/node)")
    axis.plot([GPUS], [PUBLISHED], marker="*", markersize=14, linestyle="none",
              color="tab:red", label=f"PyTorch DDP, published ({PUBLISHED}x)")  # fmt: skip
    axis.set_xlabel("V100 GPUs")
    axis.set_ylabel("throughput speedup over 1 GPU")
    axis.set_title("ResNet-44, CIFAR-10 shapes: weak scaling")
    axis.legend()
    axis.grid(alpha=0.3)
    print(f"plot written to {save_figure(figure, plt, path)}")


def main(argv: list[str] | None = None) -> int:
    """Print the headline, the sweeps and the implied sync share; 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", type=Path, help="write the headline curve as a PNG")
    args = parser.parse_args(argv)
    work, v100, speeds = _setup()
    speed = speeds["v100"]
    print(f"{work.description}: {work.parameters:,} parameters, "
          f"{work.flops_per_sample / 1e6:.1f} MFLOP and {work.bytes_per_sample / 1e6:.2f} MB "
          f"a sample, {work.gradient_bytes / 1e6:.2f} MB of gradients; V100 {speed.source}: "
          f"{1e6 * speed.beta:.1f} us a sample")  # fmt: skip
    rows = _speedups(v100, speeds, work, **HEADLINE)
    print(f"\nheadline: {HEADLINE['batch']}/GPU, {HEADLINE['per_node']} GPUs a node, "
          f"intra {INTRA}, inter {HEADLINE['inter']}")  # fmt: skip
    print("| GPUs | step (ms) | speedup | efficiency |\n|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.devices} | {1e3 * r.step:.2f} | {r.speedup:.2f} | {r.efficiency:.1%} |")
    print(f"\npredicted {rows[-1].speedup:.2f}x at {GPUS} GPUs against the published "
          f"{PUBLISHED}x")  # fmt: skip
    print("\nspeedup at 12 GPUs, swept: | batch/GPU | GPUs/node | " + " | ".join(INTER) + " |")
    for batch in BATCHES:
        for per_node in PER_NODE:
            cells = [_speedups(v100, speeds, work, batch, per_node, inter)[-1].speedup
                     for inter in INTER]  # fmt: skip
            print(f"| {batch} | {per_node} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    one = rows[0].step
    # weak scaling: speedup = n * t1 / tn, so 10.11x at 12 means tn = t1 * 12 / 10.11
    extra = one * (GPUS / PUBLISHED - 1)
    print(f"\n10.11x at 12 GPUs means a step {GPUS / PUBLISHED:.3f}x one GPU's: "
          f"{1e3 * extra:.2f} ms a step more than one GPU's {1e3 * one:.2f} ms here "
          f"({extra / (one + extra):.1%} of the step)")  # fmt: skip
    if args.plot:
        _plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
