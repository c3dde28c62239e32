"""Loaders the DDP hook must refuse on every rank: cases of the one-job-per-engine exactness
run (exactness.py, `ddp-misuse/CASE`), on 3 ranks, under mpiexec and under torchrun.

Each case builds a DDP model of its own over torch.distributed's gloo group
(wrapper_exactness.process_group) and takes one step. `rank`: every rank builds its loader
for rank 0. `size`: every rank plans for 4 ranks. `plan`: each rank plans from its own
speeds. `length`: rank 1's dataset is longer. `big-seed`: no misuse, a seed beyond int64 on
every rank, which the check must take. Each rank catches the refusal, and rank 0 prints what
every rank said, so the test sees that a rank whose own loader is right refused too,
instead of waiting in the bucket's allreduce for a rank that left (torchrun's agent would end
it, but other launchers do not): "ddp misuse CASE: rank 0: refused: ... | rank 1: ...".
"""

from __future__ import annotations

import gc

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from lbtrain import WeightedHookState, balanced_loader, weighted_allreduce_hook
from lbtrain.comm import Communicator
from tests.mpi.scripts.wrapper_exactness import process_group

CASES = ("rank", "size", "plan", "length", "big-seed")


def run_case(comm: Communicator, case: str) -> str:
    """Build this case's loader and DDP model, take one step; what every rank said."""
    assert case in CASES, case
    process_group(comm)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    rank, size = comm.rank, comm.size
    if case == "rank":
        loader = balanced_loader([1.0] * size, data, global_batch_size=9, rank=0)  # wrong but on 0
    elif case == "size":
        loader = balanced_loader([1.0] * (size + 1), data, global_batch_size=8, rank=rank)
    elif case == "plan":
        speeds = [3.0 if r == rank else 1.0 for r in range(size)]  # each rank's own view
        loader = balanced_loader(speeds, data, global_batch_size=9, rank=rank)
    elif case == "length":
        data = TensorDataset(*(t.repeat(2 if rank == 1 else 1, *[1] * (t.dim() - 1))
                               for t in data.tensors))  # fmt: skip
        loader = balanced_loader([1.0] * size, data, global_batch_size=9, rank=rank)
    else:
        loader = balanced_loader([1.0] * size, data, global_batch_size=9, rank=rank,
                                 seed=2**63 + 1)  # fmt: skip
    model = DistributedDataParallel(nn.Linear(4, 2))
    model.register_comm_hook(WeightedHookState(loader), weighted_allreduce_hook)
    x, y = next(iter(loader))
    try:
        nn.functional.cross_entropy(model(x), y).backward()
        said = "trained"
    except ValueError as exc:
        said = f"refused: {exc}"
    # DDP's reducer holds the gloo group: freed only at interpreter exit, after the group
    # is destroyed, its threads can abort the process ("terminate called without an active
    # exception", exit -6). Free it first, as lbtrain's own close() does.
    del model, loader
    gc.collect()
    every = comm.allgather(said)  # also: every rank is done with this case's model
    return f"ddp misuse {case}: " + " | ".join(f"rank {r}: {s}" for r, s in enumerate(every))
