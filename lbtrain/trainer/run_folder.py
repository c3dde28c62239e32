"""A run's output folder: chosen and checked before any work, never mixed with another run.

:func:`prepare_out` runs on rank 0 before profiling: it picks the folder, refuses one that
is not empty (unless ``overwrite``), one that is a file, or one that cannot be created,
and creates nothing. :func:`start_run_folder` runs once the plan stands: it creates the
folder and, when overwriting, removes the earlier run's files first, so an interrupted
new run never leaves its files beside the old run's metrics, and takes the folder's lock
(:func:`hold_run_folder`), so that a second `lbtrain train` into it (a resume of a run that
is still going, say) is refused instead of mixing two histories.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
import warnings
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from lbtrain.outputs import check_creatable, writing
from lbtrain.runs.folder import LOCK_FILE
from lbtrain.trainer.checkpoint import CHECKPOINT_DIR, list_checkpoints
from lbtrain.trainer.config import TrainConfig, load_toml
from lbtrain.trainer.resume import AUTO, recipe_differences

__all__ = [
    "RUN_FILES",
    "check_named_outputs",
    "discard_reserved",
    "hold_run_folder",
    "prepare_out",
    "release_run_folder",
    "start_run_folder",
]


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


def check_named_outputs(config: TrainConfig, outputs: Iterable[str]) -> None:
    """The trace and the TensorBoard folder clear of the files the run writes itself (and
    of each other): a trace named profiles.json replaced the run's profiles, one named
    summary.json was replaced by the summary, and a TensorBoard folder named so failed
    after training. Before any work, on every rank alike (ValueError)."""
    outputs = [Path(o) for o in outputs]
    reserved = {*RUN_FILES, *(o.parts[0] for o in outputs if o.parts), LOCK_FILE}
    named = {"trace": config.trace, "tensorboard": config.tensorboard}
    for name, value in named.items():
        first = Path(value).parts[0] if value else None
        if first in reserved:
            example = "trace.json" if name == "trace" else "tensorboard"
            raise ValueError(
                f"{name}={value!r} names {first}, which the run writes itself; name another "
                f"path inside the run folder, such as {example}"
            )
    if config.trace and config.tensorboard:
        trace, board = Path(config.trace), Path(config.tensorboard)
        if trace == board or board in trace.parents or trace in board.parents:
            raise ValueError(
                f"trace={config.trace!r} and tensorboard={config.tensorboard!r} overlap; "
                "name them apart, such as trace.json and tensorboard"
            )


def prepare_out(config: TrainConfig, checkpoint: dict[str, Any] | None) -> tuple[str, bool]:
    """Decide and check the output folder on rank 0, before any expensive work.

    Returns:
        The folder, as a string (it is created later, by :func:`start_run_folder`; the
        default runs/<date-time> is made now, see :func:`_reserve`), and whether an earlier
        run there is to be cleared (``overwrite``, and not resuming it).

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
        with writing("out", "runs"):
            return str(_reserve(Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S"))), False
    if "\0" in str(out):
        raise ValueError(f"out {str(out)!r} is not a valid path (a NUL byte); name a folder")
    with writing("out", str(out)):  # a name too long, a loop of links: one line
        if config.resume == AUTO:
            config = _auto_run(out, config, checkpoint)
        clear = _check_out(out, config, checkpoint, resumed_run)
    return str(out), clear


def _auto_run(out: Path, config: TrainConfig, checkpoint: dict[str, Any] | None) -> TrainConfig:
    """resume=auto: `out` holds this recipe's run or none. A run that ended before its
    first checkpoint starts over there (its files go, as with overwrite)."""
    if checkpoint is not None:
        saved, where = checkpoint.get("config") or {}, f"checkpoint {checkpoint['path']!r}"
    elif (out / "config.toml").is_file():
        saved, where = load_toml(out / "config.toml"), "config.toml"
    else:
        return config
    differ = recipe_differences(config, saved)
    if differ:
        shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        raise ValueError(
            f"out {str(out)!r} holds another run (its {where} has {shown}); resume=auto "
            f"continues only the same recipe: choose another folder, or continue that run "
            f"with resume={str(out)!r}"
        )
    return config if checkpoint is not None else replace(config, overwrite=True)


# The default folder this process made in prepare_out and has not started a run in yet.
_reserved: list[Path] = []


def _reserve(out: Path) -> Path:
    """Make the default folder now, under the first free name: two runs started in the same
    second (a Slurm array) must not pick one name, which only making it can settle."""
    made = [] if out.parent.is_dir() else [out.parent]  # runs/ too, if this made it
    out.parent.mkdir(parents=True, exist_ok=True)
    stem, suffix = out.name, 1
    while True:
        try:
            out.mkdir()
        except FileExistsError:
            out, suffix = out.with_name(f"{stem}.{suffix}"), suffix + 1
            continue
        _reserved[:] = [out, *made]
        return out


def discard_reserved() -> None:
    """Remove the default folder `prepare_out` made if no run started in it (a run refused
    while it starts leaves no empty folder)."""
    for folder in _reserved:  # the run's folder, then runs/ if this process made it
        with contextlib.suppress(OSError):  # not empty, or gone: leave it
            folder.rmdir()
    _reserved.clear()


def _check_out(
    out: Path, config: TrainConfig, checkpoint: dict[str, Any] | None, resumed_run: Path | None
) -> bool:
    if out.exists() and not out.is_dir():
        raise ValueError(f"out {str(out)!r} is a file, not a folder; name a folder")
    same_run = resumed_run is not None and out.resolve() == resumed_run
    if same_run:
        # Less the damaged ones resume=auto went past (moved aside as the run starts).
        damaged = {Path(p).resolve() for p in checkpoint.get("damaged", [])}  # type: ignore[union-attr]
        newer = [
            p.name
            for p in list_checkpoints(out / CHECKPOINT_DIR)
            if p.name > Path(checkpoint["path"]).name and p.resolve() not in damaged  # type: ignore[index]
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
        _refuse_in_use(out, str(out))
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
    entries = sorted(entry.name for entry in out.iterdir() if entry.name != LOCK_FILE)
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


def start_run_folder(out: Path, given: str, clear: bool, outputs: Iterable[str]) -> IO[str]:
    """Create and lock `out` on rank 0 once the plan stands; with `clear`, remove an earlier
    run. Returns the lock, to hold until the run ends (:func:`release_run_folder`).

    Only the files a run writes (:data:`RUN_FILES` and the workload's `outputs`) are
    removed; anything else in the folder is left as it is.

    Raises:
        OutputError: the folder could not be created or cleared, naming ``out`` and `given`.
        ValueError: another process holds the folder's lock.
    """
    with writing("out", given):
        out.mkdir(parents=True, exist_ok=True)
        _reserved.clear()  # a run starts in it: no longer to discard
        lock = hold_run_folder(out, given)
        if not clear:
            return lock
        for name in (*RUN_FILES, *outputs):
            path = out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    return lock


def _refuse_in_use(out: Path, given: str) -> None:
    """Raise if another process holds `out`'s lock (a run is writing there now)."""
    if (out / LOCK_FILE).is_file():
        with warnings.catch_warnings():  # no locks here: said once, when the run takes it
            warnings.simplefilter("ignore")
            release_run_folder(hold_run_folder(out, given))


def hold_run_folder(out: Path, given: str) -> IO[str]:
    """Take `out`'s lock for this process; keep the returned file open while training.

    A file system without locks (NFS without lockd, Lustre mounted noflock) gets a warning
    and the run goes on unlocked, as it did before there was a lock.

    Raises:
        ValueError: another process holds it, naming its pid and the fix.
    """
    handle = (out / LOCK_FILE).open("a+")
    try:
        _lock(handle)
    except BlockingIOError:
        handle.seek(0)
        pid = handle.read().strip() or "unknown"
        handle.close()
        raise ValueError(
            f"run folder {given!r} is in use: another lbtrain train (pid {pid}) is writing "
            "there now; wait for it to end (or stop it), or write elsewhere with out=NEW_FOLDER"
        ) from None
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            handle.close()
            raise
        warnings.warn(
            f"run folder {given!r} cannot be locked ({exc.strerror}): a second lbtrain train "
            "into it would not be refused",
            stacklevel=2,
        )
        return handle
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _lock(handle: IO[str]) -> None:
    """flock `handle` exclusively, trying a few times over a quarter of a second: `lbtrain
    show` and another start's check hold the lock for an instant, a run holds it for good."""
    for _ in range(LOCK_TRIES - 1):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(LOCK_RETRY_SECONDS)
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


LOCK_TRIES, LOCK_RETRY_SECONDS = 6, 0.05
# What flock raises where the file system keeps no locks, rather than where one is held.
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


def release_run_folder(handle: IO[str] | None) -> None:
    """Let go of a lock from :func:`hold_run_folder`."""
    if handle is not None:
        handle.close()  # closing the file releases the flock
