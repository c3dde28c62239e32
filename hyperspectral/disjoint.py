"""A spatially disjoint split: no training patch contains a test pixel.

A random pixel split leaks: with 10% training pixels and 11x11 patches, 9,210 of Indian
Pines' 9,224 test pixels lie inside some training patch, and the literature (Liang et al.
2016) shows this inflates accuracy. Here each class gives its training pixels as one compact
slice of its own area, and every labelled pixel within ``patch_size // 2`` pixels (Chebyshev
distance) of a training pixel is left out of testing: the guard band.

Each class is sliced from the side, among a fan of directions, that keeps the most classes
tested, then its own test pixels, then the most test pixels overall; the smallest classes
choose first, as they have the fewest ways to fit. A class too small to keep any test pixel
beyond the guard band (Indian Pines' Oats at patch 25: 20 pixels in a 10x2 strip) still
trains, is not tested, and is named in a warning with the largest patch that would test it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

__all__ = ["DisjointParts", "disjoint_parts", "largest_testable_patch"]

# Directions tried per class; 16 covers the sides and the diagonals twice over.
DIRECTIONS = 16


@dataclass
class DisjointParts:
    """Training and test masks of a disjoint split, and the classes left untested.

    Args:
        train: (H, W) bool, training pixels.
        test: (H, W) bool, test pixels: labelled, not training, beyond the guard band.
        train_only: classes (1..K) with training pixels and no test pixels.
    """

    train: np.ndarray
    test: np.ndarray
    train_only: list[int]


def _near(train: np.ndarray, radius: int) -> np.ndarray:
    """Pixels within `radius` (Chebyshev) of a training pixel: inside some training patch."""
    if radius == 0:
        return train.copy()
    return ndimage.maximum_filter(train, size=2 * radius + 1, mode="constant")


def _slices(rows: np.ndarray, cols: np.ndarray, count: int, angles: np.ndarray) -> list[np.ndarray]:
    """For each direction, the `count` pixels furthest to that side (positions in rows/cols)."""
    picks = []
    for angle in angles:
        along = rows * math.sin(angle) + cols * math.cos(angle)
        picks.append(np.argsort(along, kind="stable")[:count])
    return picks


def _class_count(gt: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(gt[mask], minlength=k + 1)[1:]


def disjoint_parts(gt: np.ndarray, train_ratio: float, patch_size: int, seed: int) -> DisjointParts:
    """The training and test masks (see the module's docstring); warns per untested class.

    Args:
        gt: (H, W) labels, 0 = unlabelled.
        train_ratio: share of each class's pixels used for training, in (0, 1); every class
            gives at least one.
        patch_size: the odd patch size the model will use; the guard band is half of it.
        seed: seed of the fan of directions.
    """
    radius = patch_size // 2
    k = int(gt.max(initial=0))
    labelled = gt > 0
    totals = np.bincount(gt.ravel(), minlength=k + 1)[1:]
    rng = np.random.default_rng(seed)
    angles = rng.uniform(0, 2 * math.pi) + 2 * math.pi * np.arange(DIRECTIONS) / DIRECTIONS
    train = np.zeros(gt.shape, dtype=bool)
    present = [c for c in range(1, k + 1) if totals[c - 1]]
    for c in sorted(present, key=lambda c: (totals[c - 1], c)):
        rows, cols = np.nonzero(gt == c)
        count = min(rows.size, max(1, round(train_ratio * rows.size)))
        best, best_score = None, None
        for pick in _slices(rows, cols, count, angles):
            candidate = train.copy()
            candidate[rows[pick], cols[pick]] = True
            tested = _class_count(gt, labelled & ~_near(candidate, radius), k)
            score = (int((tested > 0).sum()), int(tested[c - 1] > 0), int(tested.sum()))
            if best_score is None or score > best_score:
                best, best_score = candidate, score
        train = best
    test = labelled & ~_near(train, radius)
    tested = _class_count(gt, test, k)
    train_only = [c for c in present if tested[c - 1] == 0]
    for c in train_only:
        largest = largest_testable_patch(gt == c, train_ratio)
        fix = (
            f"a --patch-size of {largest} or less would test it"
            if largest
            else "no patch size can test it"
        )
        warnings.warn(
            f"disjoint split: class {c} ({totals[c - 1]} pixels) lies within {radius} pixels "
            f"of its own training pixels at patch {patch_size}: it trains on "
            f"{int(_class_count(gt, train, k)[c - 1])} and is not tested (OA and AA leave it "
            f"out); {fix}",
            stacklevel=2,
        )
    return DisjointParts(train, test, train_only)


def largest_testable_patch(region: np.ndarray, train_ratio: float) -> int | None:
    """The largest odd patch at which a class alone keeps a test pixel; None if none does.

    Its training slice is cut as in `disjoint_parts`, from the side that leaves a pixel
    furthest (Chebyshev) from it.
    """
    rows, cols = np.nonzero(region)
    count = min(rows.size, max(1, round(train_ratio * rows.size)))
    if count >= rows.size:
        return None
    # Distances within the class's bounding box only: memory and time grow with its area.
    rows, cols = rows - rows.min(), cols - cols.min()
    box = (int(rows.max()) + 1, int(cols.max()) + 1)
    angles = 2 * math.pi * np.arange(DIRECTIONS) / DIRECTIONS
    furthest = 0
    for pick in _slices(rows, cols, count, angles):
        outside = np.ones(box, dtype=bool)
        outside[rows[pick], cols[pick]] = False
        distance = ndimage.distance_transform_cdt(outside, metric="chessboard")
        furthest = max(furthest, int(distance[rows, cols].max()))
    # A pixel at distance d is outside a guard band of radius d - 1: patch 2(d - 1) + 1.
    return 2 * furthest - 1 if furthest >= 1 else None
