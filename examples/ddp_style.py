"""A PyTorch DDP script made balanced and exact with `BalancedDataParallel` (6 lines changed).

Run:  mpiexec -n 3 .venv/bin/python -m mpi4py examples/ddp_style.py [--slowdown 1,2,4]
      torchrun --nproc-per-node 3 examples/ddp_style.py

Each rank profiles its own model on its own device (`plan_for`; `--slowdown` pretends some
ranks are slower), the plan gives the faster ranks more of every global batch, and the loop
is the DDP loop: forward, loss, backward, step. Lines marked `# lbtrain` are the changes
from the DDP original (the README shows the diff).
"""

from __future__ import annotations

import argparse

import torch
from balanced_toy import toy_dataset  # the example beside this one
from torch import nn
from torch.utils.data import DataLoader, Subset

import lbtrain
from lbtrain.evaluation import ConfusionEvaluator


def make_model() -> nn.Module:
    """Wide enough that a step's cost grows with its batch, as a real model's does."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 4))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowdown", default="1", help="emulated slowdown per rank, e.g. 1,2,4")
    parser.add_argument("--global-batch", type=int, default=256, help="global batch (default 256)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    comm = lbtrain.world_communicator()  # lbtrain: MPI, torch.distributed or one process
    factors = [float(s) for s in args.slowdown.split(",")]
    slowdown = factors[comm.rank] if comm.rank < len(factors) else factors[-1]
    data = toy_dataset(5000)
    dataset, test_set = Subset(data, range(4000)), Subset(data, range(4000, 5000))
    model, loss_fn = make_model(), nn.CrossEntropyLoss()
    sample = next(iter(DataLoader(dataset, batch_size=8)))

    plan = lbtrain.plan_for(model, loss_fn, sample, comm, args.global_batch,  # lbtrain
                            time_budget=2.0, slowdown=slowdown)  # fmt: skip
    loader = lbtrain.balanced_loader(plan, dataset, rank=comm.rank)  # lbtrain
    model = lbtrain.BalancedDataParallel(model, comm, loader)  # lbtrain
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if comm.rank == 0:
        print(f"plan ({plan.policy}): batch sizes {plan.batch_sizes} of {args.global_batch}")

    for epoch in range(args.epochs):
        loader.set_epoch(epoch)  # lbtrain (DDP: sampler.set_epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()  # weighted by b_i / B and summed over ranks
            optimizer.step()
        metrics = model.evaluate(test_set, ConfusionEvaluator(4))
        if comm.rank == 0:
            print(f"epoch {epoch + 1}: test accuracy {metrics['accuracy']:.3f}", flush=True)
    comm.close()  # lbtrain (DDP: dist.destroy_process_group())


if __name__ == "__main__":
    main()
