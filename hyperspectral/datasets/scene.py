"""The in-memory scene: image cube, ground truth and display metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Scene"]


@dataclass
class Scene:
    """A labelled hyperspectral image.

    Args:
        name: scene name.
        cube: ``float32`` array (H, W, B).
        gt: ``int64`` array (H, W); 0 means unlabelled, 1..K are classes.
        class_names: names of classes 1..K.
        rgb_bands: zero-based band indices for an RGB composite.
        source: where the data was read from (for logs and reports).
    """

    name: str
    cube: np.ndarray
    gt: np.ndarray
    class_names: tuple[str, ...]
    rgb_bands: tuple[int, int, int]
    source: str = ""

    @property
    def num_classes(self) -> int:
        """Number of classes, K."""
        return len(self.class_names)

    @property
    def bands(self) -> int:
        """Number of spectral bands, B."""
        return int(self.cube.shape[2])

    @property
    def shape(self) -> tuple[int, int]:
        """Spatial shape (H, W)."""
        return (int(self.gt.shape[0]), int(self.gt.shape[1]))

    def class_counts(self) -> np.ndarray:
        """Labelled pixels per class 1..K, as an array of length K."""
        return np.bincount(self.gt.ravel(), minlength=self.num_classes + 1)[1:]
