"""Getting a gradient bucket to MPI: straight, or through a pinned host buffer.

An MPI library that is not CUDA-aware can only reduce host memory, so a CUDA bucket is
copied to a pinned host buffer on a side stream (overlapping the rest of backward), reduced
there, and copied back on the compute stream before the optimizer reads it. A CUDA-aware
library reduces the bucket itself once the kernels that wrote it have finished.
"""

from __future__ import annotations

from typing import Protocol

import torch

from lbtrain.comm import Communicator

__all__ = ["Stager", "make_stager"]


class Stager(Protocol):
    """The per-bucket steps between "gradients are in" and "MPI may read `buffer`"."""

    buffer: torch.Tensor

    def stage(self) -> None:
        """Start getting the bucket's current contents into `buffer`."""

    def staged(self, *, block: bool) -> bool:
        """Whether `buffer` holds them; with `block`, wait until it does."""

    def unstage(self) -> None:
        """Bring the reduced `buffer` back into the bucket (before the optimizer step)."""


class HostCopy:
    """A CPU bucket through a separate host buffer: the staged path, testable without a GPU."""

    def __init__(self, flat: torch.Tensor) -> None:
        self.flat = flat
        self.buffer = torch.empty_like(flat)

    def stage(self) -> None:
        self.buffer.copy_(self.flat)

    def staged(self, *, block: bool) -> bool:
        return True

    def unstage(self) -> None:
        self.flat.copy_(self.buffer)


class CudaHostStaging:
    """A CUDA bucket through pinned host memory, its download on a side stream."""

    def __init__(self, flat: torch.Tensor) -> None:
        self.flat = flat
        self.buffer = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=True)
        self.stream = torch.cuda.Stream(device=flat.device)
        self.copied = torch.cuda.Event()
        self.returned = torch.cuda.Event()

    def stage(self) -> None:
        # The side stream waits for the kernels that wrote (and scaled) the bucket, and for
        # the last copy back out of the host buffer, whatever stream that ran on; then it
        # copies while the compute stream goes on with the rest of backward.
        self.stream.wait_stream(torch.cuda.current_stream(self.flat.device))
        self.stream.wait_event(self.returned)
        with torch.cuda.stream(self.stream):
            self.buffer.copy_(self.flat, non_blocking=True)
            self.copied.record(self.stream)

    def staged(self, *, block: bool) -> bool:
        return _reached(self.copied, block)

    def unstage(self) -> None:
        # Pinned source, compute stream: queued before the optimizer's kernels. The next
        # download into this buffer waits for this event, so it never overwrites it early.
        self.flat.copy_(self.buffer, non_blocking=True)
        self.returned.record(torch.cuda.current_stream(self.flat.device))


class CudaDirect:
    """A CUDA bucket handed to a CUDA-aware MPI once the kernels that wrote it are done."""

    def __init__(self, flat: torch.Tensor) -> None:
        self.buffer = flat
        self.written = torch.cuda.Event()

    def stage(self) -> None:
        self.written.record(torch.cuda.current_stream(self.buffer.device))

    def staged(self, *, block: bool) -> bool:
        return _reached(self.written, block)

    def unstage(self) -> None:
        """MPI wrote the sum into the bucket itself."""


def _reached(event: torch.cuda.Event, block: bool) -> bool:
    """Whether the GPU has passed `event`; with `block`, wait until it has."""
    if block:
        event.synchronize()
        return True
    return event.query()


def make_stager(flat: torch.Tensor, comm: Communicator, stage: bool | None) -> Stager | None:
    """How `flat` reaches MPI: None for a CPU bucket reduced in place.

    Args:
        flat: the bucket.
        comm: the job's communicator (`cuda_aware` decides for CUDA buckets).
        stage: True forces host staging, False forbids it (a CUDA bucket then needs a
            CUDA-aware library), None decides by device and library.
    """
    if flat.device.type == "cpu":
        return HostCopy(flat) if stage else None
    if flat.device.type != "cuda":
        raise ValueError(f"gradient buckets on {flat.device} are not supported; use cpu or cuda")
    if stage is None:
        stage = not comm.cuda_aware
    if stage:
        return CudaHostStaging(flat)
    if not comm.cuda_aware:
        raise ValueError(
            "stage=False needs a CUDA-aware MPI library for CUDA gradients, and this one is "
            "not: leave stage at None"
        )
    return CudaDirect(flat)
