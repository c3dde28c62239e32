"""One rank fails while the others wait in an allreduce: the job must end, not hang.

With the argument `abort`, rank 1 calls the communicator's abort instead, and says so if
the call returns (it must not: MPI_Abort returns at once in MPICH, before the job ends).
"""

from __future__ import annotations

import sys

import torch

from lbtrain import world_communicator

comm = world_communicator()
comm.barrier()
if comm.rank == 1:
    if sys.argv[1:] == ["abort"]:
        comm.abort(3)
        print("abort returned on rank 1", flush=True)
    raise ValueError("boom on rank 1: this message must reach the user")
comm.allreduce_sum_(torch.ones(4))  # never completes: rank 1 is gone
