"""Read one array from a MATLAB file, turning every failure into a :class:`DatasetError`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from .errors import DatasetError

__all__ = ["read_mat_array", "is_hdf5_mat"]

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5_mat(path: Path) -> bool:
    """True if ``path`` is a MATLAB v7.3 file (HDF5; superblock at offset 0 or 512)."""
    with open(path, "rb") as fh:
        head = fh.read(520)
    return head[:8] == _HDF5_SIGNATURE or head[512:520] == _HDF5_SIGNATURE


def _h5py_available() -> bool:
    return importlib.util.find_spec("h5py") is not None


def _read_hdf5(path: Path, key: str) -> np.ndarray:
    if not _h5py_available():
        raise DatasetError(
            f"{path} is a MATLAB v7.3 (HDF5) file, which scipy cannot read; "
            "install h5py (`pip install h5py`) or re-save it in MATLAB with `save(..., '-v7')`"
        )
    import h5py

    with h5py.File(path, "r") as fh:
        if key not in fh:
            present = sorted(k for k in fh.keys() if not k.startswith("#"))
            raise DatasetError(f"{path} has no variable {key!r}; variables present: {present}")
        # MATLAB stores column-major, so h5py sees the axes reversed.
        return np.asarray(fh[key]).T


def read_mat_array(path: str | Path, key: str, url: str | None = None) -> np.ndarray:
    """Return variable ``key`` of the MATLAB file ``path``.

    Args:
        path: the ``.mat`` file.
        key: the variable name.
        url: where the file can be re-downloaded, quoted in error messages.

    Raises:
        DatasetError: the key is absent (keys present are listed), the file is corrupt or
            truncated, or it is v7.3 and h5py is missing.
    """
    import scipy.io

    path = Path(path)
    where = f" (get a fresh copy from {url})" if url else ""
    try:
        if is_hdf5_mat(path):
            return _read_hdf5(path, key)
        present = [name for name, _shape, _cls in scipy.io.whosmat(path)]
        if key not in present:
            raise DatasetError(
                f"{path} has no variable {key!r}; variables present: {present}. "
                "Is this the right file for the scene?"
            )
        return np.asarray(scipy.io.loadmat(path, variable_names=[key])[key])
    except DatasetError:
        raise
    except NotImplementedError:
        # scipy's own v7.3 detection; our signature check can miss odd headers.
        return _read_hdf5(path, key)
    except Exception as exc:  # scipy raises ValueError, TypeError, zlib.error, OSError...
        size = path.stat().st_size if path.exists() else 0
        raise DatasetError(
            f"{path} ({size} bytes) is corrupt or truncated and could not be read "
            f"({type(exc).__name__}: {exc}); delete it and download it again{where}"
        ) from exc
