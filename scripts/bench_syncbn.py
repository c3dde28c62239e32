"""The step with synchronised BatchNorm against the step without, on 3 emulated ranks.

`lbtrain train` under mpiexec on ranks emulating devices 1x, 2x and 4x slow (or the first
two), one thread each, on a fixed plan (so that only the BatchNorm sync differs),
`--sync-batchnorm on` and `off` alternated (on, off, on, off) so that the machine's drift
falls on both; the figure is the median measured step from epoch 2 on, and the ratio of the
medians of the two pairs:

    cd scripts && ../.venv/bin/python bench_syncbn.py [--epochs 4] [--models ssftt,resnet] \
        [--ranks 3]

`--alone B` times the layer's own cost instead: ResNet-44's forward and backward at batch B in
this process, one thread, plain BatchNorm and the synchronised layer (one-rank collectives,
as profiling times it) alternated 4 times, 8 steps each; with `LBTRAIN_HOST_KERNELS=0` for
torch's kernels in place of the compiled passes.

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


def _plan(path: Path, ranks: int) -> Path:
    from lbtrain.balancer import plan_batches

    plan = plan_batches([1 / s for s in SLOWDOWNS[:ranks]], 64, "proportional")
    path.write_text(plan.to_json(), encoding="utf-8")
    return path


def _step(model: str, sync: str, epochs: int, plan: Path, workdir: Path, ranks: int) -> float:
    out = Path(tempfile.mkdtemp(prefix=f"{model}-{sync}-", dir=workdir)) / "run"
    options = [*MODELS[model], "--epochs", str(epochs), "--threads", "1", "--plan", str(plan),
               "--replan", "off", "--emulate-slowdown", ",".join(map(str, SLOWDOWNS[:ranks])),
               "--sync-batchnorm", sync, "--devices", "cpu",
               "--no-curves", "--quiet", "--out", str(out)]  # fmt: skip
    run_command(lbtrain_command("train", ranks, options))
    steps = [e["step_seconds"] for e in epochs_of(out)[1:]]
    if not steps:
        raise BenchError("need at least 2 epochs")
    return statistics.median(steps)


def _alone(batch: int, rounds: int = 4, steps: int = 8) -> None:
    import torch

    from examples.resnet_cifar import ResNetCifar
    from lbtrain.malloc import tune_malloc
    from lbtrain.parallel.batchnorm import timed_as_synchronised
    from lbtrain.parallel.batchnorm_host import describe

    tune_malloc()  # as in a run
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ResNetCifar().train()
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def timed(net: torch.nn.Module) -> float:
        def step() -> None:
            net.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()

        step()  # untimed
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - start) / steps

    times: dict[str, list[float]] = {"plain": [], "sync": []}
    for _ in range(rounds):
        times["plain"].append(timed(model))
        with timed_as_synchronised(model) as synced:
            times["sync"].append(timed(synced))
    plain, sync = statistics.median(times["plain"]), statistics.median(times["sync"])
    print(
        f"ResNet-44 at batch {batch}, one thread: plain {plain * 1e3:.1f} ms, synchronised "
        f"{sync * 1e3:.1f} ms, ratio {sync / plain:.3f} (BatchNorm on CPU: {describe()})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--models", default="ssftt,resnet")
    parser.add_argument("--ranks", type=int, choices=(2, 3), default=3)
    parser.add_argument(
        "--alone",
        type=int,
        metavar="B",
        help="one process at batch B (--models, --ranks, --epochs do not apply)",
    )
    args = parser.parse_args()
    # examples.resnet_cifar is a module of the repository's root folder.
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    if args.alone is not None:
        if args.alone < 2:
            parser.error(f"--alone {args.alone}: a batch of at least 2 samples")
        sys.path.insert(0, root)
        _alone(args.alone)
        return
    with tempfile.TemporaryDirectory(prefix="lbtrain-bench-syncbn-") as tmp:
        plan = _plan(Path(tmp) / "plan.json", args.ranks)
        for model in args.models.split(","):
            steps: dict[str, list[float]] = {"on": [], "off": []}
            for sync in ("on", "off", "on", "off"):
                steps[sync].append(_step(model, sync, args.epochs, plan, Path(tmp), args.ranks))
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
