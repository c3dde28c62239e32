"""The optional packages the pictures and the TensorBoard logger need, imported on demand.

lbtrain.profiling has its own `require_matplotlib`, but its message names the `--plot`
option of `lbtrain report`, and that package is being moved; these pieces are called from
the trainer and from scripts, so they say which extra to install and nothing more.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["pyplot", "save_figure", "summary_writer_class"]


def pyplot() -> Any:
    """Return matplotlib.pyplot on the Agg backend, or raise one line naming the extra."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(
            f"lbtrain's pictures need matplotlib, which cannot be imported ({exc}); "
            "install it with `pip install 'lbtrain[plot]'`"
        ) from None
    # Files only, never a window: Agg works on headless ranks and CI alike.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def summary_writer_class() -> Any:
    """Return torch's SummaryWriter, or raise one line naming the extra that brings tensorboard."""
    try:
        import tensorboard  # noqa: F401  (torch's own message does not name our extra)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise RuntimeError(
            f"TensorBoard logging needs the tensorboard package, which cannot be imported "
            f"({exc}); install it with `pip install 'lbtrain[tensorboard]'`"
        ) from None
    return SummaryWriter


def save_figure(figure: Any, plt: Any, path: str | os.PathLike[str]) -> Path:
    """Write `figure` to `path` (folders made, atomically, 120 dpi) and close it."""
    from lbtrain.outputs import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return atomic_write(path, lambda temporary: figure.savefig(temporary, dpi=120))
    finally:
        plt.close(figure)
