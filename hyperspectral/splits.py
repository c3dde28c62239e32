"""Seeded train/test splits of the labelled pixels, savable as ``.npz`` index files.

Indices are flat pixel indices ``row * W + col`` into the scene's ground truth.
"""

from __future__ import annotations

import hashlib
import json
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .disjoint import disjoint_parts

__all__ = [
    "Split",
    "SPLIT_KINDS",
    "random_split",
    "fixed_split",
    "disjoint_split",
    "make_split",
    "save_split",
    "load_split",
    "split_counts",
    "split_digest",
    "guard_note",
]

SPLIT_KINDS = ("random", "fixed", "disjoint")


@dataclass
class Split:
    """Training and test pixel indices plus how they were made.

    Args:
        train: sorted flat indices of training pixels.
        test: sorted flat indices of test pixels.
        shape: (H, W) of the ground truth the indices refer to.
        meta: kind, seed and parameters, for reproducibility.
        guard: sorted flat indices of labelled pixels left out of both (a disjoint split's
            guard band); empty for the other kinds.
    """

    train: np.ndarray
    test: np.ndarray
    shape: tuple[int, int]
    meta: dict[str, Any] = field(default_factory=dict)
    guard: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


def _classes(gt: np.ndarray) -> list[tuple[int, np.ndarray]]:
    flat = gt.ravel()
    return [(int(c), np.flatnonzero(flat == c)) for c in np.unique(flat) if c > 0]


def _finish(
    gt: np.ndarray, train: list[np.ndarray], test: list[np.ndarray], meta: dict[str, Any]
) -> Split:
    empty = np.empty(0, dtype=np.int64)
    return Split(
        train=np.sort(np.concatenate(train or [empty])).astype(np.int64),
        test=np.sort(np.concatenate(test or [empty])).astype(np.int64),
        shape=(int(gt.shape[0]), int(gt.shape[1])),
        meta=meta,
    )


def random_split(gt: np.ndarray, train_ratio: float, seed: int = 0) -> Split:
    """Stratified random split: each class contributes ``round(ratio * n)`` training pixels.

    Every class keeps at least one training and, when it has two pixels, one test pixel.
    """
    if not 0.0 < train_ratio < 1.0:
        raise ValueError(f"train_ratio={train_ratio} must be in (0, 1), e.g. 0.1 for 10%")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for _c, idx in _classes(gt):
        idx = rng.permutation(idx)
        n_train = min(max(1, int(round(train_ratio * idx.size))), max(1, idx.size - 1))
        train.append(idx[:n_train])
        test.append(idx[n_train:])
    return _finish(gt, train, test, {"kind": "random", "train_ratio": train_ratio, "seed": seed})


