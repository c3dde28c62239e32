"""Benchmark 4 (issue 10): what profiling costs, as a share of the `make demo` run.

The demo: real Indian Pines, hamida, patch 11, PCA 30, 30 epochs, global batch 64, 3 ranks
emulating 1x, 2x and 4x devices, `cost`, the default profiling budget (2 s). summary.json
holds `profile_seconds` (profiling, re-timing and planning) and `wall_seconds` (the
trainer's whole run). Target: profiling <= 3% of the wall time.

Full mode runs the demo itself. Quick mode runs its first 2 epochs (the run bench_balance
and bench_memory share, with `--no-map --replan off`) and projects the 30-epoch wall time as
the measured wall plus 28 x the median epoch from epoch 2 on. Without the map pass the
projected wall is shorter than the demo's, so the quick share errs high.

    .venv/bin/python scripts/bench_profiling.py [--quick] [--no-write]
"""

from __future__ import annotations

import sys
from pathlib import Path

import bench_common as bc
from bench_common import Figure

__all__ = ["main", "run"]

NAME = "4 profiling"
TARGET = 0.03


def run(quick: bool, workdir: Path) -> list[Figure]:
    """The profiling share of the demo's wall time (projected in quick mode)."""
    demo = bc.demo_run(quick, workdir)
    summary, epochs = demo.summary, bc.epochs_of(demo.out)
    profile = summary["profile_seconds"]
    ran = len(epochs)
    wall = summary["wall_seconds"]
    note = f"summary.json wall_seconds over {ran} epochs (the trainer's, without imports)"
    if ran < bc.DEMO_EPOCHS:
        epoch = bc.median_of(epochs, "seconds")
        wall += (bc.DEMO_EPOCHS - ran) * epoch
        note = (
            f"projected: wall_seconds {summary['wall_seconds']:.1f} s for {ran} epochs (no map) + "
            f"{bc.DEMO_EPOCHS - ran} x {epoch:.2f} s (median epoch from epoch 2 on)"
        )
    share = profile / wall
    return [
        Figure(NAME, "profiling time", profile, "s", note="profile + re-time + plan, 3 ranks"),
        Figure(NAME, "demo wall time" + (" (projected)" if ran < bc.DEMO_EPOCHS else ""), wall,
               "s", note=note),  # fmt: skip
        Figure(NAME, "profiling / demo wall", share, "", f"<= {TARGET:.2f}", share <= TARGET,
               f"{100 * share:.1f}% of the wall time; --time-budget 2 (the default)"),
    ]  # fmt: skip


def main() -> None:
    """Run alone: print the table, write the section, exit 1 if the target is missed."""
    sys.exit(bc.standalone("scripts/bench_profiling.py", run, name=NAME))


if __name__ == "__main__":
    main()
