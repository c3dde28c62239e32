"""The leakage gap (issue 23): a random pixel split against a spatially disjoint one.

Trains each model on Indian Pines at the same training ratio under `--split random` and
`--split disjoint`, for several seeds, one `lbtrain train` process per run, and prints a
Markdown table of OA, AA and kappa per run and the mean and spread per model and split.
The gap (random minus disjoint) is what a random split's overlapping patches add.

    .venv/bin/python scripts/bench_leakage.py --models hamida --seeds 0,1,2 \\
        --workdir /tmp/leakage [--epochs N] [--threads 2]

Each run's folder (`WORKDIR/MODEL-SPLIT-sSEED`) keeps its split.json, metrics and map.png; a
folder that already holds a finished run is read, not trained again, so an interrupted
sweep continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

__all__ = ["main", "recipe"]

VENV_BIN = Path(sys.executable).parent
SPLITS = ("random", "disjoint")

# Per model: its options and epochs (the demo's recipe for hamida; the others' defaults,
# with the epochs of BENCHMARKS.md's hybridsn runs and of the SSFTT paper).
RECIPES = {
    "hamida": (["--patch-size", "11", "--pca", "30"], 30),
    "hybridsn": ([], 60),
    "ssftt": ([], 100),
    "hu": ([], 30),
}


def recipe(model: str, split: str, seed: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The `lbtrain train` command of one run."""
    options, epochs = RECIPES.get(model, ([], 30))
    return [
        str(VENV_BIN / "lbtrain"), "train", "--dataset", "indian_pines", "--model", model,
        *options, "--split", split, "--train-ratio", str(args.train_ratio),
        "--seed", str(seed), "--epochs", str(args.epochs or epochs), "--global-batch", "64",
        "--threads", str(args.threads), "--quiet", "--out", str(out),
    ]  # fmt: skip


def _same_recipe(command: list[str], out: Path) -> None:
    """A finished run is reused only if it ran these epochs and this training ratio."""
    config = tomllib.loads((out / "config.toml").read_text())
    wanted = {"epochs": int(command[command.index("--epochs") + 1]),
              "train_ratio": float(command[command.index("--train-ratio") + 1])}  # fmt: skip
    found = {"epochs": config.get("epochs"),
             "train_ratio": config.get("workload_options", {}).get("train_ratio", 0.1)}  # fmt: skip
    if found != wanted:
        sys.exit(f"bench_leakage: {out} holds a run with {found}, not {wanted}: use another "
                 "--workdir")  # fmt: skip


def _run(command: list[str], out: Path) -> dict:
    if (out / "metrics.json").is_file():
        _same_recipe(command, out)
    else:
        print("$", " ".join(command).replace(str(VENV_BIN) + "/", ".venv/bin/"), flush=True)
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"bench_leakage: exit {done.returncode}: {done.stderr.strip()[-500:]}")
        print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    metrics = json.loads((out / "metrics.json").read_text())
    counts = json.loads((out / "split.json").read_text())
    return {
        "oa": 100 * metrics["oa"],
        "aa": 100 * metrics["aa"],
        "kappa": metrics["kappa"],
        "test": counts["test"],
        "untested": counts.get("train_only", []),
    }


def _mean(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows]
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    digits = 4 if key == "kappa" else 2
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    """Run the sweep (skipping finished runs) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="hamida", help="comma-separated (default hamida)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    parser.add_argument("--epochs", type=int, help="default per model: hamida 30, ssftt 100")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-ratio", type=float, default=0.1)
    parser.add_argument("--workdir", type=Path, required=True, help="one folder per run in it")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[tuple[str, str], list[dict]] = {}
    for model in args.models.split(","):
        for split in SPLITS:
            for seed in seeds:
                out = args.workdir / f"{model}-{split}-s{seed}"
                row = _run(recipe(model, split, seed, args, out), out)
                results.setdefault((model, split), []).append({**row, "seed": seed})
    print("\n| model | split | seed | test pixels | OA % | AA % | kappa |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (model, split), rows in results.items():
        for r in rows:
            n = len(r["untested"])
            untested = f" ({n} class{'es' if n > 1 else ''} untested)" if n else ""
            print(f"| {model} | {split} | {r['seed']} | {r['test']:,}{untested} | "
                  f"{r['oa']:.2f} | {r['aa']:.2f} | {r['kappa']:.4f} |")  # fmt: skip
        print(f"| {model} | {split} | mean ± sd | | {_mean(rows, 'oa')} | {_mean(rows, 'aa')} "
              f"| {_mean(rows, 'kappa')} |")  # fmt: skip
    for model in args.models.split(","):
        random, disjoint = results[(model, "random")], results[(model, "disjoint")]
        gap = statistics.mean(r["oa"] for r in random) - statistics.mean(r["oa"] for r in disjoint)
        print(f"\n{model}: leakage gap (random - disjoint mean OA) {gap:.2f} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
