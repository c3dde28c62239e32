"""A spatially disjoint split: no training patch contains a test pixel.

A random pixel split leaks: with 10% training pixels and 11x11 patches, 9,210 of Indian
Pines' 9,224 test pixels lie inside some training patch, and the literature (Liang et al.
2016) shows this inflates accuracy. Here each class gives its training pixels as compact
slices of its fields (its 8-connected regions), each field in proportion to its size, and
every labelled pixel within ``patch_size // 2`` pixels (Chebyshev distance) of a training
pixel is left out of testing: the guard band.

Training on every field matters: a class's fields differ (soil, planting, lighting), and one
slice of one field taught a model so little of the others that a spectral SVM reached 28% OA
on Indian Pines. Each field is sliced from the side, among a fan of directions, that keeps
the most classes tested, then its own class, then the most test pixels overall; the smallest
classes choose first, as they have the fewest ways to fit. A class too small to keep any test pixel
beyond the guard band (Indian Pines' Oats at patch 25: 20 pixels in a 10x2 strip) still
trains, is not tested, and is named in a warning with the largest patch that would test it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

# scipy.ndimage is imported by the functions that use it: it takes 0.2 s, and every `lbtrain`
# start imports this module (the command line lists the hyperspectral workload's options).

__all__ = ["DisjointParts", "disjoint_parts", "largest_testable_patch"]

# Directions tried per class; 16 covers the sides and the diagonals twice over.
DIRECTIONS = 16

# Whether a class that slices of every field leave untested is tried as one slice of the
# whole class (tests turn it off to show what it rescues).
ONE_SLICE_FALLBACK = True


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
    from scipy import ndimage

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


def _field_shares(sizes: np.ndarray, count: int) -> np.ndarray:
    """`count` training pixels shared among a class's fields in proportion to their sizes
    (largest remainders; with fewer pixels than fields, the largest fields get one each)."""
    exact = count * sizes / sizes.sum()
    shares = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - shares), kind="stable")
    shares[order[: count - int(shares.sum())]] += 1
    return shares


class _Guard:
    """The training mask, what lies within the guard band of it, and the test pixels left
    per class; a candidate slice is scored on the window it can change, not the scene."""

    def __init__(self, gt: np.ndarray, radius: int) -> None:
        self.gt, self.radius, self.k = gt, radius, int(gt.max(initial=0))
        self.train = np.zeros(gt.shape, dtype=bool)
        self.near = np.zeros(gt.shape, dtype=bool)
        self.tested = _class_count(gt, gt > 0, self.k)

    def _window(self, rows: np.ndarray, cols: np.ndarray) -> tuple[slice, slice]:
        r, (h, w) = self.radius, self.gt.shape
        return (
            slice(max(0, int(rows.min()) - r), min(h, int(rows.max()) + r + 1)),
            slice(max(0, int(cols.min()) - r), min(w, int(cols.max()) + r + 1)),
        )

    def lost(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, tuple, np.ndarray]:
        """Test pixels per class that a slice at (rows, cols) would move into the guard."""
        window = self._window(rows, cols)
        mark = np.zeros(self.gt[window].shape, dtype=bool)
        mark[rows - window[0].start, cols - window[1].start] = True
        covered = _near(mark, self.radius) & ~self.near[window] & (self.gt[window] > 0)
        return _class_count(self.gt[window], covered, self.k), window, covered

    def copy(self) -> _Guard:
        other = _Guard.__new__(_Guard)
        other.gt, other.radius, other.k = self.gt, self.radius, self.k
        other.train, other.near, other.tested = self.train.copy(), self.near.copy(), self.tested
        return other

    def add(self, rows: np.ndarray, cols: np.ndarray) -> None:
        lost, window, covered = self.lost(rows, cols)
        self.train[rows, cols] = True
        self.near[window] |= covered
        self.tested = self.tested - lost


def _slice_fields(
    guard: _Guard, fields: np.ndarray, n: int, c: int, count: int, angles: np.ndarray
) -> None:
    """Add class `c`'s `count` training pixels to `guard`: one slice per field (labels 1..n
    of `fields`), each from the side that leaves the most tested (see the module docstring)."""
    from scipy import ndimage

    sizes = np.bincount(fields.ravel(), minlength=n + 1)[1:]
    shares = _field_shares(sizes, count)
    boxes = ndimage.find_objects(fields, max_label=n)  # each field's pixels from its box
    for field in np.argsort(-sizes, kind="stable"):
        if shares[field] == 0:
            continue
        box = boxes[field]
        rows, cols = np.nonzero(fields[box] == field + 1)
        rows, cols = rows + box[0].start, cols + box[1].start
        best, best_score = None, None
        for pick in _slices(rows, cols, int(shares[field]), angles):
            score = _score(guard.tested - guard.lost(rows[pick], cols[pick])[0], c)
            if best_score is None or score > best_score:
                best, best_score = pick, score
        guard.add(rows[best], cols[best])


def _score(tested: np.ndarray, c: int) -> tuple[int, int, int]:
    """Classes still tested, then whether class `c` is, then test pixels: higher is better."""
    return int((tested > 0).sum()), int(tested[c - 1] > 0), int(tested.sum())


def _train_count(pixels: int, train_ratio: float) -> int:
    """round(ratio x pixels) training pixels, at least one, and one fewer than all when the
    class has two or more (as the random split gives): a class is never all training."""
    return min(max(1, round(train_ratio * pixels)), max(1, pixels - 1))


def disjoint_parts(gt: np.ndarray, train_ratio: float, patch_size: int, seed: int) -> DisjointParts:
    """The training and test masks (see the module's docstring); warns per untested class.

    Args:
        gt: (H, W) labels, 0 = unlabelled.
        train_ratio: share of each class's pixels used for training, in (0, 1); every class
            gives at least one.
        patch_size: the odd patch size the model will use; the guard band is half of it.
        seed: seed of the fan of directions.
    """
    parts = _parts(gt, train_ratio, patch_size, seed)
    k = int(gt.max(initial=0))
    totals = np.bincount(gt.ravel(), minlength=k + 1)[1:]
    trained = _class_count(gt, parts.train, k)
    # No test pixel at all is refused by the caller: no suggestion is worth the search then.
    untested = parts.train_only if parts.test.any() else []
    testing = _testing_patches(gt, train_ratio, patch_size, seed, untested)
    for c in parts.train_only:
        smaller = testing.get(c)
        fix = (
            f"--patch-size {smaller} would test it (the largest smaller patch that does)"
            if smaller
            else "no smaller patch size tests it"
        )
        warnings.warn(
            f"disjoint split: class {c} ({totals[c - 1]} pixel{'s' if totals[c - 1] > 1 else ''})"
            f" lies within {patch_size // 2} pixels of training pixels (its own or another "
            f"class's) at patch {patch_size}: it trains on {int(trained[c - 1])} and is not "
            f"tested (OA and AA leave it out); {fix}",
            stacklevel=2,
        )
    return parts


def _testing_patches(
    gt: np.ndarray, train_ratio: float, patch_size: int, seed: int, classes: list[int]
) -> dict[int, int]:
    """For each of `classes`, the largest odd patch below `patch_size` whose split tests it.

    Found by splitting again at each smaller patch (a split of a scene takes milliseconds):
    the guard band comes from every class's training pixels, and the slices chosen change
    with the patch, so no bound on the class alone is reliable.
    """
    found: dict[int, int] = {}
    left = set(classes)
    for patch in range(patch_size - 2, 0, -2):
        if not left:
            break
        untested = set(_parts(gt, train_ratio, patch, seed).train_only)
        for c in sorted(left - untested):
            found[c] = patch
        left &= untested
    return found


def _parts(gt: np.ndarray, train_ratio: float, patch_size: int, seed: int) -> DisjointParts:
    """The split of `disjoint_parts`, without a word."""
    from scipy import ndimage

    radius = patch_size // 2
    k = int(gt.max(initial=0))
    totals = np.bincount(gt.ravel(), minlength=k + 1)[1:]
    rng = np.random.default_rng(seed)
    angles = rng.uniform(0, 2 * math.pi) + 2 * math.pi * np.arange(DIRECTIONS) / DIRECTIONS
    guard = _Guard(gt, radius)
    present = [c for c in range(1, k + 1) if totals[c - 1]]
    for c in sorted(present, key=lambda c: (totals[c - 1], c)):
        count = _train_count(int(totals[c - 1]), train_ratio)
        fields, n = ndimage.label(gt == c, structure=np.ones((3, 3)))
        whole = guard.copy()
        _slice_fields(guard, fields, n, c, count, angles)
        if ONE_SLICE_FALLBACK and n > 1 and guard.tested[c - 1] == 0:
            # Slices of every field left no test pixel of the class: one slice of the whole
            # class may (its far fields stay clear), as `largest_testable_patch` assumes.
            # Kept only if it does better.
            _slice_fields(whole, (gt == c).astype(np.int64), 1, c, count, angles)
            if _score(whole.tested, c) > _score(guard.tested, c):
                guard = whole
    train = guard.train
    test = (gt > 0) & ~_near(train, radius)
    tested = _class_count(gt, test, k)
    train_only = [c for c in present if tested[c - 1] == 0]
    return DisjointParts(train, test, train_only)


def largest_testable_patch(
    region: np.ndarray, train_ratio: float, angles: np.ndarray | None = None
) -> int | None:
    """The largest odd patch at which a class alone keeps a test pixel; None if none does.

    The class is taken as one field (as a class too small to test is): its training slice
    cut as in `disjoint_parts`, from the side, of `angles` (the split's fan; default one
    from 0), that leaves a pixel furthest (Chebyshev) from it.
    """
    from scipy import ndimage

    rows, cols = np.nonzero(region)
    count = _train_count(rows.size, train_ratio)
    if count >= rows.size:
        return None
    # Distances within the class's bounding box only: memory and time grow with its area.
    rows, cols = rows - rows.min(), cols - cols.min()
    box = (int(rows.max()) + 1, int(cols.max()) + 1)
    if angles is None:
        angles = 2 * math.pi * np.arange(DIRECTIONS) / DIRECTIONS
    furthest = 0
    for pick in _slices(rows, cols, count, angles):
        outside = np.ones(box, dtype=bool)
        outside[rows[pick], cols[pick]] = False
        distance = ndimage.distance_transform_cdt(outside, metric="chessboard")
        furthest = max(furthest, int(distance[rows, cols].max()))
    # A pixel at distance d is outside a guard band of radius d - 1: patch 2(d - 1) + 1.
    return 2 * furthest - 1 if furthest >= 1 else None
