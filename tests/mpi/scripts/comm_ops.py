"""Every Communicator operation on N ranks: `check_ops(comm)` on any engine.

Run alone (mpiexec -n 3 python -m mpi4py tests/mpi/scripts/comm_ops.py), or as the "ops"
case of exactness.py, which shares its job (under mpiexec or torchrun).
"""

from __future__ import annotations

import numpy as np
import torch

from lbtrain import MPICommunicator, world_communicator
from lbtrain.comm import Communicator


def check_ops(comm: Communicator) -> str:
    """Assert every operation's result on this rank; a line saying so."""
    size, rank = comm.size, comm.rank
    expected = sum(range(size))

    tensor = torch.full((5,), float(rank), dtype=torch.float64)
    comm.allreduce_sum_(tensor)
    assert torch.equal(tensor, torch.full((5,), float(expected), dtype=torch.float64)), tensor

    array = np.full(3, rank, dtype=np.int64)
    comm.allreduce_sum_(array)
    assert (array == expected).all(), array

    # Two nonblocking sums in flight at once, a tensor and an array, read after their waits.
    tensor = torch.full((1000,), float(rank + 1), dtype=torch.float32)
    array = np.full(7, rank, dtype=np.float64)
    requests = [comm.iallreduce_sum_(tensor), comm.iallreduce_sum_(array)]
    while not requests[0].test():
        pass
    for request in requests:
        request.wait()
        assert request.test()
    assert torch.equal(tensor, torch.full((1000,), float(expected + size))), tensor
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
    return f"comm ops ok on {size} ranks ({type(comm).__name__})"


if __name__ == "__main__":
    world = world_communicator()
    assert isinstance(world, MPICommunicator), type(world)
    line = check_ops(world)
    if world.rank == 0:
        print(line)
