"""A short load-balanced run on a toy dataset: the library call inside a user's script.

Run:  mpiexec -n 3 .venv/bin/python -m mpi4py examples/balanced_toy.py [--speeds 1,2,4]

Each rank is given a (pretend) relative speed; the balancer turns the speeds into per-rank
batch sizes, each rank trains on its share of every global batch, and gradients are weighted
by b_i / B so the run makes the updates of one process on the whole batch. At the end the
script replays the same batches in one process and prints the largest parameter difference.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import balanced_loader, plan_batches, sync_gradients, world_communicator
from lbtrain.data import epoch_schedule


def toy_dataset(num_samples: int, seed: int = 0) -> TensorDataset:
    """Four Gaussian blobs in 16 dimensions: learnable, not trivial."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 16, generator=generator) * 0.4
    labels = torch.randint(0, 4, (num_samples,), generator=generator)
    inputs = centres[labels] + torch.randn(num_samples, 16, generator=generator)
    return TensorDataset(inputs, labels)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speeds", help="relative speed per rank, one each (default 1,2,4,...)")
    parser.add_argument("--global-batch", type=int, default=128, help="global batch (default 128)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    parser.add_argument("--policy", default="proportional", help="balancing policy")
    args = parser.parse_args()

    comm = world_communicator()
    torch.set_num_threads(1)
    if args.speeds is None:  # 1, 2, 4, ...: one for each rank, however many
        speeds = [float(2**rank) for rank in range(comm.size)]
    else:
        speeds = [float(s) for s in args.speeds.split(",")]
    if len(speeds) != comm.size:
        raise SystemExit(f"--speeds has {len(speeds)} entries for {comm.size} ranks; give one each")

    dataset = toy_dataset(2000)
    plan = plan_batches(speeds, args.global_batch, args.policy)
    loader = balanced_loader(plan, dataset, rank=comm.rank, seed=1)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    if comm.rank == 0:
        print(
            f"plan ({plan.policy}): batch sizes {plan.batch_sizes}, weights "
            f"{tuple(round(w, 3) for w in plan.weights)}, {len(loader)} steps/epoch"
        )

    start = time.perf_counter()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, samples
        for x, y in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = loss_fn(logits, y)
            loss.backward()
            sync_gradients(model, loader.weight, comm)
            optimizer.step()
            totals += torch.tensor([loss.item() * len(y), (logits.argmax(1) == y).sum(), len(y)])
        comm.allreduce_sum_(totals)
        if comm.rank == 0:
            print(
                f"epoch {epoch}: loss {totals[0] / totals[2]:.4f} "
                f"accuracy {totals[1] / totals[2]:.3f} ({time.perf_counter() - start:.1f}s)"
            )

    # Replay the same global batches in one process: the result must be the same model.
    reference = make_model()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    inputs, labels = dataset.tensors
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        perm = loader.batch_sampler.permutation()
        for begin, end, _ in epoch_schedule(len(dataset), plan):
            ref_optimizer.zero_grad()
            loss_fn(reference(inputs[perm[begin:end]]), labels[perm[begin:end]]).backward()
            ref_optimizer.step()
    diff = max(
        (p - q).abs().max().item()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
    if comm.rank == 0:
        print(f"max |distributed - single-process| parameter difference: {diff:.2e} (float32)")
    comm.close()  # under torchrun, releases torch.distributed's groups; elsewhere a no-op


if __name__ == "__main__":
    main()
