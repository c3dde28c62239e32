"""Synchronised BatchNorm's per-channel passes on a CPU rank, as compiled C (batchnorm_host.c).

torch has no CPU kernels for synchronised BatchNorm's pieces (`torch.batch_norm_stats` and
its kin are CUDA's only), and composing them from torch calls costs 30-60 calls of Python
and dispatch a layer and step, more than the small layer's own arithmetic. The C file holds
the five passes; this module builds it once per machine with the system's C compiler and
calls it through ctypes: no torch headers, and a build of a fraction of a second.

* `$CC` (else `cc`) builds it into `$XDG_CACHE_HOME/lbtrain` (else `~/.cache/lbtrain`), named
  by a hash of the source and the flags; a rank that finds it there only loads it. Ranks
  building at once each write their own file and rename it into place.
* Without a compiler, or if the build fails, `kernels` answers None and torch's kernels run:
  the same figures, slower (`lbtrain env` says which, and why). `LBTRAIN_HOST_KERNELS=0`
  asks for torch's always.
* No `-march=native`: a cache folder shared by a cluster's nodes must load on all of them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import torch

from lbtrain.logs import logger

__all__ = ["HostKernels", "describe", "kernels", "setting"]

_SOURCE = Path(__file__).with_name("batchnorm_host.c")
_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno"]
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_P, _L, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
_SIGNATURES = {
    "stats": [_P, _L, _L, _L, _P, _P],
    "finish": [_P, _L, _D, _D, _P, _P, _P, _P, _D, _P],
    "normalise": [_P, _P, _L, _L, _L, _P],
    "grad_sums": [_P, _P, _L, _L, _L, _P, _P, _P, _P],
    "input_grad": [_P, _P, _P, _L, _L, _L, _P, _P, _D],
}


class HostKernels:
    """The passes for one input type (batchnorm_host.c says what each does); pointers,
    (n, c, s) sizes and figures in, nothing out."""

    def __init__(self, library: ctypes.CDLL, suffix: str) -> None:
        for name, argtypes in _SIGNATURES.items():
            function = getattr(library, f"{name}_{suffix}")
            function.argtypes, function.restype = argtypes, None
            setattr(self, name, function)

    stats: Any
    finish: Any
    normalise: Any
    grad_sums: Any
    input_grad: Any


def setting() -> bool:
    """`LBTRAIN_HOST_KERNELS`: 1 (or unset) for the compiled passes, 0 for torch's kernels."""
    value = os.environ.get("LBTRAIN_HOST_KERNELS", "1")
    if value not in ("0", "1"):
        raise ValueError(
            f"LBTRAIN_HOST_KERNELS={value!r}: use 1 (synchronised BatchNorm's compiled CPU "
            "passes, the default) or 0 (torch's kernels)"
        )
    return value == "1"


def kernels(dtype: torch.dtype) -> HostKernels | None:
    """The compiled passes for a CPU input of `dtype` (float32 or float64), or None."""
    suffix = _SUFFIX.get(dtype)
    if suffix is None or not setting():
        return None
    library, _ = _library()
    return None if library is None else _kernels(library, suffix)


def describe() -> str:
    """Which passes a CPU rank's synchronised BatchNorm runs, and why (for `lbtrain env`)."""
    try:
        if not setting():
            return "torch's kernels (LBTRAIN_HOST_KERNELS=0)"
    except ValueError as exc:
        return str(exc)
    library, why = _library()
    return f"compiled ({_cached_path()})" if library is not None else f"torch's kernels ({why})"


@cache
def _kernels(library: ctypes.CDLL, suffix: str) -> HostKernels:
    return HostKernels(library, suffix)


@cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    """The loaded library, or None and why not; once a process."""
    try:
        path = _cached_path()
        if path.is_file():
            try:
                return _loaded(path), ""
            except (OSError, AttributeError):
                # Damaged, or not loadable from this folder (noexec): built again, and put
                # in its place only if the new one loads, so a folder this node cannot load
                # from keeps the file the other nodes can.
                pass
        return _build(_compiler(), path), ""
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError) as exc:
        why = _reason(exc)
        logger.debug("synchronised BatchNorm on CPU ranks: torch's kernels (%s)", why)
        return None, why


def _loaded(path: Path) -> ctypes.CDLL:
    """The library at `path`, with every function this module calls (else OSError or
    AttributeError)."""
    library = ctypes.CDLL(str(path))
    for name in _SIGNATURES:
        for suffix in _SUFFIX.values():
            getattr(library, f"{name}_{suffix}")
    return library


def _reason(exc: Exception) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        lines = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        return f"the C compiler failed: {lines[0] if lines else f'exit {exc.returncode}'}"
    return str(exc)


def _cache_folder() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "lbtrain"


def _cached_path() -> Path:
    """Where the library for this source, flags and platform lives in the cache folder."""
    parts = [" ".join(_FLAGS), platform.machine(), sys.platform]
    key = hashlib.sha256(b"\0".join([_SOURCE.read_bytes(), *(part.encode() for part in parts)]))
    return _cache_folder() / f"batchnorm_host-{key.hexdigest()[:16]}.so"


def _compiler() -> list[str]:
    """CC's words (`ccache gcc`), or `cc` where CC is unset or blank."""
    value = os.environ.get("CC", "")
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"CC={value!r} cannot be read ({exc}); set CC to a C compiler") from None
    return words or ["cc"]


def _build(compiler: list[str], path: Path) -> ctypes.CDLL:
    """Build the library with `compiler` (CC's words) into `path`, and load it."""
    if shutil.which(compiler[0]) is None:
        raise ValueError(f"no C compiler {shlex.join(compiler)!r} on PATH; set CC to one")
    # A file of this process's own, loaded and checked, then renamed into place: ranks
    # building at once never load a half-written library, and the last rename wins with the
    # same bytes.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".so", delete=False) as handle:
            partial = Path(handle.name)
    except OSError as exc:
        raise ValueError(
            f"the cache folder {path.parent} is not writable ({exc.strerror or exc}); set "
            "XDG_CACHE_HOME to a writable folder"
        ) from None
    try:
        subprocess.run(
            [*compiler, *_FLAGS, str(_SOURCE), "-o", str(partial)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        try:
            library = _loaded(partial)
        except (OSError, AttributeError) as exc:
            raise ValueError(
                f"the library built in {path.parent} does not load ({exc}); set XDG_CACHE_HOME "
                "to another folder"
            ) from None
        partial.chmod(0o755)  # readable as any installed library (the temporary file is 0600)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return library
