"""Run one ``lbtrain train --workload hyperspectral`` job in-process; print figures and peak RSS.

Usage (any ``lbtrain train`` flags pass through; ``--out`` is required, a new folder)::

    flock /tmp/lbtrain-bench.lock .venv/bin/python scripts/hs_benchmark.py \
        --model hybridsn --train-ratio 0.1 --seed 0 --threads 2 --out /tmp/hs-bench-s0

Prints what ``lbtrain train`` prints (per-epoch lines, the per-class table, the run summary),
then one ``RESULT`` line: OA and AA in %, kappa in [-1, 1], the training seconds and the run's
wall time (from the run's summary.json), the wall time of the whole process (imports and data
loading included) and the peak resident set size from ``resource.getrusage`` (``ru_maxrss`` is
in KiB on Linux).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

_T0 = time.perf_counter()

# Run from a checkout without installing: make the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lbtrain.malloc import tune_malloc  # noqa: E402

tune_malloc()  # before torch is imported, as the `lbtrain` command does

from lbtrain.cli.entry import main  # noqa: E402

__all__ = ["out_dir", "peak_rss_mib", "run"]


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def out_dir(argv: Sequence[str]) -> str | None:
    """The value of the last ``--out DIR`` or ``--out=DIR`` in ``argv``, None without one."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--out="):
            found = arg.split("=", 1)[1]
    return found


def run(argv: list[str]) -> int:
    """Run ``lbtrain train`` with ``argv`` and print a one-line summary; returns the status."""
    out = out_dir(argv)
    if out is None and not {"-h", "--help"} & set(argv):
        print(
            "hs_benchmark: error: give --out DIR (a new folder): the figures are read from "
            "the metrics.json and summary.json the run writes there",
            file=sys.stderr,
        )
        return 2
    status = main(["train", "--workload", "hyperspectral", *argv])
    if status != 0 or out is None:
        return status
    folder = Path(out).expanduser()
    metrics = json.loads((folder / "metrics.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    wall = time.perf_counter() - _T0
    print(
        f"RESULT OA {100 * metrics['oa']:.2f} %  AA {100 * metrics['aa']:.2f} %  "
        f"kappa {metrics['kappa']:.4f}  train {summary['train_seconds']:.0f} s  "
        f"run {summary['wall_seconds']:.0f} s  process wall {wall:.0f} s  "
        f"peak RSS {peak_rss_mib():.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
