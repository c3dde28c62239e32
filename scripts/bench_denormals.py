"""A trained model's CPU step against a fresh one's, with subnormal floats flushed and not.

Issue 38: as a model converges its gradients and Adam's state fill with subnormal floats, and
a CPU step slows down. From a trained run's last checkpoint (`--run`, e.g. HybridSN on
Indian Pines, 60 epochs, `--train-ratio 0.1`, trained with `--flush-denormals off` so that
its state holds them), each round times one epoch resumed from it and one fresh epoch of the
same recipe, `--flush-denormals off` then `on`, alternated so that the machine's drift falls
on all four; one process, `--threads 1` and `2`:

    cd scripts && ../.venv/bin/python bench_denormals.py --run /tmp/hsn60 [--rounds 2] \
        [--threads 1,2] [--recipe "--dataset indian_pines --model hybridsn --train-ratio 0.1"]

The figure is each epoch's measured step (`step_seconds` in metrics.jsonl), the median over
the rounds, and trained / fresh. A benchmark, not a test: it asserts nothing (the target of
issue 38 is trained / fresh <= 1.10 with flushing on). Keep the machine otherwise idle.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench_common import VENV_BIN, BenchError, epochs_of, run_command

# CPU steps are the subject: a run trained on a GPU (a quick way to a converged state) is
# resumed on the CPU, and the fresh runs are put there too.
QUIET = ["--quiet", "--no-map", "--no-curves", "--replan", "off", "--devices", "cpu"]


def _trained(run: Path, threads: int, flush: str, workdir: Path) -> float:
    """One epoch resumed from a copy of `run`'s last checkpoint."""
    copy = Path(tempfile.mkdtemp(prefix="trained-", dir=workdir)) / "run"
    shutil.copytree(run, copy)
    epochs = len(epochs_of(copy)) + 1
    run_command([str(VENV_BIN / "lbtrain"), "train", "--resume", str(copy), "--epochs",
                 str(epochs), "--threads", str(threads), "--flush-denormals", flush,
                 *QUIET])  # fmt: skip
    return epochs_of(copy)[-1]["step_seconds"]


def _fresh(recipe: list[str], plan: Path, threads: int, flush: str, workdir: Path) -> float:
    """One epoch of the same recipe and plan from a fresh model."""
    out = Path(tempfile.mkdtemp(prefix="fresh-", dir=workdir)) / "run"
    run_command([str(VENV_BIN / "lbtrain"), "train", *recipe, "--plan", str(plan), "--epochs",
                 "1", "--threads", str(threads), "--flush-denormals", flush, "--out", str(out),
                 *QUIET])  # fmt: skip
    return epochs_of(out)[-1]["step_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the trained run's folder")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument(
        "--recipe", default="--dataset indian_pines --model hybridsn --train-ratio 0.1"
    )
    args = parser.parse_args()
    if not (args.run / "plan.json").is_file():
        sys.exit(f"bench_denormals: --run {args.run}: no plan.json there; name a run folder")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lbtrain-bench-denormals-") as tmp:
        for threads in (int(t) for t in args.threads.split(",")):
            steps: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for flush in ("off", "on"):
                    for state in ("trained", "fresh"):
                        if state == "trained":
                            step = _trained(args.run, threads, flush, Path(tmp))
                        else:
                            recipe = shlex.split(args.recipe)
                            step = _fresh(recipe, args.run / "plan.json", threads, flush, Path(tmp))
                        steps.setdefault((flush, state), []).append(step)
                        print(f"threads {threads} flush {flush} {state}: step {step * 1e3:.0f} ms",
                              flush=True)  # fmt: skip
            for flush in ("off", "on"):
                trained = statistics.median(steps[flush, "trained"])
                fresh = statistics.median(steps[flush, "fresh"])
                rows.append((threads, flush, trained / fresh))
                runs = {k: [round(s * 1e3) for s in v] for k, v in steps.items() if k[0] == flush}
                print(f"threads {threads}, flush {flush}: trained {trained * 1e3:.0f} ms, fresh "
                      f"{fresh * 1e3:.0f} ms, ratio {trained / fresh:.2f} (runs, ms: "
                      f"{runs})", flush=True)  # fmt: skip
    if not rows:
        raise BenchError("nothing was timed")


if __name__ == "__main__":
    main()
