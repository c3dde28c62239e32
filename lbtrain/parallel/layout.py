"""One model on every rank: check that the ranks built the same one, then copy rank 0's.

Collective. A rank whose model differs by one layer would otherwise meet the others in an
allreduce of the wrong size (an MPI error naming no layer) or, worse, of the same size by
chance (silent garbage). Every rank learns the first difference and raises it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from lbtrain.collective import CollectiveError
from lbtrain.comm import Communicator
from lbtrain.parallel.batchnorm import SyncBatchNorm

__all__ = ["ModelMismatch", "broadcast_tensors", "check_same_model", "copy_buffers", "model_layout"]

Entry = tuple[str, str, tuple[int, ...], str, bool]


class ModelMismatch(CollectiveError, ValueError):
    """The ranks built different models; raised on every rank with the first difference."""


def model_layout(model: nn.Module) -> list[Entry]:
    """(kind, name, shape, dtype, trainable) of every parameter and buffer, in order.

    Devices are left out on purpose: a CPU rank and a GPU rank hold the same model.
    """
    layout: list[Entry] = [
        ("parameter", name, tuple(p.shape), str(p.dtype), p.requires_grad)
        for name, p in model.named_parameters()
    ]
    layout += [
        ("buffer", name, tuple(b.shape), str(b.dtype), False) for name, b in model.named_buffers()
    ]
    return layout


def _describe(entry: Entry) -> str:
    kind, _, shape, dtype, trainable = entry
    frozen = "" if trainable or kind == "buffer" else ", frozen"
    return f"shape {tuple(shape)}, {dtype.removeprefix('torch.')}{frozen}"


def _first_difference(rank: int, mine: Sequence[Entry], root: Sequence[Entry]) -> str | None:
    for index in range(max(len(mine), len(root))):
        a = mine[index] if index < len(mine) else None
        b = root[index] if index < len(root) else None
        if a == b:
            continue
        if a is None:
            return f"rank {rank} has no {b[0]} {b[1]!r}, which rank 0 has"  # type: ignore[index]
        if b is None:
            return f"rank {rank} has {a[0]} {a[1]!r}, which rank 0 lacks"
        if a[:2] != b[:2]:
            return f"rank {rank}'s {a[0]} #{index} is {a[1]!r} where rank 0's is {b[0]} {b[1]!r}"
        return f"{a[0]} {a[1]!r} is {_describe(a)} on rank {rank} but {_describe(b)} on rank 0"
    return None


def check_same_model(model: nn.Module, comm: Communicator) -> None:
    """Raise ModelMismatch on every rank unless all ranks' models have one layout; collective.

    One small allgather of a digest when the models agree; the layouts themselves only when
    they do not.
    """
    layout = model_layout(model)
    digest = hashlib.sha256(repr(layout).encode()).hexdigest()
    if len(set(comm.allgather(digest))) == 1:
        return
    layouts = comm.allgather(layout)
    for rank in range(1, comm.size):
        difference = _first_difference(rank, layouts[rank], layouts[0])
        if difference is not None:
            raise ModelMismatch(
                f"the ranks built different models: {difference}; build the same model on "
                "every rank (same layers, sizes and dtypes) before wrapping it"
            )


def broadcast_tensors(tensors: Iterable[torch.Tensor], comm: Communicator, root: int = 0) -> None:
    """Overwrite `tensors` on every rank with `root`'s, one flat message per dtype.

    Collective; every rank passes tensors of the same layout (devices may differ).
    """
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        if tensor.numel():
            groups.setdefault(tensor.dtype, []).append(tensor)
    # The same order on every rank, whatever devices hold the tensors.
    for _, group in sorted(groups.items(), key=lambda item: str(item[0])):
        device = group[0].device
        with torch.no_grad():
            flat = torch.cat([t.detach().reshape(-1).to(device) for t in group])
            comm.broadcast_(flat, root=root)
            offset = 0
            for tensor in group:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()


def copy_buffers(model: nn.Module, comm: Communicator, batch_sizes: Sequence[int]) -> None:
    """Copy the buffers a step leaves different across ranks from the rank of the largest
    batch (collective): all but synchronised BatchNorm's, which agree by construction."""
    buffers: list[torch.Tensor] = []
    for m in model.modules():
        if not (isinstance(m, SyncBatchNorm) and m.comm is not None):
            buffers.extend(m.buffers(recurse=False))
    if buffers:
        root = max(range(len(batch_sizes)), key=lambda r: (batch_sizes[r], -r))
        broadcast_tensors(buffers, comm, root=root)
