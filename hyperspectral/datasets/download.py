"""Download a file atomically with a progress indicator and a sha256 check."""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import TextIO

from .errors import DatasetError

__all__ = ["download_file", "sha256_of", "git_blob_sha1", "digest_mismatch"]

_CHUNK = 1 << 16


def sha256_of(path: str | Path) -> str:
    """Hex sha256 digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


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


def _progress(stream: TextIO, name: str, done: int, total: int | None) -> None:
    if total:
        frac = done / total
        bar = "#" * int(30 * frac)
        stream.write(f"\rdownloading {name} [{bar:<30}] {done / 1e6:7.1f}/{total / 1e6:.1f} MB")
    else:
        stream.write(f"\rdownloading {name} {done / 1e6:7.1f} MB")
    stream.flush()


def download_file(
    url: str,
    dest: str | Path,
    sha256: str | None = None,
    *,
    git_sha1: str | None = None,
    timeout: float = 60.0,
    progress: TextIO | None = sys.stderr,
) -> Path:
    """Fetch ``url`` into ``dest``; the file appears only once complete and verified.

    The bytes go to a temporary file in the destination folder and are renamed into place
    (``os.replace`` is atomic on one filesystem), so an interrupted download never leaves a
    truncated file that a later run would mistake for data.

    Args:
        url: address to fetch.
        dest: final path.
        sha256: expected hex digest, or ``None`` to skip the check.
        git_sha1: expected git blob id, checked when ``sha256`` is ``None``.
        timeout: socket timeout in seconds.
        progress: stream for the progress bar, ``None`` for silence.

    Raises:
        DatasetError: the download failed or the checksum does not match.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    total = int(resp.headers.get("Content-Length") or 0) or None
                    done = 0
                    for block in iter(lambda: resp.read(_CHUNK), b""):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress is not None:
                            _progress(progress, dest.name, done, total)
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
                raise DatasetError(
                    f"could not download {url} ({exc}); download it by hand and place it at {dest}"
                ) from exc
            finally:
                if progress is not None:
                    progress.write("\n")
        if total is not None and done != total:
            raise DatasetError(
                f"download of {url} stopped after {done} of {total} bytes; run again to retry"
            )
        got = digest.hexdigest()
        if sha256 is not None and got != sha256.lower():
            wrong: str | None = f"sha256 {got}, expected {sha256}"
        else:
            wrong = digest_mismatch(tmp, None, git_sha1) if sha256 is None else None
        if wrong is not None:
            raise DatasetError(
                f"checksum mismatch for {url}: {wrong}; "
                "the file was discarded, check the address or your proxy and retry"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
