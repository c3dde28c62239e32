"""Loaders the DDP hook must refuse on every rank, under torchrun with 2 ranks.

    torchrun --nproc-per-node 2 ddp_hook_misuse.py CASE [CASE ...]

The cases run one after the other in one job (one launch for all), each with a DDP model
of its own. `rank`: both ranks build their loader for rank 0. `size`: both plan for 3
ranks. `plan`: each rank plans from its own speeds. `length`: rank 1's dataset is longer.
`big-seed`: no misuse, a seed beyond int64 on both ranks, which the check must take. Each rank
catches the refusal and prints it, so the test sees that a rank whose own loader is right
refused too, instead of waiting in the bucket's allreduce for a rank that left (torchrun's
agent would end it, but other launchers do not): "rank R: CASE: refused: ...".
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from lbtrain import WeightedHookState, balanced_loader, weighted_allreduce_hook


def check(case: str) -> None:
    """Build this case's loader and DDP model, take one step, say what happened."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    rank = dist.get_rank()
    if case == "rank":
        loader = balanced_loader([1.0, 1.0], data, global_batch_size=8, rank=0)  # rank 1: wrong
    elif case == "size":
        loader = balanced_loader([1.0] * 3, data, global_batch_size=9, rank=rank)
    elif case == "plan":
        speeds = [1.0, 3.0] if rank == 0 else [3.0, 1.0]
        loader = balanced_loader(speeds, data, global_batch_size=8, rank=rank)
    elif case == "length":
        data = TensorDataset(*(t.repeat(1 + rank, *[1] * (t.dim() - 1)) for t in data.tensors))
        loader = balanced_loader([1.0, 1.0], data, global_batch_size=8, rank=rank)
    else:
        loader = balanced_loader([1.0, 1.0], data, global_batch_size=8, rank=rank, seed=2**63 + 1)
    model = DistributedDataParallel(nn.Linear(4, 2))
    model.register_comm_hook(WeightedHookState(loader), weighted_allreduce_hook)
    x, y = next(iter(loader))
    try:
        nn.functional.cross_entropy(model(x), y).backward()
        said = "trained"
    except ValueError as exc:
        said = f"refused: {exc}"
    # One write per line: the ranks share the pipe, and print writes the newline apart.
    sys.stdout.write(f"rank {rank}: {case}: {said}\n")
    sys.stdout.flush()
    # DDP's reducer holds the gloo group: freed only at interpreter exit, after the group
    # is destroyed, its threads can abort the process ("terminate called without an active
    # exception", exit -6). Free it first, as lbtrain's own close() does.
    del model, loader
    gc.collect()


def main() -> None:
    dist.init_process_group("gloo")
    for case in sys.argv[1:]:
        check(case)
        dist.barrier()  # both ranks done with this case's model before the next one's
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