def fixed_split(gt: np.ndarray, per_class: int, seed: int = 0) -> Split:
    """``per_class`` random training pixels per class, the rest for testing.

    Classes with at most ``per_class`` pixels are capped to half their pixels, with a
    warning, so that every class still has test pixels.
    """
    if per_class < 1:
        raise ValueError(f"per_class={per_class} must be >= 1")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c, idx in _classes(gt):
        idx = rng.permutation(idx)
        n_train = per_class
        if idx.size <= per_class:
            n_train = max(1, idx.size // 2)
            warnings.warn(
                f"class {c} has only {idx.size} labelled pixels, fewer than per_class={per_class}; "
                f"using {n_train} for training and the rest for testing",
                stacklevel=2,
            )
        train.append(idx[:n_train])
        test.append(idx[n_train:])
    return _finish(gt, train, test, {"kind": "fixed", "per_class": per_class, "seed": seed})


def disjoint_split(gt: np.ndarray, train_ratio: float, patch_size: int, seed: int = 0) -> Split:
    """Spatially disjoint split: no training patch contains a test pixel.

    Each class gives ``round(train_ratio * n)`` pixels (at least one) as a compact slice of
    its area; labelled pixels within ``patch_size // 2`` (Chebyshev) of any training pixel
    are neither trained nor tested (the guard band). A class too small to keep a test pixel
    beyond it trains only, with a warning naming it (hyperspectral/disjoint.py says how).

    Args:
        gt: (H, W) labels, 0 = unlabelled.
        train_ratio: share of each class used for training, in (0, 1).
        patch_size: the odd patch size the model will use.
        seed: random seed of the slicing directions.

    Raises:
        ValueError: bad arguments, or a guard band that leaves no test pixel at all.
    """
    if not 0.0 < train_ratio < 1.0:
        raise ValueError(f"train_ratio={train_ratio} must be in (0, 1), e.g. 0.1 for 10%")
    if patch_size < 1:
        raise ValueError(f"patch_size={patch_size} must be >= 1")
    parts = disjoint_parts(gt, train_ratio, patch_size, seed)
    if not parts.test.any():
        raise ValueError(
            f"the disjoint split at patch {patch_size} leaves no test pixels: every labelled "
            f"pixel lies within {patch_size // 2} pixels of a training pixel; use a smaller "
            "--patch-size or --train-ratio, or --split random"
        )
    guard = (gt > 0) & ~parts.train & ~parts.test
    meta = {
        "kind": "disjoint",
        "train_ratio": train_ratio,
        "patch_size": patch_size,
        "guard_radius": patch_size // 2,
        "train_only": parts.train_only,
        "seed": seed,
    }
    split = _finish(gt, [np.flatnonzero(parts.train)], [np.flatnonzero(parts.test)], meta)
    split.guard = np.flatnonzero(guard).astype(np.int64)
    return split


def make_split(
    kind: str,
    gt: np.ndarray,
    *,
    train_ratio: float | None = None,
    per_class: int | None = None,
    patch_size: int = 1,
    seed: int = 0,
) -> Split:
    """Dispatch to the split named ``kind`` (one of :data:`SPLIT_KINDS`)."""
    if kind == "fixed":
        if per_class is None:
            raise ValueError("split 'fixed' needs per_class (--train-per-class)")
        return fixed_split(gt, per_class, seed)
    if train_ratio is None:
        raise ValueError(f"split {kind!r} needs train_ratio (--train-ratio)")
    if kind == "random":
        return random_split(gt, train_ratio, seed)
    if kind == "disjoint":
        return disjoint_split(gt, train_ratio, patch_size, seed)
    raise ValueError(f"unknown split kind {kind!r}; choose one of {', '.join(SPLIT_KINDS)}")


def split_counts(split: Split, gt: np.ndarray, names: tuple[str, ...]) -> dict[str, Any]:
    """The split's settings and, per class, its pixels in train, test and the guard band."""
    flat = gt.ravel()
    k = len(names)

    def per_class(idx: np.ndarray) -> list[int]:
        return [int(n) for n in np.bincount(flat[idx], minlength=k + 1)[1 : k + 1]]

    totals = per_class(np.flatnonzero(flat > 0))
    train, test, guard = per_class(split.train), per_class(split.test), per_class(split.guard)
    classes = [
        {"class": c + 1, "name": names[c], "pixels": totals[c], "train": train[c],
         "test": test[c], "guard": guard[c]}
        for c in range(k)
    ]  # fmt: skip
    return {
        **split.meta,
        "train": int(split.train.size),
        "test": int(split.test.size),
        "guard": int(split.guard.size),
        "classes": classes,
    }


def save_split(split: Split, path: str | Path) -> Path:
    """Write ``split`` to an ``.npz`` file (indices, shape and JSON metadata)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        np.savez(
            fh,
            train=split.train,
            test=split.test,
            shape=np.asarray(split.shape),
            meta=np.asarray(json.dumps(split.meta, sort_keys=True)),
            guard=split.guard,
        )
    return path


def load_split(path: str | Path, gt: np.ndarray | None = None) -> Split:
    """Read a split written by :func:`save_split`; with ``gt``, check it fits that scene (and
    take the guard band from it: the labelled pixels in neither set).

    Raises:
        ValueError: the file is missing, unreadable, or does not fit ``gt``.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            for name in ("train", "test"):
                if data[name].dtype.kind not in "iu":  # float pixel numbers: a hand edit
                    raise TypeError(f"its {name} indices are {data[name].dtype}, not integers")
            split = Split(
                train=data["train"].astype(np.int64),
                test=data["test"].astype(np.int64),
                shape=tuple(int(x) for x in data["shape"]),
                meta=json.loads(str(data["meta"])),
            )
            if "guard" in data.files:  # files of earlier versions have none
                split.guard = data["guard"].astype(np.int64)
    except (OSError, KeyError, ValueError, EOFError, TypeError, zipfile.BadZipFile) as exc:
        raise ValueError(
            f"cannot read split file {path} ({type(exc).__name__}: {exc}); pass the split.npz "
            "that an earlier run wrote into its --out folder"
        ) from exc
    for name, idx in (("train", split.train), ("test", split.test)):
        if np.unique(idx).size != idx.size:  # a pixel trained twice, or scored twice
            raise ValueError(
                f"split {path}: some {name} pixels are listed twice; make a new split, or pass "
                "the split.npz an earlier run wrote"
            )
    if np.intersect1d(split.train, split.test).size:
        raise ValueError(f"split {path}: some pixels are in both train and test; make a new split")
    if gt is not None:
        if tuple(gt.shape) != split.shape:
            raise ValueError(f"split {path} is for shape {split.shape}, scene has {gt.shape}")
        flat = gt.ravel()
        for name, idx in (("train", split.train), ("test", split.test)):
            if idx.size and (idx.min() < 0 or idx.max() >= flat.size or (flat[idx] == 0).any()):
                raise ValueError(
                    f"split {path}: {name} indices point outside the scene or at unlabelled "
                    "pixels; was it written for another scene?"
                )
        # What is labelled and neither trained nor tested, from the scene itself: a file's
        # own guard array may be missing (earlier versions) or wrong, and is not trusted.
        left = flat > 0
        left[split.train] = False
        left[split.test] = False
        split.guard = np.flatnonzero(left).astype(np.int64)
    return split


def guard_note(split: Split) -> str:
    """What a disjoint split left out: its guard band, and any class it could not test."""
    if split.meta.get("kind") != "disjoint":
        return ""
    note = f" ({split.guard.size} in a guard band of {split.meta.get('guard_radius', '?')} px"
    untested = split.meta.get("train_only") or []
    if untested:
        note += f"; class{'es' if len(untested) > 1 else ''} "
        note += ", ".join(str(c) for c in untested) + " trained, not tested"
    return note + ")"


def split_digest(split: Split) -> str:
    """A short fingerprint of which pixels train and which test."""
    h = hashlib.sha256()
    for part in (split.train, split.test):
        h.update(np.ascontiguousarray(np.sort(part), dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]
