"""A user's loop with `BalancedDataParallel` must make exactly the updates of one process.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/scripts/wrapper_exactness.py CASE ...
     torchrun --nproc-per-node 3 tests/mpi/scripts/wrapper_exactness.py CASE ...
CASE is SHARES[:MODE][@DEVICES], e.g. 20,0,44:accumulate@cuda:0,cpu,cpu; or `profiled:1,2,4`
(plan with `plan_for` on ranks emulating those slowdowns, then check that plan); or
`mismatch` (ranks build models that differ in one layer: every rank must raise ModelMismatch
naming it, and the job ends). The loop is the plain DDP one, `loss_fn(model(x),
y).backward()` and `optimizer.step()`, with no branch for a zero share. MODE: "overlap" (the
default), "plain" (no overlap), "accumulate" (two loader batches per optimizer step, under
`no_sync`, each loss divided by 2 as DDP scripts do), "accumulate-sync" (the same without
`no_sync`: a backward and a sync per micro-batch), "two-backward" (two losses, each
backpropagated through one forward), "sum" (a loss summed over the samples,
`loss_reduction="sum"`), "count" (a loss averaged over counted units, 1 to 3 per sample,
`loss_reduction="count"`) or "ddp-hook" (stock DistributedDataParallel with
`weighted_allreduce_hook`, over torch.distributed with gloo: the job's process group under
torchrun, else one made for the check from a file every rank sees). `bn/CASE` runs
bn_exactness.py's CASE (a model with BatchNorm), `ddp-misuse/CASE` ddp_hook_misuse.py's (a
loader the DDP hook must refuse). A second model with DDP's 1/P average is trained alongside
and must visibly miss, which shows the comparison can fail.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import BalancedDataParallel, ModelMismatch, balanced_loader, world_communicator
from lbtrain.balancer import BalancePlan, ReplicaSpeed
from lbtrain.comm import Communicator
from lbtrain.data import epoch_schedule
from tests.mpi.scripts.exactness import (
    EPOCHS,
    NUM_SAMPLES,
    flat_params,
    make_data,
    make_model,
    make_optimizer,
)

_STORES: list[str] = []  # files of process groups made here, removed at the end
MODES = ("overlap", "plain", "accumulate", "accumulate-sync", "two-backward", "sum", "count",
         "ddp-hook")  # fmt: skip
REDUCTIONS = {"sum": "sum", "count": "count"}


def _units(indices: torch.Tensor) -> torch.Tensor:
    """The units each sample counts for in a "count" loss (tokens, say): 1 to 3."""
    return (indices % 3 + 1).double()


def _loss(mode: str, outputs: torch.Tensor, y: torch.Tensor, units: torch.Tensor):
    """This batch's loss as `mode` normalises it (the reference's over the global batch)."""
    per_sample = nn.functional.cross_entropy(outputs, y, reduction="none")
    if mode == "sum":
        return per_sample.sum() / 64  # a sum (times a constant: SGD's lr stays sane)
    if mode == "count":
        return (per_sample * units).sum() / units.sum()
    return per_sample.mean()


def _plan(sizes: list[int]) -> BalancePlan:
    speeds = tuple(ReplicaSpeed(float(max(s, 1))) for s in sizes)
    return BalancePlan("cost", sum(sizes), tuple(sizes), speeds)


def check(
    comm: Communicator, sizes: list[int], mode: str = "overlap", devices: list[str] | None = None
) -> str:
    """Train the wrapped, naive and reference models on `comm`; assert; a line saying so.

    `devices` places each rank's trained models (e.g. cuda:0,cpu,cpu); the reference stays
    on the CPU.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    if len(sizes) != comm.size:
        raise ValueError(f"{len(sizes)} batch sizes given for {comm.size} ranks")
    inputs, targets = make_data()
    indices = torch.arange(len(inputs))
    plan = _plan(sizes)
    dataset = TensorDataset(inputs, targets, indices)
    loader = balanced_loader(plan, dataset, rank=comm.rank, seed=5)

    # Rank 0's initial weights win: the other ranks start from other seeds on purpose.
    device = torch.device(devices[comm.rank] if devices else "cpu")
    models = [make_model() for _ in range(3)]
    models[0].to(device)
    models[1].to(device)
    if comm.rank:
        with torch.no_grad():
            for model in models[:2]:
                for p in model.parameters():
                    p.add_(comm.rank)
    overlap = mode != "plain"
    if mode == "ddp-hook":
        exact, naive = _ddp_models(comm, models, loader)
    else:
        reduction = REDUCTIONS.get(mode, "mean")
        exact = BalancedDataParallel(models[0], comm, loader, overlap=overlap, bucket_mb=0.001,
                                     loss_reduction=reduction)  # fmt: skip
        naive = BalancedDataParallel(models[1], comm, loader, overlap=overlap, weighting="uniform",
                                     loss_reduction=reduction)  # fmt: skip
    reference = models[2]
    start = flat_params(reference).clone()  # rank 0's, which every trained model starts from
    optimizers = [make_optimizer(m) for m in models]
    every = 2 if mode.startswith("accumulate") else 1
    # Under no_sync, the DDP idiom: each micro-batch's loss divided by their number.
    divide = every if mode == "accumulate" else 1

    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for step, (x, y, index) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            last = (step + 1) % every == 0 or step + 1 == len(loader)
            for model, optimizer in zip((exact, naive), optimizers, strict=False):
                if step % every == 0:
                    optimizer.zero_grad()
                if mode == "count":
                    model.set_loss_count(float(_units(index).sum()))
                if mode == "accumulate-sync":
                    # Micro-batches of a step as one process weighs them: by their samples.
                    share = _group_samples(loader, step, every) / loader.global_samples
                    (nn.functional.cross_entropy(model(x), y) / share).backward()
                    if last:
                        optimizer.step()
                elif mode == "two-backward":
                    outputs = model(x)
                    nn.functional.cross_entropy(outputs, y).backward(retain_graph=True)
                    (outputs**2).mean().backward()
                    optimizer.step()
                elif last or mode == "ddp-hook":
                    (_loss(mode, model(x), y, _units(index).to(device)) / divide).backward()
                    optimizer.step()
                else:
                    with model.no_sync():
                        (_loss(mode, model(x), y, _units(index).to(device)) / divide).backward()
        perm = loader.batch_sampler.permutation()
        schedule = epoch_schedule(NUM_SAMPLES, plan)
        for first in range(0, len(schedule), every):
            group = schedule[first : first + every]
            # Accumulating under no_sync, one process runs the same loop: a backward per
            # micro-batch (unequal ones in the epoch's last group), the loss divided by
            # their number. Otherwise one batch: the union, as the user's loss scales it.
            bounds = [(begin, end) for begin, end, _ in group]
            pieces = bounds if mode == "accumulate" else [(group[0][0], group[-1][1])]
            optimizers[2].zero_grad()
            for begin, end in pieces:
                batch = perm[begin:end]
                outputs = reference(inputs[batch])
                loss = _loss(mode, outputs, targets[batch], _units(indices[batch])) / divide
                loss.backward(retain_graph=mode == "two-backward")
                if mode == "two-backward":
                    (outputs**2).mean().backward()
            optimizers[2].step()

    exact_diff = (flat_params(models[0]).cpu() - flat_params(reference)).abs().max().item()
    naive_diff = (flat_params(models[1]).cpu() - flat_params(reference)).abs().max().item()
    sums = comm.allgather(flat_params(models[0]).cpu().sum().item())
    assert exact_diff < 1e-10, f"rank {comm.rank}: the wrapper differs by {exact_diff:.3e}"
    assert naive_diff > 1e-3, f"rank {comm.rank}: naive 1/P average matched ({naive_diff:.3e})"
    # ... and missed by training otherwise, not by standing still (its buckets zeroed).
    naive_moved = (flat_params(models[1]).cpu() - start).abs().max().item()
    assert naive_moved > 1e-2, f"rank {comm.rank}: the 1/P model did not train ({naive_moved})"
    assert max(sums) == min(sums), f"ranks disagree on parameters: {sums}"
    return (
        f"wrapper exactness ok: ranks={comm.size} batch_sizes={sizes} mode={mode} "
        f"devices={','.join(devices) if devices else 'cpu'} "
        f"max|diff|={exact_diff:.2e} naive 1/P max|diff|={naive_diff:.2e}"
    )


