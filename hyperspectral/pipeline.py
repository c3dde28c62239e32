"""The data side of a run: scene names, the split, leak-free preprocessing and patch datasets.

Used by the lbtrain adapter (:mod:`hyperspectral.workload`); it does not import lbtrain.
Everything here is a pure function of the scene, the options and the seed, so every rank
that calls it gets the same split, the same fitted transform and the same datasets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .datasets import SCENES, Scene
from .patches import PatchDataset, pad_cube
from .preprocess import Preprocessor, fit_preprocessor
from .splits import Split, load_split, make_split

__all__ = [
    "DATASET_NAMES",
    "Prepared",
    "canonical_scene",
    "missing_classes",
    "prepare",
    "split_scene",
]

# The spelling shown to users, then the registry name that `get_scene` takes.
DATASET_NAMES: dict[str, str] = {
    "indian_pines": "IndianPines",
    "pavia_u": "PaviaU",
    "salinas": "Salinas",
    "pavia_c": "PaviaC",
    "ksc": "KSC",
    "botswana": "Botswana",
    "synthetic": "synthetic",
}


def _squash(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in "_- ")


_BY_SQUASHED = {_squash(k): v for k, v in DATASET_NAMES.items()}
_BY_SQUASHED.update({_squash(name): name for name in SCENES})


def canonical_scene(name: str) -> str | None:
    """The registry name of a scene written in any case, with or without ``_`` or ``-``.

    ``indian_pines``, ``IndianPines`` and ``indianpines`` all give ``"IndianPines"``;
    ``"synthetic"`` stays ``"synthetic"``. Returns ``None`` for an unknown name.
    """
    return _BY_SQUASHED.get(_squash(name))


def split_scene(
    scene: Scene,
    kind: str = "random",
    *,
    train_ratio: float | None = 0.1,
    per_class: int | None = None,
    split_file: str | None = None,
    patch_size: int = 1,
    seed: int = 0,
) -> Split:
    """Make the seeded split of ``scene``, or read ``split_file`` (which then wins over ``kind``).

    Raises:
        ValueError: bad split parameters, or a split file that does not fit the scene or
            (disjoint) was made for a smaller patch than ``patch_size``.
    """
    if split_file:
        split = load_split(split_file, scene.gt)
        # A disjoint split keeps train and test apart by half *its* patch; a bigger patch
        # would let training patches cover test pixels again.
        made_for = split.meta.get("patch_size")
        if split.meta.get("kind") == "disjoint" and made_for and patch_size > made_for:
            raise ValueError(
                f"--split-file {split_file}: this disjoint split was made for patch "
                f"{made_for}, but --patch-size is {patch_size}, so training patches would "
                f"overlap test pixels; use --patch-size {made_for} or less, or make a new split"
            )
        return split
    return make_split(
        kind,
        scene.gt,
        train_ratio=train_ratio,
        per_class=per_class,
        patch_size=patch_size,
        seed=seed,
    )


def missing_classes(split: Split, gt: np.ndarray) -> tuple[list[int], list[int]]:
    """Classes (1..K) that have labelled pixels in ``gt`` but none in train, or none in test.

    Returns:
        ``(no_train, no_test)``, two sorted lists of class labels.
    """
    flat = gt.ravel()
    k = int(flat.max(initial=0))
    present = np.bincount(flat, minlength=k + 1)[1:] > 0
    in_train = np.bincount(flat[split.train], minlength=k + 1)[1:] > 0
    in_test = np.bincount(flat[split.test], minlength=k + 1)[1:] > 0
    labels = np.arange(1, k + 1)
    return (
        [int(c) for c in labels[present & ~in_train]],
        [int(c) for c in labels[present & ~in_test]],
    )


@dataclass
class Prepared:
    """A scene made ready for patch classification.

    Args:
        split: the training and test pixels.
        preprocessor: standardisation (and PCA) fitted on the training pixels only.
        padded: the transformed, zero-padded (C, H + 2r, W + 2r) cube every dataset shares.
        patch_size: odd patch edge P.
        shape: scene (H, W).
        train_set: patches of the training pixels, with their classes.
        test_set: patches of the test pixels, with their classes.
    """

    split: Split
    preprocessor: Preprocessor
    padded: torch.Tensor
    patch_size: int
    shape: tuple[int, int]
    train_set: PatchDataset
    test_set: PatchDataset

    @property
    def bands(self) -> int:
        """Channels C of one patch (after PCA, if any)."""
        return self.preprocessor.out_bands

    def predict_set(self) -> PatchDataset:
        """Every pixel of the scene in row-major order (targets are -1), for the map."""
        h, w = self.shape
        return PatchDataset(self.padded, np.arange(h * w), self.patch_size, w)


def prepare(
    scene: Scene, split: Split, patch_size: int, pca: int | None, *, seed: int = 0
) -> Prepared:
    """Fit preprocessing on the training pixels, pad the transformed cube, cut the datasets.

    Args:
        scene: the loaded scene.
        split: its training and test pixels.
        patch_size: odd patch edge P.
        pca: PCA components fitted on training pixels; ``None`` or 0 keeps the bands.
        seed: random state of the PCA solver.
    """
    prep = fit_preprocessor(scene.cube, split.train, pca, seed=seed)
    padded = pad_cube(prep.transform(scene.cube), patch_size)
    width = scene.shape[1]
    return Prepared(
        split=split,
        preprocessor=prep,
        padded=padded,
        patch_size=patch_size,
        shape=scene.shape,
        train_set=PatchDataset(padded, split.train, patch_size, width, scene.gt),
        test_set=PatchDataset(padded, split.test, patch_size, width, scene.gt),
    )
