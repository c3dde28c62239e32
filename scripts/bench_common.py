"""What the `scripts/bench_*.py` benchmarks share: figures, lbtrain runs, tables, BENCHMARKS.md.

Every benchmark module defines `run(quick, workdir) -> list[Figure]` and a `main()` that
calls `standalone`, so it runs alone or under `scripts/bench.py`. Runs of `lbtrain` go
under `mpiexec` with one torch thread per rank, into `workdir` (a temporary folder), and
identical runs are made once per process (`train` caches them by their options), so
benchmarks that need the same run share it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lbtrain.malloc import tune_malloc

# The benchmarks are entry points like `lbtrain` itself: tune malloc before anything imports
# torch, or in-process training steps pay the page faults lbtrain/malloc.py describes.
tune_malloc()

VENV_BIN = Path(sys.executable).parent
BENCHMARKS_MD = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
RUN_TIMEOUT = 900.0  # seconds; a hung mpiexec must not hang the whole harness
COMMANDS: list[str] = []  # every lbtrain command run in this process, in order

# `make demo` (Makefile): real Indian Pines, 3 ranks emulating 1x, 2x and 4x devices. CPU
# ranks also on a machine with a GPU, where `auto` would put rank 0 on it (a GPU machine's
# bench.py run once measured a GPU rank beside emulated CPU ones that way).
DEMO_MODEL = ["--dataset", "indian_pines", "--model", "hamida", "--patch-size", "11", "--pca", "30"]
DEMO_BATCH = 64
DEMO = [*DEMO_MODEL, "--global-batch", str(DEMO_BATCH), "--emulate-slowdown", "1,2,4",
        "--policy", "cost", "--devices", "cpu"]  # fmt: skip
DEMO_EPOCHS = 30


@dataclass
class Figure:
    """One measured figure; `met` is None when it has no target."""

    benchmark: str
    name: str
    value: float
    unit: str
    target: str | None = None
    met: bool | None = None
    note: str = ""


class BenchError(RuntimeError):
    """A benchmark's run failed; the message says which command and how."""


@dataclass(frozen=True)
class Run:
    """A finished `lbtrain train` run: its folder, summary.json and command.

    summary.json holds totals; the per-epoch records are in the folder (`epochs_of(out)`).
    """

    out: Path
    summary: dict[str, Any]
    command: str