def _group_samples(loader, step: int, every: int) -> int:
    """The global samples of the accumulation group that step `step` belongs to."""
    schedule = epoch_schedule(NUM_SAMPLES, loader.plan)
    first = step - step % every
    group = schedule[first : first + every]
    return group[-1][1] - group[0][0]


def process_group(comm: Communicator) -> None:
    """torch.distributed's default group: the job's under torchrun, else one made here."""
    import torch.distributed as dist

    if not dist.is_initialized():
        # Under mpiexec: a gloo group beside MPI, met through a file every rank can see.
        path = comm.bcast(tempfile.mkstemp(prefix="lbtrain-ddp-")[1] if comm.rank == 0 else None)
        _STORES.append(path)
        dist.init_process_group(
            "gloo", init_method=f"file://{path}", rank=comm.rank, world_size=comm.size
        )


def _ddp_models(comm: Communicator, models: list[nn.Module], loader) -> tuple[nn.Module, ...]:
    """Stock DDP with lbtrain's hook, and stock DDP with its own 1/P average."""
    from torch.nn.parallel import DistributedDataParallel

    from lbtrain import WeightedHookState, weighted_allreduce_hook

    process_group(comm)
    exact = DistributedDataParallel(models[0], bucket_cap_mb=0.001)
    exact.register_comm_hook(WeightedHookState(loader), weighted_allreduce_hook)
    return exact, DistributedDataParallel(models[1])


