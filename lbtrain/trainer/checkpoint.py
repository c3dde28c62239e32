"""Checkpoints and run outputs, written atomically: a crash mid-write never leaves a torn file.

Rank 0 writes every file to a temporary name in the same folder, fsyncs it, then renames it
over the target: rename is atomic on POSIX file systems, so a reader sees the old file or
the new one, never half of one. Checkpoints are named by the global step, so the newest is
the one with the highest number.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CHECKPOINT_DIR",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "checkpoint_name",
    "find_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d+)\.pt$")


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Have `write(temporary_path)` write the file, then fsync it and rename it to `path`.

    The temporary file sits in the same folder and ends in the same suffix, so writers that
    pick a format from the extension (numpy's savez, matplotlib's savefig) behave alike.
    """
    path = Path(path)
    handle, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}",
                                    dir=path.parent)  # fmt: skip
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        with temporary.open("rb+") as file:
            os.fsync(file.fileno())
        # mkstemp makes the file private (0600); give it what open() would have given.
        temporary.chmod(0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` through a temporary file, fsync and rename."""
    return atomic_write(path, lambda temporary: temporary.write_bytes(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _fsync_folder(folder: Path) -> None:
    # The rename itself must reach the disk, or a power cut can bring back the old name.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    """Read a checkpoint onto the CPU; a damaged or foreign file is a one-line ValueError."""
    path = Path(path)
    try:
        # weights_only: a checkpoint is data; unpickling arbitrary objects would run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a torn or foreign file
        raise ValueError(
            f"resume {str(path)!r} is not a readable lbtrain checkpoint ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]})"
        ) from None
    required = ("model", "optimizer", "epoch", "step", "global_step", "config", "plan")
    if not isinstance(state, dict) or any(key not in state for key in required):
        raise ValueError(
            f"resume {str(path)!r} is not an lbtrain checkpoint (it lacks "
            f"{', '.join(k for k in required if not isinstance(state, dict) or k not in state)})"
        )
    return state
