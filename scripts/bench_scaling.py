"""Benchmark 6 (issue 10): strong scaling at a fixed global batch, 1, 2 and 3 ranks.

The demo's model and global batch (hamida, patch 11, PCA 30, B = 64) on real Indian Pines,
its 1,025 training pixels (quick: half, 512, so an epoch is 8 steps of 64, not 16), no
emulated slowdown, `--policy equal`, one torch thread per rank. Measured: the median epoch
and step time from epoch 2 on; parallel efficiency T1 / (P x TP). No target: the machine
has 2 cores, so 3 ranks (3 single-threaded processes) oversubscribe it.

    .venv/bin/python scripts/bench_scaling.py [--quick] [--no-write]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import bench_common as bc
from bench_common import Figure

__all__ = ["main", "run"]

NAME = "6 scaling"
RANKS = (1, 2, 3)


def run(quick: bool, workdir: Path) -> list[Figure]:
    """Epoch time and parallel efficiency per rank count."""
    options = [
        *bc.DEMO_MODEL, "--global-batch", str(bc.DEMO_BATCH), "--policy", "equal",
        "--split-file", str(bc.bench_split(workdir) if quick else bc.eval_subset_split(workdir)),
        "--epochs", "2" if quick else "5",
        "--no-map", "--replan", "off", "--devices", "cpu",
    ]  # fmt: skip
    figures: list[Figure] = []
    epoch: dict[int, float] = {}
    comm_share = []
    for ranks in RANKS:
        # `equal` needs no profile: train its plan at once (its predictions mean nothing).
        plan = bc.write_plan(workdir / f"plan-scaling-{ranks}.json", "equal", ranks)
        trained = bc.train(ranks, [*options, "--plan", str(plan)], workdir)
        summary, epochs = trained.summary, bc.epochs_of(trained.out)
        epoch[ranks] = bc.median_of(epochs, "seconds")
        step = bc.median_of(epochs, "step_seconds")
        efficiency = epoch[1] / (ranks * epoch[ranks])
        share = max(row["communication_fraction"] for row in summary["ranks"])
        comm_share.append(f"{100 * share:.1f}%")
        label = f"{ranks} rank{'s' if ranks > 1 else ''}"
        last = epochs[-1]
        figures += [
            Figure(NAME, f"{label}: epoch", epoch[ranks], "s",
                   note=f"{last['steps']} steps; step {1e3 * step:.1f} ms, batches "
                   f"{'/'.join(map(str, last['batch_sizes']))}"),
            Figure(NAME, f"{label}: efficiency T1/(P*TP)", efficiency, "",
                   note=f"speedup {epoch[1] / epoch[ranks]:.2f}x"),
        ]  # fmt: skip
    figures[-1].note += (
        f"; on {os.cpu_count()} cores 2 ranks fill them and 3 single-threaded ranks share them: "
        f"the cores saturate, and 3 ranks take {epoch[3] / epoch[2]:.2f}x the 2-rank epoch; the "
        f"sync's share of a step (worst rank) is {', '.join(comm_share)} for 1, 2, 3 ranks"
    )
    return figures


def main() -> None:
    """Run alone: print the table and write the section (no targets)."""
    sys.exit(bc.standalone("scripts/bench_scaling.py", run, name=NAME))


if __name__ == "__main__":
    main()
