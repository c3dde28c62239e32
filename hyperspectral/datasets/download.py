"""Download a scene file through pooch (cache, retries, progress, checksum, atomic rename).

pooch streams into a temporary file beside the destination, checks the sha256, retries on a
network error or a wrong digest, and only then moves the file under its final name. What pooch
cannot do stays here: the git blob id check (pooch's hashes see the bytes only, a git blob id
also hashes a ``blob <size>\\0`` header), run by our downloader on pooch's temporary file so
it too happens before the move, and turning pooch's and requests' exceptions into one-line
:class:`DatasetError` messages.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TextIO

from tqdm import tqdm

from .errors import DatasetError

__all__ = ["RETRIES", "download_file", "sha256_of", "git_blob_sha1", "digest_mismatch"]

RETRIES = 2
"""Times a failed download (network error, wrong digest) is tried again; pooch waits 1 s, 2 s."""

_CHUNK = 1 << 16


def _pooch() -> ModuleType:
    """The pooch module, or a :class:`DatasetError` saying how to install it."""
    try:
        import pooch
    except ImportError as exc:
        raise DatasetError(
            "checking and downloading scene files needs pooch; install it with "
            "`pip install 'lbtrain[hyperspectral]'` (or `pip install pooch`)"
        ) from exc
    return pooch


def sha256_of(path: str | Path) -> str:
    """Hex sha256 digest of a file (``pooch.file_hash``)."""
    return str(_pooch().file_hash(str(path), alg="sha256"))


def git_blob_sha1(path: str | Path) -> str:
    """Git blob id of a file (what ``git hash-object FILE`` prints)."""
    path = Path(path)
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_mismatch(
    path: str | Path, sha256: str | None = None, git_sha1: str | None = None
) -> str | None:
    """Compare a file with its expected digest; ``None`` if it matches or nothing is known.

    The sha256 is checked when known, else the git blob id.

    Returns:
        ``None``, or a short description such as ``"sha256 ab.., expected cd.."``.
    """
    if sha256 is not None:
        got = sha256_of(path)
        return None if got == sha256.lower() else f"sha256 {got}, expected {sha256}"
    if git_sha1 is not None:
        got = git_blob_sha1(path)
        return None if got == git_sha1.lower() else f"git blob sha1 {got}, expected {git_sha1}"
    return None


class _Mismatch(ValueError):
    """A wrong git blob id; a ``ValueError``, so pooch retries and discards the file."""


class _Bar(tqdm):
    """A tqdm bar that is truthy before its total is known (pooch tests ``if progressbar``)."""

    def __bool__(self) -> bool:
        return True


class _Downloader:
    """pooch downloader: HTTP(S) with a tqdm bar on ``progress``, then the git blob check."""

    def __init__(
        self, name: str, timeout: float, progress: TextIO | None, git_sha1: str | None
    ) -> None:
        self.name, self.timeout, self.progress, self.git_sha1 = name, timeout, progress, git_sha1

    def __call__(self, url: str, output_file: str, pup: object) -> None:
        bar = None
        if self.progress is not None:
            # A fresh bar per attempt: pooch closes the one it was given.
            bar = _Bar(
                desc=f"downloading {self.name}",
                file=self.progress,
                unit="B",
                unit_scale=True,
                ncols=79,
            )
        fetch = _pooch().HTTPDownloader(
            progressbar=False if bar is None else bar, chunk_size=_CHUNK, timeout=self.timeout
        )
        try:
            fetch(url, output_file, pup)
        finally:
            if bar is not None:
                bar.close()
        wrong = digest_mismatch(output_file, None, self.git_sha1)
        if wrong is not None:
            raise _Mismatch(wrong)


def _drop_info(record: logging.LogRecord) -> bool:
    """Log filter: keep warnings and errors only."""
    return record.levelno >= logging.WARNING


def _reason(exc: BaseException) -> str:
    """A short one-line cause: ``HTTP 404 Not Found``, ``ConnectionError: [Errno 111] ...``."""
    response = getattr(exc, "response", None)
    if response is not None:
        return f"HTTP {response.status_code} {response.reason}"
    text = " ".join(str(exc).split())
    # The innermost cause, not urllib3's nested reprs: "[Errno 111] Connection refused",
    # "IncompleteRead(100 bytes read, 9900 more expected)" for a download cut short.
    inner = re.search(r"\[Errno -?\d+\] [^'\")]+|IncompleteRead\([^)]*\)", text)
    return f"{type(exc).__name__}: {inner.group(0) if inner else text}"


def download_file(
    url: str,
    dest: str | Path,
    sha256: str | None = None,
    *,
    git_sha1: str | None = None,
    timeout: float = 60.0,
    progress: TextIO | None = sys.stderr,
    by_hand: Path | None = None,
) -> Path:
    """Fetch ``url`` into ``dest`` with pooch; the file appears only once complete and verified.

    pooch writes to a temporary file in the destination folder and moves it into place after
    the checks, so an interrupted or wrong download never leaves a file under ``dest`` that a
    later run would mistake for data. A failure is tried again :data:`RETRIES` times. A file
    already at ``dest`` is kept if it matches the known digest (or no digest is known), and
    downloaded again otherwise.

    Args:
        url: HTTP(S) address to fetch.
        dest: final path.
        sha256: expected hex digest, or ``None`` to skip the check.
        git_sha1: expected git blob id, checked when ``sha256`` is ``None``.
        timeout: socket timeout in seconds.
        progress: stream for the progress bar, ``None`` for silence (pooch's log too).
        by_hand: where a failure tells the user to put a copy fetched by hand (``dest``
            unless given: the folder the user named, where the scene's other file is).

    Raises:
        DatasetError: the download failed or the checksum does not match; one line naming
            the address, the cause and the fix.
    """
    pooch = _pooch()
    import requests

    dest = Path(dest)
    git_sha1 = git_sha1 if sha256 is None else None  # the sha256 wins when both are known
    if git_sha1 is not None and dest.is_file() and digest_mismatch(dest, None, git_sha1):
        dest.unlink()  # pooch keeps any file when it knows no sha256; this one is known wrong
    pup = pooch.create(
        path=dest.parent,
        base_url=url.rsplit("/", 1)[0],
        registry={dest.name: f"sha256:{sha256.lower()}" if sha256 else None},
        urls={dest.name: url},
        retry_if_failed=RETRIES,
    )
    # A filter, not setLevel: pooch's logger is outside logging's tree, so a level change
    # would leave its isEnabledFor cache stale and keep it silent after we restore it.
    logger, quiet = pooch.get_logger(), _drop_info if progress is None else None
    if quiet is not None:
        logger.addFilter(quiet)
    tries = f"{1 + RETRIES} tr{'y' if RETRIES == 0 else 'ies'}"
    try:
        got = pup.fetch(dest.name, downloader=_Downloader(dest.name, timeout, progress, git_sha1))
    except requests.RequestException as exc:
        raise DatasetError(
            f"could not download {url} ({_reason(exc)}, {tries}); "
            f"download it by hand and place it at {by_hand or dest}"
        ) from exc
    except ValueError as exc:
        # pooch's own message: "... expected sha256:<hex> but got <hex>. Deleted download ..."
        found = re.search(r"but got ([0-9a-fA-F]+)", str(exc)) if sha256 else None
        if isinstance(exc, _Mismatch):
            wrong = str(exc)
        elif found is not None:
            wrong = f"sha256 {found.group(1)}, expected {sha256}"
        else:
            raise DatasetError(
                f"could not download {url} ({_reason(exc)}); "
                f"download it by hand and place it at {by_hand or dest}"
            ) from exc
        raise DatasetError(
            f"checksum mismatch for {url}: {wrong} ({tries}); "
            "the file was discarded, check the address or your proxy and retry"
        ) from exc
    except OSError as exc:
        raise DatasetError(
            f"could not save {url} as {dest} ({_reason(exc)}); "
            f"make sure {dest.parent} is writable and has room, then retry"
        ) from exc
    finally:
        if quiet is not None:
            logger.removeFilter(quiet)
    return Path(got)
