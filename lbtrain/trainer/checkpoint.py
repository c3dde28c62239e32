"""Checkpoints, written atomically (:mod:`lbtrain.outputs`): a crash never leaves a torn file.

Checkpoints are named by the global step, so the newest is the one with the highest number.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
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
    torch.save(state, buffer)
    path = atomic_write_bytes(
        folder / checkpoint_name(int(state["global_step"])), buffer.getvalue()
    )
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


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
        if magic != b"PK\x03\x04":
            return "is not an lbtrain checkpoint (not an archive that torch.save writes)"
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError) as exc:
        return f"is damaged, cut short or overwritten ({exc})"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None if bad is None else f"is damaged: its part {bad!r} fails its CRC-32 check"


def _instead(path: Path) -> str:
    """What to resume from instead: the newest intact-looking checkpoint before `path`."""
    if not _NAME.match(path.name):
        return f"name a {CHECKPOINT_DIR}/step-*.pt file or the folder of a run"
    earlier = [p for p in list_checkpoints(path.parent) if p.name < path.name]
    if earlier:
        return f"resume from the one before it, {str(earlier[-1])!r}"
    return "name another checkpoint, or start the run again"
