"""Measure issue 3's Done-when: run `lbtrain balance-report` under mpiexec several times.

Each run profiles every rank afresh (with an emulated slowdown per rank) and prints the
report as JSON; this script keeps each run's profiles, and prints per run the measured
throughputs, the throughput ratio sum(s) / (P * min(s)) that issue 3 measured against, each
policy's predicted speedup over `equal`, whether it lies within the tolerance of the ratio,
its efficiency (the report's ideal step / its predicted step), and whether the slowest rank
gets the smallest batch.

The report itself no longer prints the ratio: it reads every throughput at the reference
batch B/P, and a device with a fixed cost per step runs far faster at the batch a plan gives
it, so the ratio can understate what balancing buys. It is computed here from the report's
samples/s only to repeat issue 3's measurement.

    flock /tmp/lbtrain-bench.lock .venv/bin/python scripts/bench_balance_report.py --runs 3

A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions (default: 3)")
    parser.add_argument("--ranks", type=int, default=3, help="mpiexec -n (default: 3)")
    parser.add_argument(
        "--slowdown", default="1,2,4", help="--emulate-slowdown value (default: 1,2,4)"
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.15, help="allowed relative gap (default: 0.15)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "lbtrain-bench-balance-report",
        help="folder for each run's profiles and report (default: %(default)s)",
    )
    parser.add_argument(
        "extra",
        nargs="*",
        help="further balance-report options after --, e.g. -- --global-batch 512",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the report `--runs` times and print one summary line per run and policy."""
    args = _parse_args(argv)
    bin_dir = Path(sys.executable).parent
    mpiexec = bin_dir / "mpiexec"
    lbtrain = bin_dir / "lbtrain"
    args.out.mkdir(parents=True, exist_ok=True)
    within_all = True
    for run in range(1, args.runs + 1):
        profiles = args.out / f"profiles-run{run}.json"
        command = [
            str(mpiexec), "-n", str(args.ranks), str(lbtrain), "balance-report",
            "--policy", "all", "--emulate-slowdown", args.slowdown, "--format", "json",
            "--save-profiles", str(profiles), *args.extra,
        ]  # fmt: skip
        print(f"run {run}: {shlex.join(command)}", flush=True)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            print(result.stdout + result.stderr)
            return result.returncode
        (args.out / f"report-run{run}.json").write_text(result.stdout)
        report = json.loads(result.stdout)
        speeds = [r["samples_per_second"] for r in report["replicas"]]
        slowest = speeds.index(min(speeds))
        ratio = sum(speeds) / (len(speeds) * min(speeds))
        relative = ", ".join(f"{s / speeds[0]:.3f}" for s in speeds)
        print(
            f"  throughputs {', '.join(f'{s:,.0f}' for s in speeds)} samples/s "
            f"(relative to rank 0: {relative}); throughput ratio {ratio:.3f}x; ideal step "
            f"{1e3 * report['ideal']['step']:.3f} ms"
        )
        for policy, figures in report["policies"].items():
            sizes = [r["batch_size"] for r in figures["ranks"]]
            speedup = figures["speedup_over_equal"]
            gap = speedup / ratio - 1
            within = abs(gap) <= args.tolerance
            smallest = sizes[slowest] == min(sizes)
            if policy != "equal":
                within_all &= within and smallest
            print(
                f"  {policy:<12} batches {sizes}  speedup {speedup:.3f}x  "
                f"efficiency {100 * figures['efficiency']:.1f}%  "
                f"{100 * gap:+.1f}% vs ratio  within {100 * args.tolerance:.0f}%: "
                f"{'yes' if within else 'no'}  slowest rank smallest batch: "
                f"{'yes' if smallest else 'no'}"
            )
    print(f"all runs within tolerance, slow rank smallest: {'yes' if within_all else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
