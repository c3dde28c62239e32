"""Draw lbtrain.viz's pictures from a synthetic run, to look at them without training.

Three ranks emulate devices 1x, 2x and 4x slow (a rank's step takes speed * (2 ms + 1 ms
per sample)); global batch 64. The run starts under ``equal`` (22, 21, 21: the fast ranks
wait for the slowest), re-plans after epoch 3 to ``cost`` (40, 16, 8), evaluates every 5
epochs. Writes into --out: metrics.jsonl, curves.png, trace.json (the ``cost`` run),
trace_equal.json, timeline.png (``equal`` above ``cost``) and timeline_cost.png.

    .venv/bin/python scripts/viz_demo.py --out /tmp/viz-demo [--resume]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

from lbtrain.viz import (
    MetricsStream,
    StepTrace,
    check_trace,
    compare_timelines,
    plot_curves,
    read_metrics,
    render_timeline,
    write_trace,
)
from lbtrain.viz.trace import load_trace

SPEEDS = (1, 2, 4)
DEVICES = ["cpu x1", "cpu x2", "cpu x4"]
EQUAL, COST = [22, 21, 21], [40, 16, 8]
SYNC, OPTIMIZER = 3e-3, 1e-3  # seconds: allreduce of the gradients, optimizer step
STEPS_PER_EPOCH, EPOCHS, REPLAN_AFTER = 35, 30, 3


def compute_seconds(rank: int, batch: int) -> float:
    """The emulated forward+backward time of `batch` samples on `rank`."""
    return SPEEDS[rank] * (2e-3 + 1e-3 * batch)


def simulate(batches: list[int], epochs: int, steps: int, seed: int) -> list[StepTrace]:
    """Per-rank traces of a synchronous run: the allreduce starts when the last rank is ready."""
    rng = random.Random(seed)
    traces = [StepTrace(max_steps=400) for _ in batches]
    clock = [0.0] * len(batches)
    for epoch in range(1, epochs + 1):
        for step in range(steps):
            warm = 3.0 if (epoch, step) == (1, 0) else 1.0  # the first step allocates
            ready = [
                clock[r] + warm * compute_seconds(r, b) * rng.uniform(0.97, 1.03)
                for r, b in enumerate(batches)
            ]
            sync_start = max(ready)
            for rank, trace in enumerate(traces):
                end = sync_start + SYNC + OPTIMIZER * SPEEDS[rank]
                trace.add(
                    epoch,
                    step,
                    [
                        ("compute", clock[rank], ready[rank]),
                        ("wait", ready[rank], sync_start),
                        ("sync", sync_start, sync_start + SYNC),
                        ("optimizer", sync_start + SYNC, end),
                    ],
                )
                clock[rank] = end
    return traces


def step_figures(batches: list[int]) -> tuple[float, float, list[dict]]:
    """Step seconds, idle fraction and per-rank times of one mean step under `batches`."""
    compute = [compute_seconds(r, b) for r, b in enumerate(batches)]
    slowest = max(compute)
    step = slowest + SYNC + OPTIMIZER * max(SPEEDS)
    ranks = [
        {"rank": r, "compute": c, "wait": slowest - c, "comm": SYNC, "seconds": step}
        for r, c in enumerate(compute)
    ]
    idle = sum(slowest - c for c in compute) / (step * len(batches))
    return step, idle, ranks


def metrics_records(resume: bool) -> list[dict]:
    """A 30-epoch run's records: a re-plan after epoch 3, evals every 5 epochs."""
    rng = random.Random(1)
    start = {
        "type": "start",
        "time": 1.7e9,
        "world_size": 3,
        "policy": "cost",
        "global_batch": 64,
        "epochs": EPOCHS,
        "batch_sizes": EQUAL,
        "devices": DEVICES,
        "resumed_at": None,
    }
    records: list[dict] = [start]
    batches, time = EQUAL, start["time"]
    for epoch in range(1, EPOCHS + 1):
        step, idle, ranks = step_figures(batches)
        measured = step * rng.uniform(1.0, 1.06)
        seconds = measured * STEPS_PER_EPOCH
        time += seconds
        for entry, b in zip(ranks, batches, strict=True):
            entry.update(
                samples=b * STEPS_PER_EPOCH,
                seconds=seconds,
                compute=entry["compute"] * STEPS_PER_EPOCH,
                wait=entry["wait"] * STEPS_PER_EPOCH,
                comm=entry["comm"] * STEPS_PER_EPOCH,
            )
        replan = None
        if epoch == REPLAN_AFTER:
            new, _, _ = step_figures(COST)
            replan = {
                "old_batch_sizes": EQUAL,
                "new_batch_sizes": COST,
                "old_step_seconds": step,
                "new_step_seconds": new,
                "reason": "measured step times disagree with the profile by 48%",
            }
        records.append(
            {
                "type": "epoch",
                "epoch": epoch,
                "time": time,
                "steps": STEPS_PER_EPOCH,
                "samples": 64 * STEPS_PER_EPOCH,
                "loss": 2.6 * math.exp(-epoch / 6) + 0.08,
                "accuracy": min(0.99, 0.3 + 0.68 * (1 - math.exp(-epoch / 5))),
                "lr": 1e-3 * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / EPOCHS)),
                "seconds": seconds,
                "step_seconds": measured,
                "predicted_step_seconds": step,
                "idle_fraction": idle * measured / step + 0.01,
                "batch_sizes": batches,
                "ranks": ranks,
                "replan": replan,
            }
        )
        if epoch % 5 == 0:
            oa = min(0.97, 0.5 + 0.45 * (1 - math.exp(-epoch / 7)))
            metrics = {"oa": oa, "aa": oa - 0.04, "kappa": oa - 0.06}
            records.append({"type": "eval", "epoch": epoch, "time": time, "metrics": metrics})
        if replan:
            batches = COST
        if resume and epoch == 20:
            # The run was stopped during epoch 22 and resumed from the epoch-20 checkpoint.
            records.append(
                {
                    **start,
                    "time": time + 60,
                    "batch_sizes": COST,
                    "resumed_at": {"epoch": 20, "step": 0},
                }
            )
    records.append({"type": "end", "time": time, "wall_seconds": time - start["time"]})
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the files")
    parser.add_argument("--resume", action="store_true", help="include a resumed attempt")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    with MetricsStream(args.out / "metrics.jsonl") as stream:
        for record in metrics_records(args.resume):
            stream.write(record)
    records = read_metrics(args.out / "metrics.jsonl")
    written = [args.out / "metrics.jsonl", plot_curves(records, args.out / "curves.png")]

    paths = {}
    for name, batches, file in (("equal", EQUAL, "trace_equal.json"), ("cost", COST, "trace.json")):
        traces = simulate(batches, epochs=2, steps=20, seed=len(file))
        labels = [f"{d}, batch {b}" for d, b in zip(DEVICES, batches, strict=True)]
        paths[name] = write_trace(args.out / file, [t.spans() for t in traces], labels)
        check_trace(load_trace(paths[name]))
        written.append(paths[name])
    written.append(
        compare_timelines(
            [paths["equal"], paths["cost"]],
            ["equal (22, 21, 21)", "cost (40, 16, 8)"],
            args.out / "timeline.png",
            epoch=2,
            steps=(5, 14),
            title="3 ranks emulating devices 1x, 2x and 4x slow, global batch 64",
        )
    )
    written.append(
        render_timeline(paths["cost"], args.out / "timeline_cost.png", "cost, epoch 1 and 2")
    )
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
