"""Benchmark 6: a step through `BalancedDataParallel` against the bare `GradientSync` loop.

HybridSN (5.1 M parameters), 2 ranks under mpiexec, one thread each, overlap on (4 MiB
buckets). Round after round, one step of each (the order alternates, so drift in the
machine's speed falls on both), each timed after a barrier; medians over rounds, the
slowest rank's:

* bare: `GradientSync.begin(w, prescaled=True)`, `(loss * w).backward()`, `launch()`,
  `wait()`, `optimizer.step()`: the loop the trainer ran before issue 19;
* wrapper: `optimizer.zero_grad()`, `loss_fn(model(x), y).backward()` (the sync finishes
  inside backward), `optimizer.step()`.

    .venv/bin/python scripts/bench_wrapper.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import Figure, standalone  # noqa: E402

__all__ = ["main", "run"]

VENV_BIN = Path(sys.executable).parent
RANKS = 2


def _worker(rounds: int, batch: int) -> None:
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from hyperspectral.models import build_model
    from lbtrain import BalancedDataParallel, balanced_loader, world_communicator
    from lbtrain.parallel.gradients import GradientSync

    torch.set_num_threads(1)
    torch.manual_seed(0)
    comm = world_communicator()
    model = build_model("hybridsn", bands=30, num_classes=16, dropout=0.0)
    total = batch * comm.size
    data = TensorDataset(torch.randn(total, 30, 25, 25), torch.randint(0, 16, (total,)))
    loader = balanced_loader([1.0] * comm.size, data, global_batch_size=batch * comm.size,
                             rank=comm.rank)  # fmt: skip
    wrapped = BalancedDataParallel(model, comm, loader)
    bare = GradientSync(model, comm, overlap=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss_fn = nn.CrossEntropyLoss()
    times: dict[str, list[float]] = {"bare": [], "wrapper": []}

    def bare_step(x: torch.Tensor, y: torch.Tensor) -> None:
        weight = loader.weight
        bare.begin(weight, prescaled=True)
        (loss_fn(model(x), y) * weight).backward()
        bare.launch()
        bare.wait()
        optimizer.step()

    def wrapper_step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss_fn(wrapped(x), y).backward()
        optimizer.step()

    order = [("bare", bare_step), ("wrapper", wrapper_step)]
    for round_index in range(rounds + 1):  # the first round warms up and is dropped
        for name, step in order if round_index % 2 else order[::-1]:
            x, y = next(iter(loader))
            comm.barrier()
            begin = time.perf_counter()
            step(x, y)
            times[name].append(time.perf_counter() - begin)
    medians = {name: statistics.median(values[1:]) for name, values in times.items()}
    worst = comm.allgather(medians)
    if comm.rank == 0:
        result = {name: max(m[name] for m in worst) for name in medians}
        print("RESULT " + json.dumps(result), flush=True)


def run(quick: bool, workdir: Path) -> list[Figure]:
    """One launch of 2 ranks; the ratio with the issue's target."""
    del workdir
    rounds, batch = (10, 4) if quick else (40, 4)
    command = [str(VENV_BIN / "mpiexec"), "-n", str(RANKS), sys.executable, __file__,
               "--worker", "--rounds", str(rounds), "--batch", str(batch)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"bench_wrapper worker failed:\n{done.stdout}\n{done.stderr}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    m = json.loads(line.removeprefix("RESULT "))
    ratio = m["wrapper"] / m["bare"]
    bench = "6 wrapper"
    return [
        Figure(bench, f"bare GradientSync step (batch {batch}/rank)", 1e3 * m["bare"], "ms"),
        Figure(bench, "BalancedDataParallel step", 1e3 * m["wrapper"], "ms"),
        Figure(bench, "wrapper step / bare step", ratio, "x", "<= 1.02", ratio <= 1.02),
    ]


def main() -> None:
    """Standalone use, and the ranks' entry point (--worker)."""
    if "--worker" not in sys.argv:
        sys.exit(standalone("scripts/bench_wrapper.py", run))
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    _worker(args.rounds, args.batch)


if __name__ == "__main__":
    main()
