"""Whole-scene prediction and the classification map picture."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .patches import PatchDataset

__all__ = [
    "MissingDependencyError",
    "predict_scene",
    "class_colours",
    "rgb_composite",
    "require_matplotlib",
    "save_map",
]


class MissingDependencyError(RuntimeError):
    """An optional package needed for the requested output is not installed."""


def require_matplotlib() -> None:
    """Raise :class:`MissingDependencyError` with install advice unless matplotlib imports.

    Called before training so a long run does not fail only when the map is drawn.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            "drawing the classification map needs matplotlib: `pip install matplotlib` "
            "(or `pip install lbtrain[plot]`), or pass --no-map"
        ) from exc


@torch.inference_mode()
def predict_scene(
    model: nn.Module,
    padded: torch.Tensor,
    shape: tuple[int, int],
    patch_size: int,
    batch_size: int = 256,
) -> np.ndarray:
    """Predict a class (0..K-1) for every pixel, ``batch_size`` patches at a time.

    Memory stays bounded by one batch of patches plus the (H, W) answer, whatever the
    scene size: patches are cut from ``padded`` per batch, never all at once.

    Args:
        model: maps (N, C, P, P) patches to (N, K) logits; put in eval mode, then restored.
        padded: cube from :func:`~hyperspectral.patches.pad_cube`.
        shape: scene (H, W).
        patch_size: odd patch edge P used for ``padded``.
        batch_size: patches per forward pass.

    Returns:
        (H, W) ``int64`` array of predicted classes.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    h, w = shape
    everything = PatchDataset(padded, np.arange(h * w), patch_size, w)
    was_training = model.training
    model.eval()
    pred = np.empty(h * w, dtype=np.int64)
    for start in range(0, h * w, batch_size):
        pos = torch.arange(start, min(start + batch_size, h * w))
        x, _ = everything.batch(pos)
        pred[start : start + len(pos)] = model(x).argmax(1).numpy()
    model.train(was_training)
    return pred.reshape(h, w)


def class_colours(num_classes: int) -> np.ndarray:
    """(K + 1, 3) RGB colours in [0, 1]; row 0 (unlabelled) is black."""
    hues = np.linspace(0, 1, num_classes, endpoint=False)
    # Alternate lightness so neighbouring hues stay distinguishable with many classes.
    light = np.where(np.arange(num_classes) % 2 == 0, 0.55, 0.4)
    import colorsys

    colours = [colorsys.hls_to_rgb(h, lt, 0.85) for h, lt in zip(hues, light, strict=True)]
    return np.vstack([[0.0, 0.0, 0.0], np.asarray(colours)])


def rgb_composite(cube: np.ndarray, bands: Sequence[int]) -> np.ndarray:
    """(H, W, 3) image in [0, 1] from three bands, stretched to their 2-98 percentiles."""
    rgb = cube[..., list(bands)].astype(np.float64)
    lo, hi = np.percentile(rgb, [2, 98], axis=(0, 1))
    return np.clip((rgb - lo) / np.maximum(hi - lo, 1e-12), 0, 1)


def save_map(
    path: str | Path,
    cube: np.ndarray,
    gt: np.ndarray,
    prediction: np.ndarray,
    class_names: Sequence[str],
    rgb_bands: Sequence[int],
    title: str = "",
) -> Path:
    """Write a PNG: RGB composite, ground truth and prediction side by side, with a legend.

    Args:
        path: output file.
        cube: (H, W, B) original cube (for the RGB composite).
        gt: (H, W) ground truth, 0 = unlabelled.
        prediction: (H, W) predicted classes 0..K-1 for every pixel.
        class_names: names of classes 1..K.
        rgb_bands: three band indices.
        title: figure title.

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    require_matplotlib()
    # The object API renders with Agg without touching pyplot's global backend or figures.
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    k = len(class_names)
    colours = class_colours(k)
    cmap = ListedColormap(colours)
    fig = Figure(figsize=(15, 5.6), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [
        (rgb_composite(cube, rgb_bands), "RGB composite"),
        (gt, "ground truth"),
        (prediction + 1, "prediction (all pixels)"),
    ]
    for ax, (img, name) in zip(axes, panels, strict=True):
        if img.ndim == 3:
            ax.imshow(img, interpolation="nearest")
        else:
            ax.imshow(img, cmap=cmap, vmin=0, vmax=k, interpolation="nearest")
        ax.set_title(name)
        ax.set_axis_off()
    handles = [Patch(color=colours[0], label="0 unlabelled")]
    handles += [
        Patch(color=colours[i + 1], label=f"{i + 1} {n}") for i, n in enumerate(class_names)
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(k + 1, 5), fontsize=8)
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
