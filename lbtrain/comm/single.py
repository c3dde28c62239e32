"""The communicator of a one-rank world: no engine, no messages."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import torch

from lbtrain.comm.base import Completed, Request

__all__ = ["SingleProcessCommunicator"]


class SingleProcessCommunicator:
    """The trivial communicator of a world with one rank."""

    rank = 0
    size = 1
    cuda_aware = True  # nothing is sent anywhere: any memory will do

    def allreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> None:
        """The sum over one rank is the buffer itself."""

    def iallreduce_sum_(self, buffer: torch.Tensor | np.ndarray) -> Request:
        """The sum over one rank is the buffer itself, complete at once."""
        return Completed()

    def broadcast_(self, buffer: torch.Tensor | np.ndarray, root: int = 0) -> None:
        """The root is this rank: nothing to copy."""
        self.bcast(None, root)

    def allgather(self, obj: Any) -> list[Any]:
        """A list holding this rank's object."""
        return [obj]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """This rank's object."""
        if root != 0:
            raise ValueError(f"Invalid root {root}, root should be 0 in a world of size 1")
        return obj

    def barrier(self) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """Nothing to release (torch.distributed's communicator destroys its groups here)."""

    def abort(self, code: int = 1) -> None:
        """Exit this process."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