def run_command(command: Sequence[str], timeout: float = RUN_TIMEOUT) -> str:
    """Run `command` (OMP_NUM_THREADS=1), log it, return its stdout; BenchError on failure."""
    shown = shlex.join(command).replace(str(VENV_BIN) + "/", ".venv/bin/")
    COMMANDS.append(shown)
    print("$", shown, flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    # A session of its own, so a timeout ends mpiexec and every rank it started.
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    ) as process:  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise BenchError(f"timed out after {timeout:.0f} s: {shown}") from None
    if process.returncode != 0:
        lines = output.strip().splitlines()
        print("\n".join(lines[-15:]), flush=True)
        # The error first: a failed figure's note keeps only the start of the message.
        raise BenchError(f"exit {process.returncode}: {' '.join(lines[-3:])} (command: {shown})")
    print(f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    return output


def lbtrain(verb: str, ranks: int, options: Sequence[str]) -> list[str]:
    """`mpiexec -n ranks lbtrain verb --threads 1 options`."""
    return [
        str(VENV_BIN / "mpiexec"), "-n", str(ranks), str(VENV_BIN / "lbtrain"), verb,
        "--threads", "1", *options,
    ]  # fmt: skip


_RUNS: dict[tuple[int, tuple[str, ...]], Run] = {}


def train(ranks: int, options: Sequence[str], workdir: Path) -> Run:
    """`lbtrain train` on `ranks` ranks into a new folder of `workdir`; made once per options."""
    key = (ranks, tuple(options))
    if key not in _RUNS:
        out = Path(tempfile.mkdtemp(prefix="train-", dir=workdir)) / "run"
        run_command([*lbtrain("train", ranks, options), "--out", str(out)])
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        _RUNS[key] = Run(out, summary, COMMANDS[-1])
    return _RUNS[key]


def profile(ranks: int, options: Sequence[str], output: Path) -> dict[str, Any]:
    """`lbtrain profile` on `ranks` ranks; the profiles JSON it wrote to `output`."""
    run_command([*lbtrain("profile", ranks, options), "--output", str(output)])
    return json.loads(output.read_text(encoding="utf-8"))


def balance_report(profiles: Path, global_batch: int) -> dict[str, Any]:
    """What `lbtrain balance-report --profiles F --global-batch B --format json` prints.

    Built in this process by the same calls the verb makes (every policy, zero shares
    allowed, the profiles' measured sync), which saves a launch of about 3 s.
    """
    from lbtrain.profiling import comm_cost, load_profiles
    from lbtrain.report import build_report

    loaded = load_profiles(profiles)
    return build_report(loaded, global_batch, "all", comm=comm_cost(loaded)).to_dict()


def demo_options(quick: bool) -> list[str]:
    """The `make demo` run; quick: 2 epochs, no map, plan kept (its profiles serve balance)."""
    if quick:
        return [*DEMO, "--epochs", "2", "--no-map", "--replan", "off"]
    return [*DEMO, "--epochs", str(DEMO_EPOCHS)]


def demo_run(quick: bool, workdir: Path) -> Run:
    """The demo-config run (see `demo_options`), made once per process."""
    return train(3, demo_options(quick), workdir)


_SPLITS: dict[tuple[Path, int | None], Path] = {}
TEST_PIXELS = 600


def eval_subset_split(workdir: Path) -> Path:
    """The demo's split (random, 10%, seed 0) with every k-th test pixel of each class only.

    The training pixels, and so every epoch, are the demo's; the final evaluation of all
    9,224 test pixels would cost each run about three epochs and measures nothing here.
    """
    return bench_split(workdir, None)


def bench_split(workdir: Path, train_pixels: int | None = 512) -> Path:
    """`eval_subset_split` with `train_pixels` training pixels (512: 8 whole steps of 64).

    Every class keeps pixels in both sets, as the workload requires.
    """
    key = (workdir, train_pixels)
    if key not in _SPLITS:
        import numpy as np

        from hyperspectral.datasets import get_scene
        from hyperspectral.splits import Split, make_split, save_split

        gt = get_scene("IndianPines", None, download=False).gt
        split = make_split("random", gt, train_ratio=0.1, seed=0)

        def every(pixels: np.ndarray, step: int) -> list[np.ndarray]:
            labels = gt.ravel()[pixels]
            return [pixels[labels == c][::step] for c in np.unique(labels)]

        train = [split.train]
        if train_pixels is not None:
            step = max(1, split.train.size // train_pixels)
            train = sorted(every(split.train, step), key=len)  # the largest class last
            while sum(map(len, train)) > train_pixels:
                train[-1] = train[-1][:-1]
                train.sort(key=len)
        test = every(split.test, max(1, split.test.size // TEST_PIXELS))
        cut = Split(np.sort(np.concatenate(train)), np.sort(np.concatenate(test)), split.shape,
                    {**split.meta, "cut_by": "scripts/bench_common.py"})  # fmt: skip
        name = f"split-train{train_pixels or split.train.size}-test{TEST_PIXELS}.npz"
        _SPLITS[key] = save_split(cut, workdir / name)
    return _SPLITS[key]


def write_plan(path: Path, policy: str, ranks: int, profiles: Path | None = None) -> Path:
    """A plan.json for `--plan`: `policy` for the demo's batch, as `lbtrain train` plans it
    from `profiles`; without profiles, equal speeds (for `equal`, which ignores them)."""
    from lbtrain.balancer import plan_batches
    from lbtrain.profiling import comm_cost, load_profiles

    speeds: list[Any] = [1.0] * ranks if profiles is None else load_profiles(profiles, ranks)
    plan = plan_batches(
        speeds, DEMO_BATCH, policy, comm=None if profiles is None else comm_cost(speeds)
    )
    path.write_text(plan.to_json() + "\n", encoding="utf-8")
    return path


def epochs_of(out: Path) -> list[dict[str, Any]]:
    """The epoch records of the run in folder `out`, in epoch order, from its metrics.jsonl.

    summary.json keeps totals only; each epoch's record (`seconds`, `step_seconds`, `steps`,
    `batch_sizes`, `ranks`, ... as lbtrain/viz/records.py lists them) streams to the run's
    metrics.jsonl. An epoch written twice (a resumed run) counts once, the later record.
    """
    from lbtrain.viz.records import epoch_records, read_metrics

    path = Path(out) / "metrics.jsonl"
    epochs = epoch_records(read_metrics(path))
    if not epochs:
        raise BenchError(f"{path}: no epoch records")
    return epochs


def measured_epochs(epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The epochs to measure: from epoch 2 on (epoch 1 pays one-off costs), or all if one."""
    return epochs[1:] or epochs


def median_of(epochs: list[dict[str, Any]], key: str) -> float:
    """Median of an epoch field (`seconds`, `step_seconds`, ...) over the measured epochs of
    `epochs` (records from `epochs_of`)."""
    return statistics.median(epoch[key] for epoch in measured_epochs(epochs))


def rank_idle(epochs: list[dict[str, Any]]) -> list[float]:
    """Each rank's median share of its epoch time spent waiting, over measured epochs."""
    measured = measured_epochs(epochs)
    shares = [[r["wait"] / max(r["seconds"], 1e-12) for r in e["ranks"]] for e in measured]
    return [statistics.median(rank) for rank in zip(*shares, strict=True)]


def _value(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3f}"


def _met(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "NO")


def _rows(figures: Sequence[Figure]) -> list[list[str]]:
    return [
        [f.benchmark, f.name, _value(f.value), f.unit, f.target or "-", _met(f.met), f.note]
        for f in figures
    ]


HEADER = ["benchmark", "figure", "value", "unit", "target", "met", "note"]


def format_table(figures: Sequence[Figure], notes: bool = True) -> str:
    """Figures as an aligned plain-text table (without the notes column if `notes` is off)."""
    columns = len(HEADER) if notes else len(HEADER) - 1
    rows = [row[:columns] for row in [HEADER, *_rows(figures)]]
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    right = {2}  # numbers align right
    lines = [
        "  ".join(c.rjust(w) if i in right else c.ljust(w)
                  for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
        for row in rows
    ]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(figures: Sequence[Figure]) -> str:
    """Figures as a markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|---|---|---:|---|---|---|---|"]
    for row in _rows(figures):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    return "\n".join(lines)


def append_to_benchmarks(
    title: str, command: str, figures: Sequence[Figure], notes: Sequence[str] = ()
) -> None:
    """Write a dated section "## Latest `title` run" into BENCHMARKS.md.

    `title` is a script's path ("scripts/bench.py"), or any text ("## Latest run: title").

    The previous section of that title is replaced in place (the file does not grow with
    every run); without one, the section goes at the end. Nothing else in the file changes.
    """
    heading = f"## Latest `{title}` run" if title.endswith(".py") else f"## Latest run: {title}"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        heading, "",
        f"{stamp}, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.2f} at the end), "
        "one torch thread per rank. Command:", "",
        "```bash", command, "```", "", markdown_table(figures), "",
        *(f"- {note}" for note in notes), "",
    ]  # fmt: skip
    lines = BENCHMARKS_MD.read_text(encoding="utf-8").splitlines()
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), None)
        tail = lines[end:] if end is not None else []
        lines = lines[:start] + body + tail
    else:
        lines = [*lines, "", *body] if lines and lines[-1] else [*lines, *body]
    BENCHMARKS_MD.write_text("\n".join(lines).rstrip("\n") + "\n", encoding="utf-8")


def failed(benchmark: str, error: BaseException) -> Figure:
    """A benchmark that raised, as a missed figure (its message shortened to one line)."""
    message = " ".join(str(error).split())[:300]
    return Figure(
        benchmark, "failed", math.nan, "", "runs", False, f"{type(error).__name__}: {message}"
    )


def standalone(
    title: str,
    run: Callable[[bool, Path], list[Figure]],
    argv: Sequence[str] | None = None,
    *,
    name: str | None = None,
) -> int:
    """The `main()` of one benchmark script: run it, print its table, write its section.

    Returns the exit status: 1 when a target is missed, else 0.
    """
    parser = argparse.ArgumentParser(description=f"{title}: one benchmark of issue 10")
    parser.add_argument("--quick", action="store_true", help="the short version (bench.py --quick)")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    name = name or Path(title).stem.removeprefix("bench_")
    with tempfile.TemporaryDirectory(prefix="lbtrain-bench-") as tmp:
        try:
            figures = run(args.quick, Path(tmp))
        except Exception as exc:  # a figure that says so, never a lost table
            figures = [failed(name, exc)]
    seconds = time.perf_counter() - started
    figures.append(Figure(name, "wall time", seconds, "s"))
    print(format_table(figures))
    command = shlex.join([".venv/bin/python", title, *(argv if argv is not None else sys.argv[1:])])
    if not args.no_write:
        append_to_benchmarks(title, command, figures, [f"runs: `{c}`" for c in COMMANDS])
    return 1 if any(f.met is False for f in figures) else 0
