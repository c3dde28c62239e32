"""torchrun against mpiexec (issue 19): lbtrain's sync over gloo, and `lbtrain train`'s step.

1. Sync, under `torchrun --nproc-per-node 2` (torch.distributed over gloo, CPU): HybridSN's
   gradients (5.1 M parameters, 19.5 MiB of float32), medians over rounds, each timed after
   a barrier, the slowest rank's median:

   * bare: one `torch.distributed.all_reduce` of a flat tensor of the same bytes;
   * communicator: the same tensor through `TorchDistCommunicator.allreduce_sum_`;
   * trainer's sync: `GradientSync.sync(weight, prescaled=True)` over the model's buckets
     (lbtrain's bucketed, zero-copy path, the weight folded into the loss);
   * sync_gradients: the library call, which also scales every bucket in place.

2. `lbtrain train` per step, 2 ranks, one thread each, the small synthetic scene of the
   exactness tests (hamida, patch 3) on a fixed equal plan, under mpiexec and under
   torchrun alternately: the median measured step from epoch 2 on, and the ranks' mean
   share of communication.

    .venv/bin/python scripts/bench_torchrun.py [--rounds 40] [--epochs 10] [--repeats 2]
        [--part all|sync|train]

A benchmark, not a test: it prints figures and asserts nothing. Keep the machine otherwise
idle while it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
RANKS = 2
TRAIN = (
    "train --dataset synthetic --model hamida --patch-size 3 --dropout 0 --global-batch 8 "
    "--threads 1 --optimizer sgd --lr 0.05 --quiet --no-map --replan off --devices cpu"
).split()


def _sync_worker(rounds: int) -> None:
    """One rank's side of part 1; every rank runs the same collectives in the same order."""
    import torch
    import torch.distributed as dist

    from hyperspectral.models import build_model
    from lbtrain import sync_gradients, world_communicator
    from lbtrain.comm import TorchDistCommunicator
    from lbtrain.parallel.gradients import GradientSync

    torch.set_num_threads(1)
    torch.manual_seed(0)
    comm = world_communicator()
    assert isinstance(comm, TorchDistCommunicator), type(comm)
    # One model per sync: each owns its model's `.grad` (as views of its buckets), so
    # neither pays to copy gradients back from the other's buckets.
    model, other = (build_model("hybridsn", bands=30, num_classes=16, dropout=0.0) for _ in "ab")
    sync = GradientSync(model, comm)
    sync.zero_grad()
    weight = 1.0 / comm.size
    sync_gradients(other, weight, comm)  # builds its buckets once, as in use
    flat = torch.randn(sync.nbytes // 4)
    actions = {
        "bare": lambda: dist.all_reduce(flat),
        "communicator": lambda: comm.allreduce_sum_(flat),
        "trainer's sync": lambda: sync.sync(weight, prescaled=True),
        "sync_gradients": lambda: sync_gradients(other, weight, comm),
    }
    times: dict[str, list[float]] = {name: [] for name in actions}
    for round_ in range(rounds + 1):  # the first round warms up and is dropped
        names = list(actions) if round_ % 2 == 0 else list(reversed(actions))
        for name in names:
            comm.barrier()
            begin = time.perf_counter()
            actions[name]()
            if round_:
                times[name].append(time.perf_counter() - begin)
        with torch.no_grad():  # fresh values each round: sums never grow to inf
            for tensor in (flat, *(p.grad for p in (*model.parameters(), *other.parameters()))):
                tensor.normal_()
    medians = {name: statistics.median(values) for name, values in times.items()}
    worst = comm.allgather(medians)
    if comm.rank == 0:
        result = {name: max(m[name] for m in worst) for name in medians}
        print("RESULT " + json.dumps({"nbytes": sync.nbytes, "medians": result}), flush=True)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _torchrun() -> list[str]:
    return [str(VENV_BIN / "torchrun"), "--nproc-per-node", str(RANKS), "--standalone"]


def sync_figures(rounds: int) -> dict[str, Any]:
    command = [*_torchrun(), __file__, "--worker", "--rounds", str(rounds)]
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"sync worker failed:\n{done.stdout}\n{done.stderr}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def _plan(folder: Path) -> Path:
    from lbtrain.balancer import plan_batches

    path = folder / "plan.json"
    path.write_text(plan_batches([1.0] * RANKS, 8, "proportional").to_json())
    return path


def train_step(launcher: str, epochs: int, folder: Path, plan: Path) -> tuple[float, float]:
    """(median measured step from epoch 2 on, mean communication share) of one run."""
    # Here, not at the top: bench_common tunes malloc, which the sync workers must not get.
    from bench_common import epochs_of

    out = folder / f"{launcher}-{time.monotonic_ns()}"
    options = [*TRAIN, "--epochs", str(epochs), "--plan", str(plan), "--out", str(out)]
    if launcher == "mpiexec":
        command = [str(VENV_BIN / "mpiexec"), "-n", str(RANKS), str(VENV_BIN / "lbtrain")]
    else:
        command = [*_torchrun(), "-m", "lbtrain"]
    done = subprocess.run(
        [*command, *options], capture_output=True, text=True, env=_env(), timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"{launcher} run failed:\n{done.stdout}\n{done.stderr}")
    epochs = epochs_of(out)[1:]
    steps = [e["step_seconds"] for e in epochs]
    shares = [r["comm"] / r["seconds"] for e in epochs for r in e["ranks"]]
    return statistics.median(steps), statistics.mean(shares)


def _print_sync(sync: dict[str, Any]) -> None:
    m = sync["medians"]
    print(f"1. sync of {sync['nbytes'] / 2**20:.1f} MiB, {RANKS} ranks under torchrun (gloo)")
    print("| | ms | / bare `dist.all_reduce` |\n|---|---:|---:|")
    for name, seconds in m.items():
        print(f"| {name} | {1e3 * seconds:.2f} | {seconds / m['bare']:.2f} |")


def _print_train(epochs: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="lbtrain-bench-torchrun-") as parent:
        folder = Path(parent)
        plan = _plan(folder)
        runs: dict[str, list[tuple[float, float]]] = {"mpiexec": [], "torchrun": []}
        for _ in range(repeats):
            for launcher in runs:
                runs[launcher].append(train_step(launcher, epochs, folder, plan))
    print(f"\n2. `lbtrain train`, {RANKS} ranks, batches 4+4, {epochs} epochs, per run")
    print("| launcher | step ms, each run | comm share of the step |\n|---|---:|---:|")
    for launcher, results in runs.items():
        steps = ", ".join(f"{1e3 * step:.2f}" for step, _ in results)
        shares = ", ".join(f"{100 * share:.1f} %" for _, share in results)
        print(f"| {launcher} | {steps} | {shares} |")
    ratio = statistics.median(s for s, _ in runs["torchrun"]) / statistics.median(
        s for s, _ in runs["mpiexec"]
    )
    print(f"torchrun / mpiexec step (medians of the runs): {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=40, help="timed sync rounds")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per training run")
    parser.add_argument("--repeats", type=int, default=2, help="training runs per launcher")
    parser.add_argument("--part", choices=("all", "sync", "train"), default="all")
    args = parser.parse_args()
    if args.worker:
        _sync_worker(args.rounds)
        return
    if args.part != "train":
        _print_sync(sync_figures(args.rounds))
    if args.part != "sync":
        _print_train(args.epochs, args.repeats)


if __name__ == "__main__":
    main()
