"""A run's output folder: chosen and checked before any work, never mixed with another run.

:func:`prepare_out` runs on rank 0 before profiling: it picks the folder, refuses one that
is not empty (unless ``overwrite``), one that is a file, or one that cannot be created,
and creates nothing. :func:`start_run_folder` runs once the plan stands: it creates the
folder and, when overwriting, removes the earlier run's files first, so an interrupted
new run never leaves its files beside the old run's metrics.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from lbtrain.outputs import check_creatable, writing
from lbtrain.trainer.checkpoint import CHECKPOINT_DIR, list_checkpoints
from lbtrain.trainer.config import TrainConfig

__all__ = ["RUN_FILES", "prepare_out", "start_run_folder"]

# What every run writes into its folder (the workload's own files come on top).
RUN_FILES = (
    "metrics.json",
    "metrics.jsonl",
    "curves.png",
    "summary.json",
    "config.toml",
    "plan.json",
    "profiles.json",
    CHECKPOINT_DIR,
)


def prepare_out(config: TrainConfig, checkpoint: dict[str, Any] | None) -> tuple[str, bool]:
    """Decide and check the output folder on rank 0, before any expensive work.

    Returns:
        The folder, as a string (it is created later, by :func:`start_run_folder`), and
        whether an earlier run there is to be cleared (``overwrite``, and not resuming it).

    Raises:
        ValueError: naming ``out`` (or ``resume``), the path and the fix.
    """
    resumed_run = None
    if checkpoint is not None:
        folder = Path(checkpoint["path"]).resolve().parent
        # A checkpoint kept outside a run's checkpoints/ folder starts a new run folder.
        resumed_run = folder.parent if folder.name == CHECKPOINT_DIR else None
    if config.out:
        out = Path(config.out).expanduser()
    elif resumed_run is not None:
        out = resumed_run
    else:
        out = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
        suffix = 1
        while out.exists():  # two runs started within the same second
            out = out.with_name(f"{out.name.split('.')[0]}.{suffix}")
            suffix += 1
    if "\0" in str(out):
        raise ValueError(f"out {str(out)!r} is not a valid path (a NUL byte); name a folder")
    with writing("out", str(out)):  # a name too long, a loop of links: one line
        clear = _check_out(out, config, checkpoint, resumed_run)
    return str(out), clear


def _check_out(
    out: Path, config: TrainConfig, checkpoint: dict[str, Any] | None, resumed_run: Path | None
) -> bool:
    if out.exists() and not out.is_dir():
        raise ValueError(f"out {str(out)!r} is a file, not a folder; name a folder")
    same_run = resumed_run is not None and out.resolve() == resumed_run
    if same_run:
        newer = [
            p.name
            for p in list_checkpoints(out / CHECKPOINT_DIR)
            if p.name > Path(checkpoint["path"]).name  # type: ignore[index]
        ]
        if newer:
            raise ValueError(
                f"resume {checkpoint['path']!r} is older than {', '.join(newer)} in the same "  # type: ignore[index]
                "run; continuing there would mix two histories: set out=NEW_FOLDER, or "
                "resume from the newest checkpoint"
            )
    elif out.is_dir() and not config.overwrite:
        _refuse_non_empty(out)
    if out.is_dir():
        if not os.access(out, os.W_OK | os.X_OK):
            raise ValueError(
                f"out {str(out)!r} cannot be written (the folder is not writable); choose a "
                "folder you can write to"
            )
    else:
        # Made and removed again: a run refused while it starts leaves no empty folder.
        check_creatable("out", out)
    return bool(config.overwrite) and not same_run


def _refuse_non_empty(out: Path) -> None:
    entries = sorted(entry.name for entry in out.iterdir())
    if not entries:
        return
    held = [name for name in RUN_FILES if name in entries]
    if held:
        raise ValueError(
            f"out {str(out)!r} already holds a run ({', '.join(held)}); choose a new folder, "
            f"continue that run with resume {str(out)!r}, or replace it with overwrite=True"
        )
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    raise ValueError(
        f"out {str(out)!r} is not empty (it holds {shown}); choose a new or empty folder, or "
        "write there anyway with overwrite=True"
    )


def start_run_folder(out: Path, given: str, clear: bool, outputs: Iterable[str]) -> None:
    """Create `out` on rank 0 once the plan stands; with `clear`, remove an earlier run.

    Only the files a run writes (:data:`RUN_FILES` and the workload's `outputs`) are
    removed; anything else in the folder is left as it is.

    Raises:
        OutputError: the folder could not be created or cleared, naming ``out`` and `given`.
    """
    with writing("out", given):
        out.mkdir(parents=True, exist_ok=True)
        if not clear:
            return
        for name in (*RUN_FILES, *outputs):
            path = out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
