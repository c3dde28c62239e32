"""Writing outputs: atomically, to the name the user gave, and failing in one clear line.

Every file lbtrain writes goes to a temporary name in the same folder, is fsynced, then
renamed over the target: rename is atomic on POSIX file systems, so a reader sees the old
file or the new one, never half of one, and an interrupted run leaves no torn file.

An operating-system failure while writing (disk full, read-only file system, permissions)
becomes one :class:`OutputError` line naming the option, the real path (never the
temporary one) and a fix, through :func:`writing`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "OutputError",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_creatable",
    "write_failure",
    "writing",
]


class OutputError(ValueError):
    """An output could not be written: one line naming the option, the path and a fix."""


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Have `write(temporary_path)` write the file, then fsync it and rename it to `path`.

    The temporary file sits in the same folder and ends in the same suffix, so writers that
    pick a format from the extension (numpy's savez, matplotlib's savefig) behave alike.

    Raises:
        OSError: the write failed; its ``filename`` is `path`, not the temporary name.
    """
    path = Path(path)
    try:
        handle, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}",
                                        dir=path.parent)  # fmt: skip
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        with temporary.open("rb+") as file:
            os.fsync(file.fileno())
        # mkstemp makes the file private (0600); give it what open() would have given.
        temporary.chmod(0o666 & ~_umask())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        # The user named `path`; the temporary name in the message would only puzzle them.
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
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


# What to do about the usual write failures, by errno.
_FIXES = {
    errno.ENOSPC: "free some space there or choose another",
    errno.EDQUOT: "free some of your quota or choose another",
    errno.EROFS: "the file system is read-only; choose another",
    errno.EACCES: "choose one you can write to",
    errno.EPERM: "choose one you can write to",
    errno.ENAMETOOLONG: "choose a shorter name",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another",
    errno.EISDIR: "it is a folder; name a file",
    errno.ENOENT: "check that its folder exists, or choose another",
}


def write_failure(option: str, given: str | os.PathLike[str], exc: OSError) -> str:
    """One line for a failed write: the option, the path the user gave, the cause and a fix.

    Args:
        option: the option that named the output (``--out``, or a library parameter ``out``).
        given: the value the user gave it.
        exc: the failure; its ``filename`` (when set) is the file that could not be written.
    """
    what = f"{option} {os.fspath(given)!r}"
    target = exc.filename if exc.filename is not None else given
    cause = exc.strerror or type(exc).__name__
    place = "" if os.fspath(target) == os.fspath(given) else f"{os.fspath(target)}: "
    fix = _FIXES.get(exc.errno or 0, "check the path or choose another")
    return f"{what} cannot be written ({place}{cause}); {fix}"


@contextlib.contextmanager
def writing(option: str, given: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an OSError raised inside into an :class:`OutputError` naming `option` and `given`."""
    try:
        yield
    except OSError as exc:
        raise OutputError(write_failure(option, given, exc)) from None


def check_creatable(option: str, folder: str | os.PathLike[str]) -> None:
    """Fail now if `folder` could not be created later; leave no folder behind.

    The missing part of the path is made and removed again: a name too long, a character
    the file system refuses or a read-only mount fail here, before any work, not after it.

    Raises:
        OutputError: naming `option`, the folder and a fix.
    """
    if "\0" in os.fspath(folder):
        raise OutputError(f"{option} {os.fspath(folder)!r} is not a valid path (a NUL byte)")
    folder = Path(folder)
    made: list[Path] = []
    try:
        with writing(option, folder):
            missing = folder
            while not missing.exists():
                made.append(missing)
                missing = missing.parent
            for part in reversed(made):
                part.mkdir()
    finally:
        for part in made:
            with contextlib.suppress(OSError):
                part.rmdir()
