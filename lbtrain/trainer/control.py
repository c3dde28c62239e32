"""The one small allreduce of every step, as a typed message instead of vector indices."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from lbtrain.comm import Communicator

__all__ = ["Control"]


@dataclass
class Control:
    """What every rank adds into the step's control allreduce; after it, the job's sums.

    Attributes:
        loss: this rank's mean loss times its weight b_i / B (summed: the global batch's).
        metric: the workload's summed step metric (correct predictions for a classifier).
        samples: samples this rank computed (summed: the global batch).
        nonfinite: 1 when this rank's loss is NaN or infinite (summed: how many ranks).
        sigint, sigterm: 1 when this rank caught that signal (summed: how many ranks).
        clock: rank 0's seconds of training in the run up to the end of the step before,
            evaluations and checkpoints' writes left out (the other ranks add 0): a time
            every rank holds alike, from which they decide together when a checkpoint by
            time is due.
    """

    loss: float = 0.0
    metric: float = 0.0
    samples: float = 0.0
    nonfinite: float = 0.0
    sigint: float = 0.0
    sigterm: float = 0.0
    clock: float = 0.0

    @classmethod
    def of_step(
        cls,
        weight: float,
        loss: float,
        metric: float,
        samples: int,
        stop_code: int,
        clock: float = 0.0,
    ) -> Control:
        """This rank's contribution: its weighted loss (0 if not finite), stop request and
        (rank 0) training clock."""
        finite = math.isfinite(loss)
        return cls(
            loss=weight * loss if finite else 0.0,
            metric=metric,
            samples=float(samples),
            nonfinite=0.0 if finite else 1.0,
            sigint=1.0 if stop_code == 130 else 0.0,
            sigterm=1.0 if stop_code == 143 else 0.0,
            clock=clock,
        )

    def allreduce(self, comm: Communicator) -> Control:
        """The job's sums, on every rank; collective (one small allreduce)."""
        vector = np.array(dataclasses.astuple(self), dtype=np.float64)
        comm.allreduce_sum_(vector)
        return Control(*(float(v) for v in vector))

    @property
    def stop_code(self) -> int:
        """143 when any rank caught SIGTERM, 130 for SIGINT only, else 0."""
        return 143 if self.sigterm else 130 if self.sigint else 0
