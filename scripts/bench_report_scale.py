"""Issue 22: `lbtrain balance-report --profiles FILE` on a cluster of many ranks.

Builds a deterministic profiles file of N heterogeneous ranks (GPU-like and CPU-like
ranks with mixed fixed costs, speeds and caps, plus a few slow ranks whose fixed cost alone
outlasts the others' step, and a measured sync), then times the report in-process
(`lbtrain.cli.entry.main` with a single-process communicator, its output discarded): the
median of `--repeats` runs per N. `--profile` adds a cProfile top 10 of one run.

    .venv/bin/python scripts/bench_report_scale.py [--ranks 100,1000] [--profile]

A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Time this checkout's lbtrain, not whichever one the interpreter has installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lbtrain.cli.entry import main as lbtrain_main  # noqa: E402
from lbtrain.comm import SingleProcessCommunicator  # noqa: E402
from lbtrain.profiling.record import ReplicaProfile, save_profiles  # noqa: E402

__all__ = ["build_profiles", "main"]

LADDER = (25, 50, 100, 200)
STAMP = "2025-01-01T00:00:00.000+00:00"


def _rank(rank: int, rng: random.Random, sync: bool, ranks: int) -> ReplicaProfile:
    """One rank: 40% GPU-like, 55% CPU-like, 5% slow (fixed cost above the others' step)."""
    kind = rng.random()
    if kind < 0.40:
        alpha, beta = rng.uniform(1e-3, 4e-3), rng.uniform(0.4e-6, 2e-6)
        cap = rng.choice([None, 1024, 2048, 4096])
    elif kind < 0.95:
        alpha, beta = rng.uniform(5e-3, 40e-3), rng.uniform(0.5e-3, 4e-3)
        cap = rng.choice([None, None, 512, 4096])
    else:
        alpha, beta, cap = rng.uniform(0.5, 2.0), rng.uniform(1e-3, 5e-3), None
    return ReplicaProfile(
        rank=rank, host=f"node-{rank // 8}", device="cpu", device_kind="cpu",
        device_name="Bench rank", threads=1, workload="patch-cnn", batch_sizes=LADDER,
        step_times=tuple(alpha + beta * b for b in LADDER), alpha=alpha, beta=beta,
        r_squared=1.0, cap=cap, cap_source="bench", memory_per_sample=None, slowdown=1.0,
        repeats=5, started_at=STAMP, finished_at=STAMP, reference_batch=100,
        fit_relative_error=0.0, sync_time=5e-3 if sync else None,
        sync_bytes=4_000_000 if sync else None, sync_ranks=ranks if sync else None,
    )  # fmt: skip


def build_profiles(path: Path, ranks: int, seed: int = 22, sync: bool = True) -> Path:
    """Write a profiles file of `ranks` heterogeneous ranks, the same for the same seed."""
    rng = random.Random(seed)
    return save_profiles(path, [_rank(r, rng, sync, ranks) for r in range(ranks)])


def _argv(profiles: Path, batch: int) -> list[str]:
    return [
        "balance-report", "--profiles", str(profiles), "--global-batch", str(batch),
        "--policy", "all",
    ]  # fmt: skip


def _run(argv: list[str]) -> float:
    """Seconds one in-process report takes, its output discarded."""
    sink = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        code = lbtrain_main(argv, comm=SingleProcessCommunicator())
    elapsed = time.perf_counter() - start
    if code not in (0, None):
        raise SystemExit(f"balance-report failed ({code}): {sink.getvalue()[-2000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    """Time the report for each N and print one line per N (and a profile if asked)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ranks", default="100,1000", help="comma-separated N (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-per-rank", type=int, default=256, help="B = this x N (default: 256)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per N (default: 3)")
    parser.add_argument("--seed", type=int, default=22, help="profile seed (default: 22)")
    parser.add_argument("--no-sync", action="store_true", help="profiles carry no sync time")
    parser.add_argument("--profile", action="store_true", help="cProfile top 10 of one run per N")
    parser.add_argument("--keep", type=Path, default=None, help="folder to keep profiles in")
    args = parser.parse_args(argv)  # fmt: skip
    folder = args.keep or Path(tempfile.mkdtemp(prefix="lbtrain-bench-scale-"))
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"{'ranks':>7} {'global batch':>13} {'median s':>9} {'runs s':<30}")
    for ranks in (int(n) for n in args.ranks.split(",")):
        profiles = build_profiles(folder / f"profiles-{ranks}.json", ranks, args.seed,
                                  not args.no_sync)  # fmt: skip
        command = _argv(profiles, args.batch_per_rank * ranks)
        times = [_run(command) for _ in range(args.repeats)]
        runs = ", ".join(f"{t:.3f}" for t in times)
        print(f"{ranks:>7} {args.batch_per_rank * ranks:>13} {statistics.median(times):>9.3f} "
              f"{runs:<30}  lbtrain {shlex.join(command)}", flush=True)  # fmt: skip
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(_run, command)
            stats = io.StringIO()
            pstats.Stats(profiler, stream=stats).sort_stats("cumulative").print_stats(10)
            print(stats.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
