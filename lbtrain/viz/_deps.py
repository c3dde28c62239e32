"""The optional packages the pictures and the TensorBoard logger need, imported on demand.

lbtrain.profiling has its own `require_matplotlib`, but its message names the `--plot`
option of `lbtrain report`, and that package is being moved; these pieces are called from
the trainer and from scripts, so they say which extra to install and nothing more.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pyplot", "summary_writer_class"]


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
