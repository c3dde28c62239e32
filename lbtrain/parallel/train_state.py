"""Save and restore a user's own loop, to continue exactly on any number of ranks.

    state = TrainState(model, optimizer, loader, comm)
    epoch = state.restore(path)                 # 0 when there is nothing to continue
    for epoch in range(epoch, epochs):
        loader.set_epoch(epoch)
        for inputs, targets in loader:          # a restored epoch begins at its next step
            ...                                 # forward, backward, optimizer.step()
            state.save(path)                    # every so often, after the update

Global batch k does not depend on the world (lbtrain.data), and the update is exact on any
plan, so a loop saved on P ranks continues on Q from the same global sample: build the
loader for the new world (its own plan), restore, and the updates are the ones P ranks, or
one process, would have made (to float rounding).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lbtrain.collective import write_on_root
from lbtrain.comm import Communicator
from lbtrain.data import BalancedLoader
from lbtrain.outputs import atomic_write_bytes
from lbtrain.parallel.checks import require_communicator

__all__ = ["TrainState"]

FORMAT = "lbtrain-train-state-1"


class TrainState:
    """The model, optimizer (and schedule) and the loader's place in the global batches.

    Args:
        model: the model (the module inside `BalancedDataParallel`, or the wrapper).
        optimizer: its optimizer.
        loader: this rank's `balanced_loader`; its global batch and seed must be the ones
            saved (its plan and world may differ).
        comm: the job's communicator; rank 0 reads and writes the file, every rank gets its
            contents, so no shared file system is needed.
        scheduler: a learning-rate schedule to save and restore too, if any.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: BalancedLoader,
        comm: Communicator,
        scheduler: Any = None,
    ) -> None:
        # Checked now: a wrong one failed only at the first save, mid-run, as AttributeError.
        wanted = (
            ("model", model, nn.Module, "the model you train (BalancedDataParallel or plain)"),
            ("optimizer", optimizer, torch.optim.Optimizer, "its torch.optim optimizer"),
            ("loader", loader, BalancedLoader, "this rank's lbtrain.balanced_loader(...)"),
        )
        for name, value, kind, what in wanted:
            if not isinstance(value, kind):
                raise TypeError(f"{name}={value!r:.60} is not {kind.__name__}: pass {what}")
        require_communicator(comm)
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.comm, self.scheduler = comm, scheduler

    def _position(self) -> tuple[int, int]:
        """(epoch, step) of the next update: after the latest batch handed out."""
        loader = self.loader
        if loader.batches_served == 0:
            return loader.batch_sampler.epoch, loader.batch_sampler.first_step
        if loader.step + 1 >= len(loader):
            return loader.epoch + 1, 0
        return loader.epoch, loader.step + 1

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state after the update of the latest batch; collective, rank 0 writes
        (atomically: a crash never leaves a torn file; a failed write stops every rank with
        one line naming `path`)."""
        epoch, step = self._position()

        def write() -> None:
            sampler = self.loader.batch_sampler
            state = {
                "format": FORMAT,
                "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(),
                "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
                "epoch": epoch,
                "step": step,
                "global_batch": self.loader.plan.global_batch_size,
                "seed": sampler.seed,
                "world_size": self.comm.size,
                # What else fixes the global batches: restored into a loader over another
                # dataset, the step would land in another permutation.
                "samples": sampler.num_samples,
                "shuffle": sampler.shuffle,
                "drop_last": sampler.drop_last,
            }
            buffer = io.BytesIO()
            torch.save(state, buffer)
            atomic_write_bytes(path, buffer.getvalue())

        # Collective: every rank waits for the file, and learns of a failed write.
        write_on_root(self.comm, "path", path, write)

    def restore(self, path: str | os.PathLike[str]) -> int:
        """Load `path` if it exists and place the loader at its next step; collective.

        Returns:
            The epoch to continue (0 when there is no file: a fresh start).

        Raises:
            ValueError: on every rank, when the file is not a TrainState's, or was saved with
                another global batch or seed (the global batches would not be the same).
        """
        state = self.comm.bcast(self._read(path) if self.comm.rank == 0 else None, root=0)
        if isinstance(state, str):
            raise ValueError(state)
        if state is None:
            return 0
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.loader.set_epoch(state["epoch"])
        if state["step"]:
            self.loader.start_at(state["step"])
        return int(state["epoch"])

    def _read(self, path: str | os.PathLike[str]) -> dict[str, Any] | str | None:
        """The saved state, None when there is none, or one line saying what is wrong."""
        state = _read(path)
        if isinstance(state, dict):
            return self._mismatch(state, path) or state
        return state

    def _mismatch(self, state: dict[str, Any], path: str | os.PathLike[str]) -> str | None:
        """Why `state` cannot continue this loop, or None."""
        sampler = self.loader.batch_sampler
        ours = (self.loader.plan.global_batch_size, sampler.seed)
        theirs = (state.get("global_batch"), state.get("seed"))
        if ours != theirs:
            return (
                f"{str(path)!r} was saved with global batch {theirs[0]} and seed {theirs[1]}, "
                f"this loader has {ours[0]} and {ours[1]}: the global batches would differ; "
                "build the loader with the saved ones"
            )
        # Files saved before these were recorded lack them: checked where present.
        for key, value in (("samples", sampler.num_samples), ("shuffle", sampler.shuffle),
                           ("drop_last", sampler.drop_last)):  # fmt: skip
            if key in state and state[key] != value:
                saved = (
                    f"a dataset of {state[key]!r}" if key == "samples" else f"{key}={state[key]!r}"
                )
                return (
                    f"{str(path)!r} was saved with {saved}, this loader has {value!r}: the "
                    "global batches would differ; build the loader over the saved dataset, "
                    "as it was"
                )
        return None


def _read(path: str | os.PathLike[str]) -> dict[str, Any] | str | None:
    """The saved state, None when there is none, or one line saying what is wrong."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a damaged or foreign file: one line, on every rank
        return f"{str(path)!r} cannot be read as a TrainState ({exc}); remove it or name another"
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return f"{str(path)!r} is not a TrainState file; name one TrainState.save wrote"
    return state
