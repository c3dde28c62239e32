"""Whole-scene prediction and the classification map picture.

The picture has five panels and one legend: a false-colour composite (its bands named),
the ground truth, the prediction on the labelled pixels, where it is wrong on the test
pixels, and the prediction of every pixel.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .patches import PatchDataset

__all__ = [
    "MissingDependencyError",
    "predict_scene",
    "class_colours",
    "error_codes",
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
            f"the classification map (--map, on by default) needs matplotlib, which cannot be "
            f"imported ({exc}); install it with `pip install 'lbtrain[hyperspectral]'`, "
            "or pass --no-map"
        ) from None


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


# tab20's indices: its ten strong colours (tab10), then the six pale ones that stay furthest
# from every other colour (pale blue, orange, green, red, pink, olive), then the pale purple,
# brown, grey and cyan, which sit closer to those. So 16 classes (Indian Pines, Salinas) stay
# >= 25 CIELAB units apart, where tab20's own order pairs each colour with its pale twin.
_TAB20_ORDER = (0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 1, 3, 5, 7, 13, 17, 9, 11, 15, 19)

BACKGROUND = (0.0, 0.0, 0.0)  # unlabelled pixels: black, darker than every class colour

# The error panel's four kinds of pixel, coded 0..3 by error_codes.
_ERROR_KEY = (
    ("unlabelled", BACKGROUND),
    ("labelled, not a test pixel", (0.45, 0.45, 0.45)),
    ("test pixel, right", (0.92, 0.92, 0.92)),
    ("test pixel, wrong", (0.90, 0.0, 0.0)),
)
# A disjoint split's guard band (labelled, neither trained nor tested), drawn over code 1.
_GUARD = ("guard band: not trained, not tested", (0.96, 0.70, 0.20))


def class_colours(num_classes: int) -> np.ndarray:
    """(K + 1, 3) RGB colours in [0, 1]: row 0 (unlabelled) black, then tab20 reordered.

    Neighbouring class indices get different hues; beyond 20 classes the colours repeat.
    """
    from matplotlib import colormaps

    tab20 = np.asarray(colormaps["tab20"].colors)[list(_TAB20_ORDER)]
    return np.vstack([BACKGROUND, np.resize(tab20, (num_classes, 3))])


def rgb_composite(cube: np.ndarray, bands: Sequence[int]) -> np.ndarray:
    """(H, W, 3) image in [0, 1] from three bands, stretched to their 2-98 percentiles."""
    rgb = cube[..., list(bands)].astype(np.float64)
    lo, hi = np.percentile(rgb, [2, 98], axis=(0, 1))
    return np.clip((rgb - lo) / np.maximum(hi - lo, 1e-12), 0, 1)


def error_codes(gt: np.ndarray, prediction: np.ndarray, test: np.ndarray) -> np.ndarray:
    """(H, W) codes for the error panel: 0 unlabelled, 1 not tested, 2 right, 3 wrong.

    Args:
        gt: (H, W) ground truth, 0 = unlabelled, 1..K classes.
        prediction: (H, W) predicted classes 0..K-1.
        test: (H, W) bool, the test pixels (all labelled).
    """
    codes = np.where(gt > 0, 1, 0)
    codes[test] = np.where(prediction[test] + 1 == gt[test], 2, 3)
    return codes


def _layout(shape: tuple[int, int]) -> tuple[int, int, tuple[float, float]]:
    """Rows, columns and figure size (inches) for five panels and the legend."""
    h, w = shape
    if h > 1.5 * w:  # tall scenes (Pavia University, Botswana): one row
        return 1, 6, (20.0, min(12.0, 1.0 + 3.2 * h / w))
    return 2, 3, (13.5, 1.2 + 9.0 * h / w)


def _band_title(bands: Sequence[int]) -> str:
    r, g, b = (int(x) for x in bands)
    return f"false colour: bands {r}, {g}, {b} (0-based) as R, G, B"


def save_map(
    path: str | Path,
    rgb: np.ndarray,
    gt: np.ndarray,
    prediction: np.ndarray,
    class_names: Sequence[str],
    *,
    bands: Sequence[int],
    test: np.ndarray | None = None,
    guard: np.ndarray | None = None,
    title: str = "",
) -> Path:
    """Write the map PNG: composite, ground truth, prediction (labelled, all), errors, legend.

    Args:
        path: output file.
        rgb: (H, W, 3) raw values of the three bands shown as R, G, B.
        gt: (H, W) ground truth, 0 = unlabelled.
        prediction: (H, W) predicted classes 0..K-1 for every pixel.
        class_names: names of classes 1..K.
        bands: the scene's (0-based) indices of ``rgb``'s bands, named in the panel title.
        test: (H, W) bool, the test pixels whose errors are counted; default every labelled
            pixel (then training pixels count too).
        guard: (H, W) bool, a disjoint split's guard band, drawn in its own colour; None or
            empty for splits without one.
        title: figure title.

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    require_matplotlib()
    # The object API renders with Agg without touching pyplot's global backend or figures.
    from matplotlib.figure import Figure

    colours = class_colours(len(class_names))
    rows, cols, size = _layout(gt.shape)
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(rows, cols).ravel()
    # About 12 characters of an 11-point title per inch of panel: longer ones wrap.
    width = int(12 * size[0] / cols)
    guard = guard if guard is not None and guard.any() else None
    panels = _panels(rgb, gt, prediction, colours, bands, test, guard)
    for ax, (img, name) in zip(axes[:5], panels, strict=True):
        ax.imshow(img, interpolation="nearest")
        ax.set_title(textwrap.fill(name, width), fontsize=11)
        ax.set_axis_off()
    key = list(_ERROR_KEY)
    if guard is not None:  # then the grey pixels are exactly the training pixels
        key = [key[0], ("training pixel", key[1][1]), *key[2:], _GUARD]
    _legends(axes[3], axes[5], colours, class_names, key, ncol=2 if cols == 3 else 1)
    if title:
        fig.suptitle(title, fontsize=13)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # "tight": the key under the error panel may reach below the grid the layout planned.
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def _panels(
    rgb: np.ndarray,
    gt: np.ndarray,
    prediction: np.ndarray,
    colours: np.ndarray,
    bands: Sequence[int],
    test: np.ndarray | None,
    guard: np.ndarray | None = None,
) -> list[tuple[np.ndarray, str]]:
    """The five (H, W, 3) images and their titles, in reading order."""
    labelled = gt > 0
    scored = labelled if test is None else test & labelled
    codes = error_codes(gt, prediction, scored)
    wrong, total = int((codes == 3).sum()), int(scored.sum())
    which = "labelled" if test is None else "test"
    share = 100 * wrong / max(total, 1)
    errors = np.asarray([c for _, c in _ERROR_KEY])[codes]
    if guard is not None:
        errors[guard & (codes == 1)] = _GUARD[1]
    return [
        (rgb_composite(rgb, (0, 1, 2)), _band_title(bands)),
        (colours[gt], f"ground truth ({labelled.sum():,} labelled pixels)"),
        (colours[np.where(labelled, prediction + 1, 0)], "prediction on the labelled pixels"),
        (errors, f"errors: {wrong:,} of {total:,} {which} pixels ({share:.1f}%)"),
        (colours[prediction + 1], "prediction of every pixel"),
    ]


def _legends(
    errors_ax: Any,
    legend_ax: Any,
    colours: np.ndarray,
    names: Sequence[str],
    key: Sequence[tuple[str, Any]],
    ncol: int,
) -> None:
    """The error panel's key under it, and the class legend in the last grid cell."""
    from matplotlib.patches import Patch

    def patch(colour: Any, label: str) -> Patch:
        # A grey edge keeps the black swatch visible on the white figure.
        return Patch(facecolor=colour, edgecolor="0.5", label=label)

    errors_ax.legend(
        handles=[patch(c, n) for n, c in key],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=ncol,
        fontsize=9,
        frameon=False,
    )
    legend_ax.set_axis_off()
    handles = [patch(colours[0], "0 unlabelled")]
    handles += [patch(colours[i], f"{i} {n}") for i, n in enumerate(names, start=1)]
    legend_ax.legend(
        handles=handles,
        loc="center",
        fontsize=10,
        frameon=False,
        title="classes",
        ncol=1 if len(handles) <= 21 else 2,
    )
