"""Per-band standardisation and optional PCA, fitted on training pixels only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Preprocessor", "fit_preprocessor"]


@dataclass
class Preprocessor:
    """A fitted spectral transform: standardise each band, then optionally project with PCA.

    Args:
        mean: per-band mean of the training pixels, shape (B,).
        std: per-band standard deviation of the training pixels, shape (B,).
        pca: a fitted ``sklearn.decomposition.PCA`` or ``None``.
    """

    mean: np.ndarray
    std: np.ndarray
    pca: object | None = None

    @property
    def out_bands(self) -> int:
        """Number of output channels."""
        return int(self.pca.n_components_) if self.pca is not None else int(self.mean.shape[0])

    def transform_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Transform an (N, B) array of spectra into (N, C) ``float32``."""
        out = (pixels.astype(np.float64) - self.mean) / self.std
        if self.pca is not None:
            out = self.pca.transform(out)
        return out.astype(np.float32)

    def transform(self, cube: np.ndarray, chunk_rows: int = 64) -> np.ndarray:
        """Transform a whole (H, W, B) cube into (H, W, C) ``float32``, a few rows at a time."""
        h, w, _ = cube.shape
        out = np.empty((h, w, self.out_bands), dtype=np.float32)
        # Chunking bounds the float64 temporaries on large scenes.
        for r in range(0, h, chunk_rows):
            block = cube[r : r + chunk_rows]
            out[r : r + chunk_rows] = self.transform_pixels(
                block.reshape(-1, block.shape[2])
            ).reshape(block.shape[0], w, -1)
        return out


def fit_preprocessor(
    cube: np.ndarray,
    train_indices: np.ndarray,
    pca_components: int | None = None,
    *,
    whiten: bool = True,
    seed: int = 0,
) -> Preprocessor:
    """Fit standardisation (and PCA) on the training pixels of ``cube`` only.

    Test pixels never enter a statistic, so evaluation stays honest even though the fitted
    transform is later applied to the whole cube.

    Args:
        cube: (H, W, B) image.
        train_indices: flat pixel indices (``row * W + col``) of the training pixels.
        pca_components: keep this many principal components; ``None`` or 0 disables PCA.
        whiten: scale components to unit variance (as HybridSN's reference code does).
        seed: random state for the PCA solver.

    Raises:
        ValueError: no training pixels, or more components than bands or training pixels.
    """
    train_indices = np.asarray(train_indices, dtype=np.int64)
    bands = cube.shape[2]
    if train_indices.size == 0:
        raise ValueError(
            "fit_preprocessor: train_indices is empty; the split has no training pixels"
        )
    pixels = cube.reshape(-1, bands)[train_indices].astype(np.float64)
    mean = pixels.mean(axis=0)
    std = pixels.std(axis=0)
    # Constant bands would divide by zero; leave them centred but unscaled.
    std = np.where(std > 1e-12, std, 1.0)
    pca = None
    if pca_components:
        limit = min(bands, train_indices.size)
        if not 0 < pca_components <= limit:
            raise ValueError(
                f"pca_components={pca_components} is out of range; use 1..{limit} "
                f"(bands={bands}, training pixels={train_indices.size}) or 0 to disable PCA"
            )
        from sklearn.decomposition import PCA

        pca = PCA(n_components=pca_components, whiten=whiten, random_state=seed)
        pca.fit((pixels - mean) / std)
    return Preprocessor(mean=mean, std=std, pca=pca)
