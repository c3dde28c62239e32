"""Benchmark 2: gradient synchronisation against one bare MPI allreduce, and overlap.

HybridSN (5.1 M parameters, 19.5 MiB of float32 gradients), 2 ranks, one thread each. In
one launch, round after round (medians over rounds, each timed after a barrier):

* raw: one `Allreduce` of the same bytes (a numpy buffer through the communicator);
* before: the sync as it was before issue 10 (concatenate, scale, reduce, copy back);
* sync: `sync_gradients` (zero-copy buckets, one in-place scale each), the trainer's
  path (`GradientSync.sync` with the weight folded into the loss), and the scale alone;
* steps of forward + backward + sync with overlap off, and on with and without progress
  calls from the gradient hooks. A second launch repeats the steps with MPICH's progress
  thread (`MPIR_CVAR_ASYNC_PROGRESS=1`).

Cut = 1 - (time left to wait after backward with overlap) / (the same without). That wait
holds the sync and any wait for the other rank's backward: both are what overlap can hide.

    .venv/bin/python scripts/bench_sync.py [--quick]
    LBTRAIN_BENCH_DEVICES=cuda:0,cuda:0 .venv/bin/python scripts/bench_sync.py   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import Figure, standalone  # noqa: E402

__all__ = ["run", "main"]

VENV_BIN = Path(sys.executable).parent
RANKS = 2
# name: (overlap, progress calls from the hooks, bucket MiB). HybridSN's first dense layer
# holds 18 of the 19.5 MiB: at 25 MiB everything is one bucket, ready only when backward ends.
STEP_VARIANTS = {
    "off": (False, True, 25.0),
    "on 25": (True, True, 25.0),
    "on": (True, True, 4.0),
    "on no test": (True, False, 4.0),
}


def _worker(rounds: int, batch: int, steps_only: bool) -> None:
    """One rank's side: every rank runs the same sequence of collectives."""
    import numpy as np
    import torch
    from torch import nn

    from hyperspectral.models import build_model
    from lbtrain import sync_gradients, world_communicator
    from lbtrain.parallel.gradients import GradientSync

    torch.set_num_threads(1)
    torch.manual_seed(0)
    comm = world_communicator()
    # Each rank's device (LBTRAIN_BENCH_DEVICES=cuda:0,cuda:0 on a GPU machine); CPU default.
    devices = os.environ.get("LBTRAIN_BENCH_DEVICES", "").split(",")
    device = torch.device(devices[comm.rank] if comm.rank < len(devices) and devices[0] else "cpu")
    model = build_model("hybridsn", bands=30, num_classes=16, dropout=0.0).to(device)
    inputs = torch.randn(batch, 30, 25, 25, device=device)
    targets = torch.randint(0, 16, (batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()
    weight = 1.0 / comm.size
    syncs = {
        name: GradientSync(model, comm, overlap=overlap, progress=progress, bucket_mb=mib)
        for name, (overlap, progress, mib) in STEP_VARIANTS.items()
    }
    nbytes = syncs["off"].nbytes
    raw = np.zeros(nbytes // 4, dtype=np.float32)
    times: dict[str, list[float]] = {}

    def timed(name: str, action: Any) -> None:
        comm.barrier()
        begin = time.perf_counter()
        action()
        times.setdefault(name, []).append(time.perf_counter() - begin)

    def step(name: str) -> None:
        sync = syncs[name]  # each owns the gradients while it steps
        sync.begin(weight, prescaled=True)  # as the trainer drives it
        (loss_fn(model(inputs), targets) * weight).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # backward's kernels are done: what is left is sync
        computed = time.perf_counter()
        if sync.overlap:
            sync.launch()
        sync.wait()
        # The sync left to wait for once backward is done: what overlap did not hide.
        times.setdefault(f"exposed {name}", []).append(time.perf_counter() - computed)

    def before() -> None:  # the pre-issue-10 sync, for the before/after figure
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat.mul_(weight)
        comm.allreduce_sum_(flat)
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def scale() -> None:
        for bucket in syncs["off"].buckets:
            bucket.flat.mul_(weight)

    for _ in range(rounds + 1):  # the first round warms up and is dropped
        for name in STEP_VARIANTS:
            timed(f"step {name}", lambda name=name: step(name))
        if not steps_only:
            syncs["off"].zero_grad()
            timed("raw", lambda: comm.allreduce_sum_(raw))
            timed("before", before)
            sync_gradients(model, weight, comm)  # points .grad at its buckets, as in use
            timed("sync", lambda: sync_gradients(model, weight, comm))
            syncs["off"].zero_grad()
            timed("prescaled", lambda: syncs["off"].sync(weight, prescaled=True))
            timed("scale", scale)
    medians = {name: statistics.median(values[1:]) for name, values in times.items()}
    worst = comm.allgather(medians)  # the job's figure: the slowest rank's median
    if comm.rank == 0:
        result = {name: max(m[name] for m in worst) for name in medians}
        print("RESULT " + json.dumps({"nbytes": nbytes, "medians": result}), flush=True)


def _launch(rounds: int, batch: int, *, steps_only: bool, env: dict[str, str]) -> dict:
    command = [
        str(VENV_BIN / "mpiexec"), "-n", str(RANKS), sys.executable, __file__, "--worker",
        "--rounds", str(rounds), "--batch", str(batch), *(["--steps-only"] * steps_only),
    ]  # fmt: skip
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    done = subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bench_sync worker failed:\n{done.stdout}\n{done.stderr}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def run(quick: bool, workdir: Path) -> list[Figure]:
    """Two launches of 2 ranks; figures with the issue's targets."""
    rounds, batch = (10, 4) if quick else (40, 4)
    main_run = _launch(rounds, batch, steps_only=False, env={})
    thread = _launch(rounds, batch, steps_only=True, env={"MPIR_CVAR_ASYNC_PROGRESS": "1"})
    m, t = main_run["medians"], thread["medians"]
    mib = main_run["nbytes"] / 2**20
    bench = "2 sync"
    figures = [
        Figure(bench, f"raw Allreduce of {mib:.1f} MiB", 1e3 * m["raw"], "ms"),
        Figure(bench, "sync before issue 10 / raw", m["before"] / m["raw"], "x"),
        Figure(bench, "sync_gradients / raw", m["sync"] / m["raw"], "x", "<= 1.10",
               m["sync"] / m["raw"] <= 1.10, "scales each bucket in place"),
        Figure(bench, "trainer's sync (weight in the loss) / raw", m["prescaled"] / m["raw"],
               "x", "<= 1.10", m["prescaled"] / m["raw"] <= 1.10),
        Figure(bench, "in-place scale of the buckets", 1e3 * m["scale"], "ms",
               note="folding the weight into the loss instead costs one scalar multiply"),
    ]  # fmt: skip
    off = m["step off"]
    for label, steps, name in (
        ("25 MiB buckets, test calls from hooks", m, "on 25"),
        ("4 MiB buckets, test calls from hooks", m, "on"),
        ("4 MiB buckets, no progress calls", m, "on no test"),
        ("4 MiB buckets, MPICH progress thread", t, "on"),
    ):
        hidden = 1 - steps[f"exposed {name}"] / steps["exposed off"]
        figures.append(
            Figure(bench, f"overlap, {label}: wait after backward cut", 100 * hidden, "%",
                   note=f"{1e3 * steps[f'exposed {name}']:.1f} ms left after backward (vs "
                   f"{1e3 * steps['exposed off']:.1f}); step {1e3 * steps[f'step {name}']:.0f} "
                   f"ms (vs {1e3 * steps['step off']:.0f})")
        )  # fmt: skip
    figures.append(Figure(bench, f"step without overlap (batch {batch}/rank)", 1e3 * off, "ms"))
    return figures


def main() -> None:
    """Standalone use, and the ranks' entry point (--worker)."""
    if "--worker" not in sys.argv:
        sys.exit(standalone("scripts/bench_sync.py", run))
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--steps-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    _worker(args.rounds, args.batch, args.steps_only)


if __name__ == "__main__":
    main()
