"""Run one ``python -m hyperspectral train`` job in-process and print its figures and peak RSS.

Usage (any ``train`` flags pass through)::

    flock /tmp/lbtrain-bench.lock .venv/bin/python scripts/hs_benchmark.py \
        --model hybridsn --train-ratio 0.1 --seed 0 --threads 2 --out /tmp/hs-bench-s0

Prints the usual per-epoch lines, the metrics table, then one ``RESULT`` line: OA, AA and kappa
in %, wall time of the whole process (imports and data loading included) and the peak resident
set size from ``resource.getrusage`` (``ru_maxrss`` is in KiB on Linux).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

_T0 = time.perf_counter()

# Run from a checkout without installing: make the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lbtrain.malloc import tune_malloc  # noqa: E402

tune_malloc()  # before torch is imported, as `python -m hyperspectral` does

from hyperspectral.cli import build_parser, main  # noqa: E402

__all__ = ["peak_rss_mib", "run"]


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(argv: list[str]) -> int:
    """Run ``train`` with ``argv`` and print a one-line summary; returns the exit status."""
    args = ["train", *argv]
    status = main(args)
    if status != 0:
        return status
    out = Path(build_parser().parse_args(args).out)
    metrics = json.loads((out / "metrics.json").read_text())
    wall = time.perf_counter() - _T0
    print(
        f"RESULT OA {100 * metrics['oa']:.2f} %  AA {100 * metrics['aa']:.2f} %  "
        f"kappa {100 * metrics['kappa']:.2f}  train {metrics['train_seconds']:.0f} s  "
        f"run {metrics['wall_seconds']:.0f} s  process wall {wall:.0f} s  "
        f"peak RSS {peak_rss_mib():.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
