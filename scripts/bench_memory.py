"""Benchmark 7 (issue 10): peak resident memory per rank of the `make demo` run.

Each rank reports its peak RSS (`getrusage(RUSAGE_SELF).ru_maxrss`, from process start to
the end of the run) in summary.json, per rank as `peak_rss_mib`. Target: at most 1.5 GB
(1.5e9 bytes, 1,430.5 MiB) per rank. Full mode reads the demo itself (30 epochs, with the
map pass); quick mode reads the 2-epoch demo-config run bench_profiling uses (no map pass;
the peak is reached in profiling and the first steps, which both runs share).

    .venv/bin/python scripts/bench_memory.py [--quick] [--no-write]
"""

from __future__ import annotations

import sys
from pathlib import Path

import bench_common as bc
from bench_common import Figure

__all__ = ["main", "run"]

NAME = "7 memory"
TARGET_MIB = 1.5e9 / 2**20


def run(quick: bool, workdir: Path) -> list[Figure]:
    """One figure per rank, each against the target."""
    demo = bc.demo_run(quick, workdir)
    summary = demo.summary
    epochs = len(bc.epochs_of(demo.out))
    figures = []
    for row in summary["ranks"]:
        peak = row.get("peak_rss_mib")
        if peak is None:
            raise bc.BenchError("summary.json has no peak_rss_mib (lbtrain/trainer/summary.py)")
        figures.append(Figure(
            NAME, f"peak RSS rank {row['rank']} (x{row['slowdown']:g}, batch {row['batch_size']})",
            peak, "MiB", f"<= {TARGET_MIB:,.0f} (1.5 GB)", peak <= TARGET_MIB,
            f"demo config, {epochs} epochs" + (", no map" if epochs < bc.DEMO_EPOCHS else ""),
        ))  # fmt: skip
    return figures


def main() -> None:
    """Run alone: print the table, write the section, exit 1 if the target is missed."""
    sys.exit(bc.standalone("scripts/bench_memory.py", run, name=NAME))


if __name__ == "__main__":
    main()
