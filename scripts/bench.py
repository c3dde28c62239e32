"""Issue 10's benchmarks in one run: one summary table, exit 1 if a target is missed.

Runs, in order, scripts/bench_balance.py, bench_sync.py, bench_ddp.py, bench_profiling.py,
bench_data.py, bench_scaling.py and bench_memory.py (each also runs alone), in one
temporary folder, so a run two benchmarks need is made once. A benchmark that fails
becomes a missed figure naming the error; the others still run. The summary table and the
exact command go to BENCHMARKS.md under "Latest `scripts/bench.py` run" (replacing the
previous one) unless --no-write.

    .venv/bin/python scripts/bench.py --quick              # all, in under 5 minutes
    .venv/bin/python scripts/bench.py --only balance,data  # full versions of two
"""

from __future__ import annotations

import argparse
import importlib
import math
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402  (after the path insert, and before torch: malloc)
from bench_common import Figure  # noqa: E402

__all__ = ["main"]

SCRIPTS = Path(__file__).resolve().parent
BENCHMARKS = {
    "balance": "1 balance",
    "sync": "2 sync",
    "ddp": "3 ddp",
    "profiling": "4 profiling",
    "data": "5 data",
    "scaling": "6 scaling",
    "memory": "7 memory",
}
QUICK_LIMIT = 300.0  # seconds: issue 10's "all of the benchmarks in under 5 minutes"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short version of each")
    parser.add_argument(
        "--only",
        default=None,
        metavar="NAMES",
        help=f"comma-separated benchmarks to run, of: {', '.join(BENCHMARKS)} (default: all)",
    )
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if args.only is None else args.only.split(",")
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)}; choose of {', '.join(BENCHMARKS)}")
    args.names = [name for name in BENCHMARKS if name in names]  # always in the order
    return args


def _run_one(name: str, quick: bool, workdir: Path) -> list[Figure]:
    """One benchmark's figures and its wall time; a failure is a figure, not a traceback."""
    label = BENCHMARKS[name]
    if not (SCRIPTS / f"bench_{name}.py").is_file():
        return [Figure(label, "skipped", math.nan, "", note=f"no scripts/bench_{name}.py yet")]
    print(f"\n== {label}: scripts/bench_{name}.py{' --quick' if quick else ''}", flush=True)
    started = time.perf_counter()
    try:
        figures = list(importlib.import_module(f"bench_{name}").run(quick, workdir))
    except (Exception, SystemExit) as exc:
        figures = [bc.failed(label, exc)]
    figures.append(Figure(label, "wall time", time.perf_counter() - started, "s"))
    print(bc.format_table(figures), flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; 1 if any target was missed, else 0."""
    args = _parse_args(argv)
    started = time.perf_counter()
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="lbtrain-bench-") as tmp:
        for name in args.names:
            figures += _run_one(name, args.quick, Path(tmp))
    total = time.perf_counter() - started
    every = args.quick and args.only is None  # the 5-minute target is for the whole quick run
    figures.append(Figure(
        "all", "total wall time", total, "s", f"< {QUICK_LIMIT:.0f}" if every else None,
        total < QUICK_LIMIT if every else None,
    ))  # fmt: skip
    print("\nsummary")
    print(bc.format_table(figures, notes=False))
    print(f"total wall time {total:.1f} s")
    command = shlex.join(
        [".venv/bin/python", "scripts/bench.py", *(argv if argv is not None else sys.argv[1:])]
    )
    if not args.no_write:
        notes = [f"total wall time {total:.1f} s", *(f"runs: `{c}`" for c in bc.COMMANDS)]
        bc.append_to_benchmarks("scripts/bench.py", command, figures, notes)
    return 1 if any(f.met is False for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