def mismatch(comm: Communicator) -> str:
    """Rank 1 builds a wider hidden layer; every rank must refuse, naming the parameter."""
    width = 33 if comm.rank == 1 else 32
    model = nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 4))
    dataset = TensorDataset(torch.zeros(8, 8))
    loader = balanced_loader(_plan([4] * comm.size), dataset, rank=comm.rank)
    try:
        BalancedDataParallel(model, comm, loader)
    except ModelMismatch as exc:
        return str(exc)
    raise AssertionError("models that differ were accepted")


def profiled(comm: Communicator, factors: list[float]) -> str:
    """Plan with `plan_for` on ranks slowed by `factors` (emulated), then check that plan."""
    from lbtrain import plan_for

    torch.set_num_threads(1)
    sample = (torch.randn(4, 8, dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    plan = plan_for(make_model(), nn.CrossEntropyLoss(), sample, comm, 64, "proportional",
                    time_budget=1.0, slowdown=factors[comm.rank])  # fmt: skip
    return check(comm, list(plan.batch_sizes), "overlap") + f" (plan_for, slowdown {factors})"


def run_case(comm: Communicator, case: str) -> str:
    """One case of the command line (module docstring); `mismatch` ends the job."""
    if case == "mismatch":
        print(f"rank {comm.rank}: {mismatch(comm)}", flush=True)
        raise SystemExit(3)
    if case.startswith("ddp-misuse/"):
        from tests.mpi.scripts import ddp_hook_misuse

        return ddp_hook_misuse.run_case(comm, case.removeprefix("ddp-misuse/"))
    if case.startswith("bn/"):
        from tests.mpi.scripts import bn_exactness

        return bn_exactness.run_case(comm, case.removeprefix("bn/"))
    if case.startswith("profiled:"):
        return profiled(comm, [float(f) for f in case.removeprefix("profiled:").split(",")])
    case, _, devices = case.partition("@")
    sizes, _, mode = case.partition(":")
    return check(
        comm,
        [int(s) for s in sizes.split(",")],
        mode or "overlap",
        devices.split(",") if devices else None,
    )


def cleanup(comm: Communicator) -> None:
    """End the process group made for the ddp-hook cases, if any, and remove its file."""
    if _STORES:
        import torch.distributed as dist

        dist.destroy_process_group()
        comm.barrier()
        if comm.rank == 0:
            Path(_STORES.pop()).unlink(missing_ok=True)


def main() -> None:
    comm = world_communicator()
    for case in sys.argv[1:]:
        line = run_case(comm, case)
        if comm.rank == 0:
            print(line, flush=True)
    cleanup(comm)


if __name__ == "__main__":
    main()
