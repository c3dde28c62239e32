"""One rank fails while the others wait in an allreduce: the job must end, not hang."""

from __future__ import annotations

import torch

from lbtrain import world_communicator

comm = world_communicator()
comm.barrier()
if comm.rank == 1:
    raise ValueError("boom on rank 1: this message must reach the user")
comm.allreduce_sum_(torch.ones(4))  # never completes: rank 1 is gone
