"""Checks of the hyperspectral options against a scene, before any training; no lbtrain import.

The sizes are checked against the published scene shape (known from the registry) before
the scene is read or downloaded, and again against the file actually read when it differs.
The split can only be checked once it is made, which is still before any profiling.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from .datasets import SCENES
from .models import build_model
from .pipeline import missing_classes
from .splits import Split

__all__ = ["check_sizes", "check_split", "new_model", "published_shape", "warn_untested"]

# Shape of the generated scene, for checks before it is made (get_scene's defaults).
_SYNTHETIC_SHAPE = (48, 48, 32)


def published_shape(name: str) -> tuple[int, int, int]:
    """(H, W, bands) of scene `name` as published (or as generated, for "synthetic")."""
    return _SYNTHETIC_SHAPE if name == "synthetic" else SCENES[name].shape


def check_sizes(scene: str, shape: tuple[int, ...], opts: Mapping[str, Any]) -> None:
    """Patch, PCA and model against a scene of `shape` (H, W, bands); `opts` as `_settle`'s.

    Raises:
        ValueError: one line naming the flag, the value and what to use instead.
    """
    model, patch_size, pca, dropout = (opts[k] for k in ("model", "patch_size", "pca", "dropout"))
    h, w, bands = shape
    limit = min(h, w)
    if patch_size > limit:
        largest = limit if limit % 2 else limit - 1
        raise ValueError(
            f"--patch-size {patch_size} is larger than the {scene} scene ({h}x{w} pixels); "
            f"use an odd size up to {largest}"
        )
    if pca is not None and pca > bands:
        raise ValueError(
            f"--pca {pca} is more than the {bands} bands of {scene}; use 1..{bands}, "
            "or 0 to keep the bands"
        )
    channels = pca or bands
    # A throwaway model on one zero patch: a patch too small or too few channels for the
    # model fails here, before the scene is read. fork_rng: the caller's torch generator is
    # left as it was. (The meta device would skip the weights, but its first convolution
    # imports torch's meta kernels, which costs more than this.)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            net = new_model(model, channels, 2, patch_size, dropout).eval()
            net(torch.zeros(1, channels, patch_size, patch_size))
    except (ValueError, RuntimeError) as exc:
        message = " ".join(str(exc).split())
        raise ValueError(
            f"--model {model} cannot take {channels}-channel patches of {patch_size}x"
            f"{patch_size} ({message}); change --patch-size or --pca, or choose another --model"
        ) from None
    _check_ensemble_memory(model, sum(p.numel() for p in net.parameters()), opts["ensemble"])


# Bytes a parameter's float32 weight holds: whatever else a run keeps (gradients, an
# optimiser's state, activations), every path that builds the model holds this much.
_WEIGHT_BYTES = 4


def _check_ensemble_memory(model: str, parameters: int, members: int) -> None:
    """Refuse an ensemble whose weights alone outgrow this machine's memory, before a rank
    builds it (the kernel would kill the job, with no message). A lower bound, so it refuses
    nothing that could run: training needs two to four times as much."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no such figure on this platform
        return
    need = members * parameters * _WEIGHT_BYTES
    if members > 1 and need > memory:
        most = max(1, memory // (parameters * _WEIGHT_BYTES))
        raise ValueError(
            f"--ensemble {members:,} members of {model} ({parameters:,} parameters each) need "
            f"{need / 2**30:,.1f} GiB for their weights alone, more than this machine's "
            f"{memory / 2**30:,.1f} GiB; use far fewer members (at most {most:,} would fit "
            "the weights; training needs two to four times as much)"
        )


def new_model(
    model: str,
    bands: int,
    classes: int,
    patch_size: int,
    dropout: float,
    members: int = 1,
    own_batches: bool = False,
) -> nn.Module:
    """A fresh registered model, or an ensemble of ``members`` (not seeded: the caller
    seeds torch)."""
    return build_model(
        model,
        bands=bands,
        num_classes=classes,
        patch_size=patch_size,
        dropout=dropout,
        members=members,
        own_batches=own_batches,
    )


def check_split(split: Split, scene_gt: np.ndarray, names: tuple[str, ...], origin: str) -> None:
    """Refuse a split that leaves a class without training or test pixels, in one line.

    Such a class would only be a warning per class, and then a per-class accuracy that
    cannot be scored; ``origin`` names the split (a --split-file, or the split kind). A
    disjoint split's own ``train_only`` classes (too small to keep a test pixel beyond its
    guard band, each already named in a warning) are the exception: they train, untested.
    """
    no_train, no_test = missing_classes(split, scene_gt)
    declared = set(split.meta.get("train_only", ()))
    no_test = [c for c in no_test if c not in declared]
    if not (no_train or no_test):
        return
    parts = []
    for what, classes in (("training", no_train), ("test", no_test)):
        if classes:
            listed = ", ".join(f"{c} ({names[c - 1]})" for c in classes)
            parts.append(f"no {what} pixels for class{'es' if len(classes) > 1 else ''} {listed}")
    raise ValueError(
        f"{origin} leaves {'; '.join(parts)}; use another --train-ratio or --train-per-class, "
        "--split random, or (disjoint) a smaller --patch-size"
    )


def warn_untested(split: Split, split_file: str) -> None:
    """Say again, for a reused split file, which classes it trains but does not test.

    The disjoint split that made the file said so in its own run; a run that reuses it
    would otherwise print a per-class table with rows of "-" and no word why.
    """
    untested = split.meta.get("train_only") or []
    if untested:
        listed = ", ".join(str(c) for c in untested)
        warnings.warn(
            f"--split-file {split_file}: class{'es' if len(untested) > 1 else ''} {listed} "
            "train but are not tested (the disjoint split that made the file could not keep "
            "a test pixel clear of their training pixels)",
            stacklevel=2,
        )


def check_split_options(opts: Mapping[str, Any]) -> None:
    """The split's options that go together: a fixed split's count, and only there."""
    split_file, per_class = opts["split_file"], opts["train_per_class"]
    if split_file is None and opts["split"] == "fixed" and per_class is None:
        raise ValueError("--split fixed needs --train-per-class N (training pixels per class)")
    # (A --split-file overrides both, as its help says: a fixed run's config.toml replayed
    # with its split.npz keeps working.)
    if per_class is not None and split_file is None and opts["split"] != "fixed":
        # Ignored there, yet config.toml would record it as the run's recipe.
        raise ValueError(
            f"--train-per-class {per_class} sizes a fixed split, and --split {opts['split']} "
            "does not read it: add --split fixed, or drop --train-per-class (--train-per-class "
            "none, where a config.toml or checkpoint carries it)"
        )
