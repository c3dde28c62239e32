"""Every Communicator operation on real MPI ranks."""

from __future__ import annotations

import numpy as np
import torch

from lbtrain import MPICommunicator, world_communicator

comm = world_communicator()
assert isinstance(comm, MPICommunicator), type(comm)
size, rank = comm.size, comm.rank
expected = sum(range(size))

tensor = torch.full((5,), float(rank), dtype=torch.float64)
comm.allreduce_sum_(tensor)
assert torch.equal(tensor, torch.full((5,), float(expected), dtype=torch.float64)), tensor

array = np.full(3, rank, dtype=np.int64)
comm.allreduce_sum_(array)
assert (array == expected).all(), array

try:
    comm.allreduce_sum_(torch.zeros(4, 4).t())
except ValueError as exc:
    assert "contiguous" in str(exc)
else:
    raise AssertionError("a non-contiguous tensor must be refused, not reduced as a copy")

# broadcast_ overwrites every rank's buffer with the root's, tensors and arrays alike.
root = size - 1
tensor = torch.full((4,), float(rank), dtype=torch.float32)
comm.broadcast_(tensor, root=root)
assert torch.equal(tensor, torch.full((4,), float(root))), tensor
array = np.arange(3, dtype=np.int64) * (rank + 1)
comm.broadcast_(array, root=root)
assert (array == np.arange(3) * size).all(), array

assert comm.allgather({"rank": rank}) == [{"rank": r} for r in range(size)]
assert comm.bcast("from root" if rank == size - 1 else None, root=size - 1) == "from root"
comm.barrier()
if rank == 0:
    print(f"comm ops ok on {size} ranks")
