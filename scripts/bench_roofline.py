"""The roofline against this machine's CPU (issue 22): predicted from FLOP and bytes, then
calibrated on one model's profile and checked on the others.

For each model (hu, hamida, ssftt, hybridsn on Indian Pines with their defaults, hamida at
the demo's patch 11 and PCA 30), `lbtrain.whatif.work.count_work` counts the FLOP and bytes
of one sample's training step, and `lbtrain profile` on one rank and one thread measures
beta (seconds per sample). The roofline's beta on one `cpu-core` (the built-in entry: 80
GFLOP/s, 10 GB/s) is

- *uncalibrated*: max(FLOP / 80e9, bytes / 10e9) / 0.5 (what-if's assumed efficiency);
- *calibrated on hamida*: the same bound over the efficiency hamida's profile shows
  (bound / measured beta), as what-if calibrates a kind from any profile of it.

    .venv/bin/python scripts/bench_roofline.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import bench_common as bc

__all__ = ["main"]

MODELS = {
    "hu": [],
    "hamida": ["--patch-size", "11", "--pca", "30"],
    "ssftt": [],
    "hybridsn": [],
}
CALIBRATION = "hamida"


def _work(model: str, options: list[str]):
    from lbtrain.whatif.work import count_work
    from lbtrain.workloads import get_plugin

    plugin = get_plugin("hyperspectral")
    given = {"dataset": "indian_pines", "model": model, "map": False}
    for flag, value in zip(options[::2], options[1::2], strict=True):
        given[flag[2:].replace("-", "_")] = value
    return count_work(plugin.make(0, plugin.resolve_options(given)))


def _beta(model: str, options: list[str], workdir: Path) -> float:
    path = workdir / f"profile-{model}.json"
    if not path.exists():
        ladder = ["--batch-sizes", "4,8,16,32", "--repeats", "5", "--time-budget", "30"]
        command = bc.lbtrain("profile", 1, ["--dataset", "indian_pines", "--model", model,
                                            *options, *ladder])  # fmt: skip
        bc.run_command([*command, "--output", str(path)])
    return json.loads(path.read_text())["profiles"][0]["beta"]


def main(argv: list[str] | None = None) -> int:
    """Count, profile and print the table."""
    from lbtrain.whatif.devices import BUILTIN_DEVICES
    from lbtrain.whatif.predict import UNCALIBRATED_EFFICIENCY, Roofline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="keep the profiles here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lbtrain-roofline-"))
    workdir.mkdir(parents=True, exist_ok=True)
    core = BUILTIN_DEVICES["cpu-core"]
    rows = {}
    for model, options in MODELS.items():
        work = _work(model, options)
        bound = Roofline(work.flops_per_sample, work.bytes_per_sample).beta(core)
        rows[model] = (work, bound, _beta(model, options, workdir))
    efficiency = rows[CALIBRATION][1] / rows[CALIBRATION][2]
    print(f"\ncpu-core: {core.flops / 1e9:g} GFLOP/s, {core.memory_bandwidth / 1e9:g} GB/s; "
          f"calibrated on {CALIBRATION}: efficiency {efficiency:.1%}")  # fmt: skip
    print("\n| model | MFLOP / sample | MB / sample | measured beta (ms) | uncalibrated (ms) "
          "| error | calibrated on hamida (ms) | error |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for model, (work, bound, measured) in rows.items():
        raw, calibrated = bound / UNCALIBRATED_EFFICIENCY, bound / efficiency
        print(f"| {model} | {work.flops_per_sample / 1e6:,.1f} | "
              f"{work.bytes_per_sample / 1e6:.2f} | {1e3 * measured:.3f} | {1e3 * raw:.3f} | "
              f"{(raw - measured) / measured:+.0%} | {1e3 * calibrated:.3f} | "
              f"{(calibrated - measured) / measured:+.0%} |")  # fmt: skip
    print("\ncommands:\n" + "\n".join(bc.COMMANDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
