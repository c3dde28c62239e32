"""Checkpoints, written atomically (:mod:`lbtrain.outputs`): a crash never leaves a torn file.

Checkpoints are named by the global step, so the newest is the one with the highest number.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from lbtrain.outputs import atomic_write_bytes

__all__ = [
    "CHECKPOINT_DIR",
    "checkpoint_name",
    "find_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_name(global_step: int) -> str:
    """File name of the checkpoint taken after `global_step` optimizer steps."""
    return f"step-{global_step:09d}.pt"


def list_checkpoints(folder: str | os.PathLike[str]) -> list[Path]:
    """Checkpoints in `folder`, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(folder: str | os.PathLike[str], state: dict[str, Any], keep: int) -> Path:
    """Write `state` as the checkpoint of its global step, then keep only the newest `keep`.

    Args:
        folder: the checkpoints folder (created if missing).
        state: the checkpoint dict; its "global_step" names the file.
        keep: how many checkpoints to keep (>= 1).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with _crc32_on():
        torch.save(state, buffer)
    path = atomic_write_bytes(
        folder / checkpoint_name(int(state["global_step"])), buffer.getvalue()
    )
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


@contextmanager
def _crc32_on() -> Iterator[None]:
    """Have torch.save write the CRC-32s that `load_checkpoint` checks, whatever a user set."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # an older torch, which always computes them
        config = None
    save = getattr(config, "save", None)
    if save is None or not hasattr(save, "compute_crc32"):
        yield
        return
    before, save.compute_crc32 = save.compute_crc32, True
    try:
        yield
    finally:
        save.compute_crc32 = before


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint `--resume` names: a file, a checkpoints folder, or a run folder.

    Raises:
        ValueError: nothing to resume from there, with what was looked for.
    """
    path = Path(path).expanduser()
    if path.is_file():
        return path
    if not path.exists():
        raise ValueError(f"resume {str(path)!r} does not exist; name a checkpoint or a run folder")
    for folder in (path / CHECKPOINT_DIR, path):
        found = list_checkpoints(folder)
        if found:
            return found[-1]
    raise ValueError(
        f"resume {str(path)!r} holds no checkpoint (looked for {CHECKPOINT_DIR}/step-*.pt); "
        "name a checkpoint file or the folder of a run that wrote one"
    )


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint onto the CPU; a damaged or foreign file is a one-line ValueError.

    The archive's CRC-32s are checked first: torch.load does not read them, and a few
    flipped bytes inside a tensor would otherwise resume with wrong weights and exit 0.
    """
    path = Path(path)
    problem = _damage(path)
    if problem is not None:
        raise ValueError(f"resume {str(path)!r} {problem}; {_instead(path)}")
    try:
        # weights_only: a checkpoint is data; unpickling arbitrary objects would run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a foreign file
        raise ValueError(
            f"resume {str(path)!r} is not a readable lbtrain checkpoint ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:120]}); {_instead(path)}"
        ) from None
    required = ("model", "optimizer", "epoch", "step", "global_step", "config", "plan")
    if not isinstance(state, dict) or any(key not in state for key in required):
        raise ValueError(
            f"resume {str(path)!r} is not an lbtrain checkpoint (it lacks "
            f"{', '.join(k for k in required if not isinstance(state, dict) or k not in state)})"
        )
    return state


def _damage(path: Path) -> str | None:
    """Why `path` is not an intact torch.save archive, or None."""
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if magic != b"PK\x03\x04":
        return "is not an lbtrain checkpoint (not an archive that torch.save writes)"
    try:
        with zipfile.ZipFile(path) as archive:
            sized = [info for info in archive.infolist() if info.file_size]
            # Written with torch's compute_crc32 off (not by save_checkpoint): nothing to check.
            if all(info.CRC == 0 for info in sized):
                return None
            bad = archive.testzip()
    except Exception as exc:  # noqa: BLE001 - a damaged archive raises many types
        return f"is damaged, cut short or overwritten ({type(exc).__name__}: {exc})"
    return None if bad is None else f"is damaged: its part {bad!r} fails its CRC-32 check"


def _instead(path: Path) -> str:
    """What to resume from instead: the checkpoint before `path`, into a new folder (the
    damaged one stays the run's newest)."""
    if not _NAME.match(path.name):
        return f"name a {CHECKPOINT_DIR}/step-*.pt file or the folder of a run"
    earlier = [p for p in list_checkpoints(path.parent) if p.name < path.name]
    if earlier:
        return (
            f"resume from the one before it, {str(earlier[-1])!r}, with out=NEW_FOLDER (or "
            "after deleting the damaged one)"
        )
    return "name another checkpoint, or start the run again"
