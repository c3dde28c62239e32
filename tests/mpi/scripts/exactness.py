"""N ranks with unequal shares must make exactly the updates of one process.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/scripts/exactness.py [ops] 5,11,48[:MODE] ...
(one job checks each case in turn; `check` runs one case on any communicator, and the
in-process tests call it on threads). MODE is how the weighted model syncs: "function"
(`sync_gradients` after backward, the default), "overlap" (`GradientSync` started from
backward, one small bucket per parameter so several are in flight) or "staged" (the same
through host staging buffers, the GPU path). A case `wrapper/CASE` runs
wrapper_exactness.py's CASE in the same job (BalancedDataParallel, the DDP hook, a model
mismatch, which ends the job), so one launch per engine checks them all.
Every rank also trains the single-process reference itself (the data is the same on every
rank), so each rank checks its own parameters. The naive 1/P average is trained alongside
and must visibly miss, which shows the comparison can fail.
"""

from __future__ import annotations

import sys
import threading

import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import balanced_loader, plan_batches, sync_gradients, world_communicator
from lbtrain.balancer import BalancePlan, ReplicaSpeed
from lbtrain.comm import Communicator
from lbtrain.data import epoch_schedule
from lbtrain.parallel.gradients import GradientSync
from tests.mpi.scripts.comm_ops import check_ops

EPOCHS = 2
NUM_SAMPLES = 64 * 3 + 29  # three full global batches and a short tail


# Ranks that are threads share torch's global generator: seed and build under one lock.
_SEEDING = threading.Lock()


def make_model() -> nn.Module:
    with _SEEDING:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)).double()


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    """The same float64 inputs and class targets on every rank (and every check)."""
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(42)
    inputs = torch.randn(NUM_SAMPLES, 8, dtype=torch.float64, generator=generator)
    return inputs, torch.randint(0, 4, (NUM_SAMPLES,), generator=generator)


def check(comm: Communicator, sizes: list[int], mode: str = "function") -> str:
    """Train weighted, naive and reference models on `comm`; assert; a line saying so."""
    if mode not in ("function", "overlap", "staged"):
        raise ValueError(f"unknown mode {mode!r}")
    if len(sizes) != comm.size:
        raise ValueError(f"{len(sizes)} batch sizes given for {comm.size} ranks")
    inputs, targets = make_data()
    dataset = TensorDataset(inputs, targets, torch.arange(NUM_SAMPLES))

    if 0 in sizes:
        # A zero share, as the cost policy gives a rank whose fixed cost outlasts the step.
        speeds = tuple(ReplicaSpeed(float(max(s, 1))) for s in sizes)
        plan = BalancePlan("cost", sum(sizes), tuple(sizes), speeds)
    else:
        plan = plan_batches([float(s) for s in sizes], sum(sizes), "proportional")
    assert list(plan.batch_sizes) == sizes, plan.batch_sizes
    loader = balanced_loader(plan, dataset, rank=comm.rank, seed=5)

    weighted, naive, reference = make_model(), make_model(), make_model()
    opt_weighted, opt_naive, opt_reference = map(make_optimizer, (weighted, naive, reference))
    loss_fn = nn.CrossEntropyLoss()
    overlapped = None
    if mode != "function":
        overlapped = GradientSync(
            weighted, comm, bucket_mb=0.001, overlap=True, stage=mode == "staged"
        )
        assert len(overlapped.buckets) == len(list(weighted.parameters()))
    schedule = epoch_schedule(NUM_SAMPLES, plan)

    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        seen = []
        for x, y, index in loader:
            seen.extend(index.tolist())
            if overlapped is not None:
                # "overlap" drives it as the trainer does (the weight rides on the loss);
                # "staged" scales the buckets.
                prescaled = mode == "overlap"
                overlapped.begin(loader.weight, prescaled=prescaled)
                if not loader.empty:
                    loss = loss_fn(weighted(x), y)
                    (loss * loader.weight if prescaled else loss).backward()
                overlapped.launch()
                overlapped.wait()
                opt_weighted.step()
            for model, opt, weight in (
                *([(weighted, opt_weighted, loader.weight)] if overlapped is None else []),
                (naive, opt_naive, 1.0 / comm.size),
            ):
                opt.zero_grad()
                if not loader.empty:  # a zero share computes nothing and adds zeros
                    loss_fn(model(x), y).backward()
                sync_gradients(model, weight, comm)
                opt.step()
        everyone = sorted(i for part in comm.allgather(seen) for i in part)
        assert everyone == list(range(NUM_SAMPLES)), "an epoch must cover every sample once"

        perm = loader.batch_sampler.permutation()
        for start, stop, _ in schedule:
            batch = perm[start:stop]
            opt_reference.zero_grad()
            loss_fn(reference(inputs[batch]), targets[batch]).backward()
            opt_reference.step()

    exact_diff = (flat_params(weighted) - flat_params(reference)).abs().max().item()
    naive_diff = (flat_params(naive) - flat_params(reference)).abs().max().item()
    drift = max(comm.allgather(flat_params(weighted).sum().item())) - min(
        comm.allgather(flat_params(weighted).sum().item())
    )
    assert exact_diff < 1e-10, f"rank {comm.rank}: weighted sync differs by {exact_diff:.3e}"
    assert naive_diff > 1e-3, f"rank {comm.rank}: naive 1/P average matched ({naive_diff:.3e})"
    assert drift == 0.0, f"ranks disagree on parameters by {drift}"
    return (
        f"exactness ok: ranks={comm.size} batch_sizes={sizes} mode={mode} "
        f"steps/epoch={len(loader)} "
        f"weighted max|diff|={exact_diff:.2e} naive 1/P max|diff|={naive_diff:.2e}"
    )


def main() -> None:
    from tests.mpi.scripts import wrapper_exactness  # it imports this module's helpers

    comm = world_communicator()
    for case in sys.argv[1:]:
        if case == "ops":  # every Communicator operation, in the same job
            line = check_ops(comm)
        elif case.startswith("wrapper/"):  # BalancedDataParallel or the DDP hook, same job
            line = wrapper_exactness.run_case(comm, case.removeprefix("wrapper/"))
        else:
            sizes, _, mode = case.partition(":")
            line = check(comm, [int(s) for s in sizes.split(",")], mode or "function")
        if comm.rank == 0:
            print(line, flush=True)
    wrapper_exactness.cleanup(comm)


if __name__ == "__main__":
    main()
