"""Benchmark 5 (issue 10): the balanced loader against the model it feeds, in one process.

Real Indian Pines as `make demo` prepares it (hamida, patch 11, PCA 30; 1,025 training
pixels), one torch thread, global batch 64. Two rates, measured in alternating rounds so
noise on the shared machine hits both alike (medians over the rounds):

* loader: iterate `lbtrain.balanced_loader` over the workload's training set, the loader
  `lbtrain train` builds (its plan, seed and collate function), patch extraction included,
  without training: samples/s per epoch;
* training: forward, backward and Adam step of the same model on the same batches
  (fetched beforehand), as the trainer runs them: samples/s per step.

Target: the loader delivers at least 5x the samples/s the model trains on.

    .venv/bin/python scripts/bench_data.py [--quick] [--no-write]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import bench_common as bc
from bench_common import Figure

__all__ = ["main", "run"]

NAME = "5 data"
TARGET = 5.0
OPTIONS = {"dataset": "indian_pines", "model": "hamida", "patch_size": 11, "pca": 30}


def run(quick: bool, workdir: Path) -> list[Figure]:
    """Loader and training samples/s, and their ratio."""
    import torch

    from lbtrain import balanced_loader, plan_batches
    from lbtrain.trainer.optim import build_optimizer
    from lbtrain.workloads import get_plugin

    torch.set_num_threads(1)
    workload = get_plugin("hyperspectral").make(seed=0, options={**OPTIONS, "map": False})
    # One rank holding the whole global batch: the per-sample work of any rank's share.
    plan = plan_batches([1.0], bc.DEMO_BATCH, "equal")
    loader = balanced_loader(
        plan, workload.train_set, rank=0, seed=0, collate_fn=workload.collate_fn
    )
    torch.manual_seed(0)
    model = workload.build_model()
    model.train()
    optimizer = build_optimizer(model.parameters(), "adam", lr=1e-3)
    loader.set_epoch(0)
    batches = [batch for batch in loader if len(batch[1]) == bc.DEMO_BATCH]

    def train_step(inputs: torch.Tensor, targets: torch.Tensor) -> float:
        started = time.perf_counter()
        optimizer.zero_grad()
        workload.loss_fn(model(inputs), targets).backward()
        optimizer.step()
        return len(targets) / (time.perf_counter() - started)

    for inputs, targets in batches[:2]:  # warm-up: allocations, lazy initialisation
        train_step(inputs, targets)
    rounds, steps = (3, 2) if quick else (10, 4)
    load_rates: list[float] = []
    train_rates: list[float] = []
    for index in range(rounds):
        loader.set_epoch(index + 1)
        started = time.perf_counter()
        samples = sum(len(targets) for _, targets in loader)
        load_rates.append(samples / (time.perf_counter() - started))
        for step in range(steps):
            train_rates.append(train_step(*batches[(index * steps + step) % len(batches)]))
    load, fit = statistics.median(load_rates), statistics.median(train_rates)
    ratio = load / fit
    return [
        Figure(NAME, "loader samples/s", load, "samples/s",
               note=f"median of {rounds} epochs of {samples} samples, batches of {bc.DEMO_BATCH}"),
        Figure(NAME, "training samples/s", fit, "samples/s",
               note=f"median of {len(train_rates)} steps of batch {bc.DEMO_BATCH}, 1 thread"),
        Figure(NAME, "loader / training", ratio, "x", f">= {TARGET:g}", ratio >= TARGET),
    ]  # fmt: skip


def main() -> None:
    """Run alone: print the table, write the section, exit 1 if the target is missed."""
    sys.exit(bc.standalone("scripts/bench_data.py", run, name=NAME))


if __name__ == "__main__":
    main()
