"""A lazy patch dataset over one padded cube."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["MemberBatches", "PatchDataset", "pad_cube"]


def pad_cube(cube: np.ndarray, patch_size: int) -> torch.Tensor:
    """Return the (C, H + 2r, W + 2r) zero-padded, channels-first copy of an (H, W, C) cube.

    Zero padding is used: after standardisation zero is the training mean of every band, so
    border patches see a neutral value instead of mirrored copies of real (possibly test)
    pixels. HybridSN's reference code pads with zeros too.
    """
    if patch_size < 1 or patch_size % 2 == 0:
        raise ValueError(f"patch_size={patch_size} must be a positive odd number, e.g. 25")
    r = patch_size // 2
    chw = torch.from_numpy(np.ascontiguousarray(cube.transpose(2, 0, 1), dtype=np.float32))
    return torch.nn.functional.pad(chw, (r, r, r, r)).contiguous()


class PatchDataset(Dataset):
    """Patches centred on chosen pixels, cut on demand from one shared padded cube.

    Only the padded cube (C x (H+2r) x (W+2r)) is stored; a patch is sliced when asked for,
    so memory does not grow with the number of pixels (the N x P x P x C array that
    HybridSN-style code builds does not fit for large scenes). Border pixels are kept and
    see zeros outside the image.

    Args:
        padded: cube from :func:`pad_cube`, shared between datasets of one scene.
        indices: flat pixel indices ``row * W + col``.
        patch_size: odd patch edge P, the one used for ``padded``.
        width: scene width W, to turn flat indices into (row, col).
        labels: optional (H, W) ground truth (0 unlabelled); items then carry ``label - 1``.

    Items are ``(patch, target)``: ``patch`` is a ``float32`` tensor (C, P, P) and
    ``target`` an ``int64`` class index in 0..K-1 (``-1`` when no labels were given).
    """

    def __init__(
        self,
        padded: torch.Tensor,
        indices: np.ndarray,
        patch_size: int,
        width: int,
        labels: np.ndarray | None = None,
    ) -> None:
        r = patch_size // 2
        height = padded.shape[1] - 2 * r
        if padded.shape[2] - 2 * r != width:
            raise ValueError(f"width={width} does not match the padded cube {tuple(padded.shape)}")
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= height * width):
            raise ValueError(f"pixel indices must be in [0, {height * width}), got out-of-range")
        # Contiguous, as pad_cube makes it (then this is the caller's cube, shared): `batch`
        # reads it as flattened planes, a view.
        self.padded = padded.contiguous()
        self.patch_size = patch_size
        self.width = width
        # A patch's offsets in a flattened plane from its top-left corner.
        offsets = torch.arange(patch_size, device=padded.device)
        self._window = offsets[:, None] * padded.shape[2] + offsets[None, :]
        self.indices = torch.from_numpy(indices)
        if labels is not None:
            targets = labels.ravel()[indices].astype(np.int64) - 1
        else:
            targets = np.full(indices.shape, -1, dtype=np.int64)
        self.targets = torch.from_numpy(targets)

    def __len__(self) -> int:
        return int(self.indices.numel())

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row, col = divmod(int(self.indices[i]), self.width)
        p = self.patch_size
        # The padded cube is offset by r, so the patch centred at (row, col) starts there.
        # clone: callers may augment in place, and the cube is shared by every item.
        return self.padded[:, row : row + p, col : col + p].clone(), self.targets[i]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole batch ``(x, y)`` at ``indices``, as :meth:`batch` gives it.

        torch's DataLoader calls this with a batch sampler's list of indices instead of
        calling ``__getitem__`` once per patch, so patches are cut in one indexing call.
        The result is already a batch: load with ``collate_fn=lbtrain.workloads.keep_batch``
        (any collate that returns its argument), not the default collate.
        """
        return self.batch(torch.as_tensor(indices, dtype=torch.int64))

    def batch(self, positions: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather items at ``positions`` into a (N, C, P, P) batch with one indexing call."""
        pos = torch.as_tensor(positions, dtype=torch.int64)
        flat = self.indices[pos]
        rows, cols = flat // self.width, flat % self.width
        # Each patch's top-left corner in the padded cube (offset by r, so the patch centred
        # at (row, col) starts there), as an index into a flattened plane. One index_select
        # over the planes is 3-6x faster on a CPU than indexing rows and columns as two
        # tensors (BENCHMARKS.md, "where a 2-rank step goes"), and gives the same values.
        channels, p = self.padded.shape[0], self.patch_size
        planes = self.padded.view(channels, -1)
        corners = (rows * self.padded.shape[2] + cols).to(self._window.device)
        taken = planes.index_select(1, (corners[:, None, None] + self._window).ravel())
        patches = taken.view(channels, len(pos), p, p)  # (C, N, P, P)
        return patches.permute(1, 0, 2, 3).contiguous(), self.targets[pos]


class MemberBatches(Dataset):
    """A training set read by each member of an ensemble in its own order.

    Item ``i`` is ``members`` patches stacked, (M, C, P, P), with their classes, (M,):
    member 0 reads sample ``i`` and member ``m`` sample ``order[m][i]``, a fixed
    permutation drawn from ``seed``. The sampler's permutation of an epoch, seen through a
    member's, is that member's own batch order: every member reads every sample once an
    epoch, and no two read the same batches. The items depend on the index alone, so any
    split of the global batch over ranks still draws the same samples (the multi-rank
    update stays exact).

    Args:
        base: the training patches.
        members: the ensemble's members (>= 2).
        seed: the run's seed (the same on every rank).
    """

    def __init__(self, base: PatchDataset, members: int, seed: int) -> None:
        if members < 2:
            raise ValueError(f"MemberBatches needs >= 2 members, got {members}")
        self.base = base
        rng = np.random.default_rng([seed, 7919])  # not the split's or the sampler's stream
        n = len(base)
        orders = [np.arange(n)] + [rng.permutation(n) for _ in range(members - 1)]
        self.orders = torch.from_numpy(np.stack(orders))  # (M, n)

    def __len__(self) -> int:
        return len(self.base)

    @property
    def indices(self) -> torch.Tensor:
        """The training pixels, as the base set holds them (member 0's order)."""
        return self.base.indices

    @property
    def targets(self) -> torch.Tensor:
        """Their classes, in the same order."""
        return self.base.targets

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([i])
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at ``indices``: (N, M, C, P, P) patches and (N, M) classes."""
        positions = torch.as_tensor(indices, dtype=torch.int64)
        parts = [self.base.batch(order[positions]) for order in self.orders]
        return torch.stack([x for x, _ in parts], 1), torch.stack([y for _, y in parts], 1)
