"""Benchmark 3: lbtrain against PyTorch DDP (gloo), then the headline under heterogeneity.

Part 1, one launch of 2 ranks, one thread each: HybridSN with dropout 0, equal batches, SGD.
`torch.distributed` (gloo) is initialised from the MPI ranks; one model steps through DDP,
an identical one through lbtrain's `GradientSync` as the trainer drives it (weight in the
loss, overlap on), on the same data, steps alternating, each after a barrier. Equal weights
are DDP's average, so the losses and the parameters must agree to float tolerance.

Part 2, the headline: under `--emulate-slowdown 1,3` on real Indian Pines, `lbtrain train`
with DDP's algorithm (`--policy equal --weighting uniform`: equal batches, 1/P average, the
step part 1 times against DDP itself) against `--policy cost`: time to the same epoch count
and the final OA.

    .venv/bin/python scripts/bench_ddp.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_balance import policy_runs  # noqa: E402
from bench_common import VENV_BIN, Figure, epochs_of, standalone  # noqa: E402

__all__ = ["run", "main"]

RANKS = 2


def _worker(steps: int, batch: int) -> None:
    """One rank: DDP and lbtrain steps, alternating; rank 0 prints the medians as JSON."""
    import socket

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from hyperspectral.models import build_model
    from lbtrain import world_communicator
    from lbtrain.parallel.gradients import GradientSync

    torch.set_num_threads(1)
    comm = world_communicator()
    port = None
    if comm.rank == 0:
        with socket.socket() as probe:  # a free loopback port for gloo's rendezvous
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size
    )
    torch.manual_seed(0)
    base = build_model("hybridsn", bands=30, num_classes=16, dropout=0.0)
    ours, theirs = copy.deepcopy(base), DistributedDataParallel(copy.deepcopy(base))
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.01, momentum=0.9)
    sync = GradientSync(ours, comm, overlap=True)
    loss_fn = nn.CrossEntropyLoss()
    weight = 1.0 / comm.size  # equal batches: DDP's average
    generator = torch.Generator().manual_seed(100 + comm.rank)
    times: dict[str, list[float]] = {"lbtrain": [], "ddp": []}
    losses: dict[str, list[float]] = {"lbtrain": [], "ddp": []}

    def lbtrain_step(x: torch.Tensor, y: torch.Tensor) -> float:
        sync.begin(weight, prescaled=True)
        loss = loss_fn(ours(x), y)
        (loss * weight).backward()
        sync.launch()
        sync.wait()
        opt_ours.step()
        return float(loss.detach())

    def ddp_step(x: torch.Tensor, y: torch.Tensor) -> float:
        opt_theirs.zero_grad(set_to_none=True)
        loss = loss_fn(theirs(x), y)
        loss.backward()
        opt_theirs.step()
        return float(loss.detach())

    for step in range(steps + 1):  # step 0 warms both up and is not timed
        x = torch.randn(batch, 30, 25, 25, generator=generator)
        y = torch.randint(0, 16, (batch,), generator=generator)
        order = (("lbtrain", lbtrain_step), ("ddp", ddp_step))
        for name, action in order if step % 2 else order[::-1]:
            comm.barrier()
            begin = time.perf_counter()
            value = action(x, y)
            elapsed = time.perf_counter() - begin
            losses[name].append(value)
            if step:
                times[name].append(elapsed)
    difference = max(
        (p - q).abs().max().item()
        for p, q in zip(ours.parameters(), theirs.module.parameters(), strict=True)
    )
    curve = max(abs(a - b) for a, b in zip(losses["lbtrain"], losses["ddp"], strict=True))
    medians = comm.allgather({k: statistics.median(v) for k, v in times.items()})
    result = {
        "lbtrain": max(m["lbtrain"] for m in medians),
        "ddp": max(m["ddp"] for m in medians),
        "param_difference": max(comm.allgather(difference)),
        "loss_difference": max(comm.allgather(curve)),
        "steps": steps,
    }
    dist.destroy_process_group()
    if comm.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def _against_ddp(quick: bool) -> dict:
    steps, batch = (10, 16) if quick else (40, 16)
    command = [
        str(VENV_BIN / "mpiexec"), "-n", str(RANKS), sys.executable, __file__, "--worker",
        "--steps", str(steps), "--batch", str(batch),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(
            f"bench_ddp worker failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return {**json.loads(line.removeprefix("RESULT ")), "batch": batch}


def run(quick: bool, workdir: Path) -> list[Figure]:
    """Part 1 against DDP itself, part 2 the headline; figures with the issue's targets."""
    bench = "3 ddp"
    ddp = _against_ddp(quick)
    ratio = ddp["lbtrain"] / ddp["ddp"]
    figures = [
        Figure(bench, f"lbtrain step / DDP step (HybridSN, {ddp['batch']}/rank, equal)", ratio,
               "x", "<= 1.00", ratio <= 1.0,
               f"{1e3 * ddp['lbtrain']:.0f} vs {1e3 * ddp['ddp']:.0f} ms, "
               f"medians of {ddp['steps']} alternating steps"),
        Figure(bench, "loss curves, max |lbtrain - DDP|", ddp["loss_difference"], "",
               "<= 1e-5", ddp["loss_difference"] <= 1e-5),
        Figure(bench, "parameters after the steps, max |lbtrain - DDP|",
               ddp["param_difference"], "", "<= 1e-5", ddp["param_difference"] <= 1e-5),
    ]  # fmt: skip
    # bench_balance's 2-rank runs, made once for both: real Indian Pines, `make demo`'s model.
    runs = policy_runs(2, "1,3", quick, workdir)
    equal, cost = runs["equal"], runs["cost"]
    epochs = len(epochs_of(cost.out))
    seconds = {
        name: sum(e["seconds"] for e in epochs_of(run.out))
        for name, run in (("equal", equal), ("cost", cost))
    }
    figures += [
        Figure(bench, f"DDP's algorithm, 1,3 slowdown: {epochs} epochs", seconds["equal"], "s",
               note=f"OA {100 * equal.summary['metrics']['oa']:.2f} %"),
        Figure(bench, f"lbtrain cost, 1,3 slowdown: {epochs} epochs", seconds["cost"], "s",
               note=f"OA {100 * cost.summary['metrics']['oa']:.2f} %"),
        Figure(bench, "speedup of cost over DDP's algorithm", seconds["equal"] / seconds["cost"],
               "x", note="training time to the same epoch count"),
    ]  # fmt: skip
    return figures


def main() -> None:
    """Standalone use, and the ranks' entry point (--worker)."""
    if "--worker" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--worker", action="store_true")
        parser.add_argument("--steps", type=int, default=10)
        parser.add_argument("--batch", type=int, default=16)
        args = parser.parse_args()
        _worker(args.steps, args.batch)
        return
    sys.exit(standalone("scripts/bench_ddp.py", run))


if __name__ == "__main__":
    main()
