"""The step with synchronised BatchNorm against the step without, on 3 emulated ranks.

`lbtrain train` under mpiexec on ranks emulating devices 1x, 2x and 4x slow (or the first
two), one thread each, on a fixed plan (so that only the BatchNorm sync differs),
`--sync-batchnorm on` and `off` alternated (on, off, on, off) so that the machine's drift
falls on both; the figure is the median measured step from epoch 2 on, and the ratio of the
medians of the two pairs:

    cd scripts && ../.venv/bin/python bench_syncbn.py [--epochs 4] [--models ssftt,resnet] \
        [--ranks 3] [--scale 2]

`--scale 2` emulates 2x, 4x and 8x: the same ratios of speed, with less compute than the
cores of a 2-core machine can give 3 ranks.

`--alone B` times the layer's own cost instead: ResNet-44's forward and backward at batch B in
this process, one thread, plain BatchNorm and the synchronised layer (one-rank collectives,
as profiling times it) alternated 4 times, 8 steps each; with `LBTRAIN_HOST_KERNELS=0` for
torch's kernels in place of the compiled passes. `--nap MS` adds a sleep before each of the
layer's collectives, as an emulated slow rank sleeps there, and times the CPU less the naps:
what the sleeps themselves cost the compute after them.

A benchmark, not a test: it prints figures and asserts nothing (the target of issue 37 is
a ratio of at most 1.10). Keep the machine otherwise idle while it runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_common import BenchError, epochs_of, run_command
from bench_common import lbtrain as lbtrain_command

MODELS = {
    "ssftt": ["--dataset", "indian_pines", "--model", "ssftt", "--dropout", "0", "--no-map"],
    "resnet": ["--workload", "examples.resnet_cifar:workload"],
}
# Ranks emulating devices 1x, 2x and 4x slow (or the first two), planned in proportion to
# their speeds over a global batch of 64: 37/18/9 (or 43/21).
SLOWDOWNS = (1, 2, 4)


def _plan(path: Path, slowdowns: tuple[float, ...]) -> Path:
    from lbtrain.balancer import plan_batches

    plan = plan_batches([1 / s for s in slowdowns], 64, "proportional")
    path.write_text(plan.to_json(), encoding="utf-8")
    return path


def _step(
    model: str, sync: str, epochs: int, plan: Path, workdir: Path, slowdowns: tuple[float, ...]
) -> float:
    out = Path(tempfile.mkdtemp(prefix=f"{model}-{sync}-", dir=workdir)) / "run"
    options = [*MODELS[model], "--epochs", str(epochs), "--threads", "1", "--plan", str(plan),
               "--replan", "off", "--emulate-slowdown", ",".join(f"{s:g}" for s in slowdowns),
               "--sync-batchnorm", sync, "--devices", "cpu",
               "--no-curves", "--quiet", "--out", str(out)]  # fmt: skip
    run_command(lbtrain_command("train", len(slowdowns), options))
    epochs = epochs_of(out)[1:]
    if not epochs:
        raise BenchError("need at least 2 epochs")
    # Where the step goes on each rank: its compute (stretched) and its wait, a step.
    ranks = [
        (
            statistics.median(e["ranks"][r]["compute"] / e["steps"] for e in epochs),
            statistics.median(e["ranks"][r]["wait"] / e["steps"] for e in epochs),
        )
        for r in range(len(slowdowns))
    ]
    print(
        "  a step, compute / wait: "
        + ", ".join(
            f"{s:g}x {c * 1e3:.0f} / {w * 1e3:.0f} ms"
            for s, (c, w) in zip(slowdowns, ranks, strict=True)
        ),
        flush=True,
    )
    return statistics.median(e["step_seconds"] for e in epochs)


def _alone(batch: int, nap: float, rounds: int = 4, steps: int = 8) -> None:
    import torch

    from examples.resnet_cifar import ResNetCifar
    from lbtrain.malloc import tune_malloc
    from lbtrain.parallel.batchnorm import sync_batchnorm_layers, timed_as_synchronised
    from lbtrain.parallel.batchnorm_host import describe

    tune_malloc()  # as in a run
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ResNetCifar().train()
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    napped = [0.0]  # CPU seconds spent in the naps, left out of the step

    def sleep() -> None:  # before each collective, as an emulated slow rank sleeps
        start = time.thread_time()
        time.sleep(nap)
        napped[0] += time.thread_time() - start

    def timed(net: torch.nn.Module) -> float:
        def step() -> None:
            net.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()

        step()  # untimed
        # With naps, the CPU time less theirs (as the emulation times a piece); else the wall.
        clock = time.thread_time if nap else time.perf_counter
        napped[0], start = 0.0, clock()
        for _ in range(steps):
            step()
        return (clock() - start - napped[0]) / steps

    times: dict[str, list[float]] = {"plain": [], "sync": []}
    for _ in range(rounds):
        times["plain"].append(timed(model))
        with timed_as_synchronised(model) as synced:
            for _, layer in sync_batchnorm_layers(synced) if nap else ():
                layer.before_collective = sleep
            times["sync"].append(timed(synced))
    plain, sync = statistics.median(times["plain"]), statistics.median(times["sync"])
    what = "wall" if not nap else f"CPU, a {nap * 1e3:g} ms nap before each collective"
    print(
        f"ResNet-44 at batch {batch}, one thread ({what}): plain {plain * 1e3:.1f} ms, "
        f"synchronised {sync * 1e3:.1f} ms, ratio {sync / plain:.3f} "
        f"(BatchNorm on CPU: {describe()})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--models", default="ssftt,resnet")
    parser.add_argument("--ranks", type=int, choices=(2, 3), default=3)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every rank's factor: 2 emulates 2x, 4x and 8x, which on 2 cores keeps 3 "
        "ranks' compute under the cores (with 1x, 2x, 4x they ask for 1.75 cores, and each of "
        "ResNet's 86 collectives a step hands the cores round)",
    )
    parser.add_argument(
        "--alone",
        type=int,
        metavar="B",
        help="one process at batch B (--models, --ranks, --epochs do not apply)",
    )
    parser.add_argument(
        "--nap",
        type=float,
        default=0.0,
        metavar="MS",
        help="with --alone: sleep MS milliseconds before each of the layer's collectives, as "
        "an emulated slow rank does, and time the step's CPU less the naps",
    )
    args = parser.parse_args()
    # examples.resnet_cifar is a module of the repository's root folder.
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    if not args.nap >= 0 or (args.nap and args.alone is None):
        parser.error(f"--nap {args.nap:g}: milliseconds >= 0, with --alone")
    if not args.scale >= 1:
        parser.error(f"--scale {args.scale:g}: a factor of at least 1 (emulation only slows)")
    if args.alone is not None:
        if args.alone < 2:
            parser.error(f"--alone {args.alone}: a batch of at least 2 samples")
        sys.path.insert(0, root)
        _alone(args.alone, args.nap / 1e3)
        return
    with tempfile.TemporaryDirectory(prefix="lbtrain-bench-syncbn-") as tmp:
        slowdowns = tuple(args.scale * s for s in SLOWDOWNS[: args.ranks])
        plan = _plan(Path(tmp) / "plan.json", slowdowns)
        for model in args.models.split(","):
            steps: dict[str, list[float]] = {"on": [], "off": []}
            for sync in ("on", "off", "on", "off"):
                steps[sync].append(_step(model, sync, args.epochs, plan, Path(tmp), slowdowns))
                print(
                    f"{model} sync {sync}: median step {steps[sync][-1] * 1e3:.1f} ms", flush=True
                )
            on, off = statistics.median(steps["on"]), statistics.median(steps["off"])
            print(
                f"{model}: step with sync {on * 1e3:.1f} ms, without {off * 1e3:.1f} ms, "
                f"ratio {on / off:.3f} (runs: on {[round(s * 1e3, 1) for s in steps['on']]}, "
                f"off {[round(s * 1e3, 1) for s in steps['off']]} ms)",
                flush=True,
            )


if __name__ == "__main__":
    main()
