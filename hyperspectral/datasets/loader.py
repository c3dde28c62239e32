"""Find, fetch, check and load a registered scene.

Lookup order for each file:

1. the folder given explicitly (``--data-dir``), else ``$LBTRAIN_DATA``, else the user cache
   (``$XDG_CACHE_HOME/lbtrain`` or ``~/.cache/lbtrain``); the cache is searched as well when
   another folder was given, because downloads land there;
2. for Indian Pines, the ``.npy`` copy shipped inside the ``tensorly`` wheel, read as package
   data through :mod:`importlib.resources`;
3. a download from the official address (or ``mirror``) into the cache, through pooch
   (:func:`~hyperspectral.datasets.download.download_file`), checked by sha256 (or the git
   blob id where only that is known).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import sys
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TextIO

import numpy as np

from .download import digest_mismatch, download_file
from .errors import DatasetError
from .matfile import read_mat_array
from .registry import SceneFile, SceneInfo, get_scene_info
from .scene import Scene

__all__ = ["default_cache_dir", "search_dirs", "tensorly_data_dir", "load_scene", "check_scene"]


def default_cache_dir() -> Path:
    """The user cache folder for scenes: ``$XDG_CACHE_HOME/lbtrain`` or ``~/.cache/lbtrain``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lbtrain"


def search_dirs(data_dir: str | Path | None = None) -> list[Path]:
    """Folders searched for scene files, in order (see the module docstring).

    Raises:
        DatasetError: ``data_dir`` (or ``$LBTRAIN_DATA``) is not a folder. A mistyped name
            would otherwise fall back silently to another copy of the data.
    """
    cache = default_cache_dir()
    env = os.environ.get("LBTRAIN_DATA")
    first = data_dir or env or cache
    dirs = [Path(first).expanduser()]
    if first is not cache and not dirs[0].is_dir():
        named = f"--data-dir {str(data_dir)!r}" if data_dir else f"LBTRAIN_DATA={env!r}"
        found = "is a file" if dirs[0].exists() else "does not exist"
        raise DatasetError(
            f"{named} {found}; name the folder that holds the scene's .mat files, or leave it "
            f"unset to use the cache {str(cache)!r} (then tensorly's copy, then a download)"
        )
    if dirs[0] != cache:
        dirs.append(cache)
    return dirs


def tensorly_data_dir() -> Traversable | None:
    """``tensorly/datasets/data`` of an installed tensorly, as package data, or ``None``.

    Read through :mod:`importlib.resources`, so it works for any install layout (a wheel
    unpacked in site-packages, an egg, a zip); the arrays are then opened as resources.
    """
    if importlib.util.find_spec("tensorly") is None:
        return None
    try:
        folder = importlib.resources.files("tensorly").joinpath("datasets", "data")
    except (ImportError, OSError, ValueError):
        # A broken tensorly install must not stop the other sources from being tried.
        return None
    return folder if folder.is_dir() else None


def _verify(path: Path, file: SceneFile) -> None:
    wrong = digest_mismatch(path, file.sha256, file.git_sha1)
    if wrong is not None:
        raise DatasetError(
            f"checksum mismatch for {path}: {wrong}; "
            f"delete it and download it again from {file.url}"
        )


def _find_or_fetch(
    file: SceneFile,
    dirs: list[Path],
    download: bool,
    mirror: str | None,
    progress: TextIO | None,
) -> Path | None:
    for folder in dirs:
        candidate = folder / file.filename
        if candidate.is_file():
            _verify(candidate, file)
            return candidate
    if not download:
        return None
    url = mirror.rstrip("/") + "/" + file.filename if mirror else file.url
    try:
        return download_file(
            url,
            default_cache_dir() / file.filename,
            file.sha256,
            git_sha1=file.git_sha1,
            progress=progress,
            by_hand=dirs[0] / file.filename,  # the folder named by --data-dir or LBTRAIN_DATA
        )
    except DatasetError as exc:
        looked = ", ".join(str(d) for d in dirs)
        raise DatasetError(f"{file.filename} not found in {looked}, and {exc}") from exc


def _from_tensorly(info: SceneInfo) -> tuple[np.ndarray, np.ndarray, str] | None:
    if info.tensorly_npy is None:
        return None
    folder = tensorly_data_dir()
    if folder is None:
        return None
    cube_res, gt_res = (folder.joinpath(name) for name in info.tensorly_npy)
    if not (cube_res.is_file() and gt_res.is_file()):
        return None
    reading = cube_res  # named in the error message
    try:
        with cube_res.open("rb") as fh:
            cube = np.load(fh, allow_pickle=False)
        reading = gt_res
        with gt_res.open("rb") as fh:
            gt = np.load(fh, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DatasetError(
            f"tensorly's copy {reading} is corrupt ({exc}); reinstall tensorly or pass --data-dir"
        ) from exc
    return cube, gt, f"tensorly package data ({folder})"


def check_scene(cube: np.ndarray, gt: np.ndarray, info: SceneInfo, source: str) -> None:
    """Raise :class:`DatasetError` unless cube and ground truth fit together and the registry."""
    if cube.ndim != 3:
        raise DatasetError(
            f"{info.name} cube from {source} has shape {cube.shape}; expected (H, W, bands)"
        )
    if gt.shape != cube.shape[:2]:
        raise DatasetError(
            f"{info.name}: cube shape {cube.shape} and ground truth shape {gt.shape} differ "
            f"(from {source}); the two files belong to different scenes or one is damaged"
        )
    top = int(gt.max(initial=0))
    if int(gt.min(initial=0)) < 0 or top > info.num_classes:
        raise DatasetError(
            f"{info.name} ground truth from {source} has labels {int(gt.min())}..{top}; "
            f"expected 0..{info.num_classes}"
        )
    # A NaN or infinite value reaches every patch around its pixel and makes the loss NaN,
    # which the trainer would only stop after the expensive part began: refuse it here.
    bad = ~np.isfinite(cube).all(axis=2)
    if bad.any():
        raise DatasetError(
            f"{info.name} cube from {source} has {int(bad.sum())} pixel(s) with NaN or infinite "
            f"values (first at row {int(np.argwhere(bad)[0][0])}, column "
            f"{int(np.argwhere(bad)[0][1])}); repair or replace them in the file (for example "
            "with numpy.nan_to_num) before training"
        )


def load_scene(
    scene: str | SceneInfo,
    data_dir: str | Path | None = None,
    *,
    download: bool = True,
    mirror: str | None = None,
    progress: TextIO | None = sys.stderr,
) -> Scene:
    """Load a registered scene (``float32`` cube, ``int64`` ground truth).

    Args:
        scene: registry name (case-insensitive) or a :class:`SceneInfo`.
        data_dir: folder to search first; ``None`` uses ``$LBTRAIN_DATA`` or the cache.
        download: whether missing files may be downloaded into the cache.
        mirror: base URL replacing the official addresses (file names are kept).
        progress: stream for the download progress bar, ``None`` for silence.

    Raises:
        DatasetError: with a one-line explanation of what is wrong and how to fix it.
    """
    info = get_scene_info(scene) if isinstance(scene, str) else scene
    dirs = search_dirs(data_dir)
    cube_path = _find_or_fetch(info.cube, dirs, False, None, progress)
    gt_path = _find_or_fetch(info.gt, dirs, False, None, progress)
    if cube_path is None or gt_path is None:
        # Pairing a local .mat with tensorly's copy would mix sources; use the package
        # copy only when the folders hold neither file of the pair.
        shipped = _from_tensorly(info) if cube_path is None and gt_path is None else None
        if shipped is not None:
            cube, gt, source = shipped
            check_scene(cube, gt, info, source)
            return _make(info, cube, gt, source)
        if download:
            cube_path = cube_path or _find_or_fetch(info.cube, dirs, True, mirror, progress)
            gt_path = gt_path or _find_or_fetch(info.gt, dirs, True, mirror, progress)
        else:
            missing = info.cube if cube_path is None else info.gt
            looked = ", ".join(str(d) for d in dirs)
            raise DatasetError(
                f"{missing.filename} for scene {info.name} not found in {looked}; "
                f"download it from {missing.url} into one of those folders "
                "(or pass --data-dir / set LBTRAIN_DATA)"
            )
    assert cube_path is not None and gt_path is not None  # narrowed above, for type checkers
    cube = read_mat_array(cube_path, info.cube.key, info.cube.url)
    gt = read_mat_array(gt_path, info.gt.key, info.gt.url)
    source = str(cube_path.parent)
    check_scene(cube, gt, info, source)
    return _make(info, cube, gt, source)


def _make(info: SceneInfo, cube: np.ndarray, gt: np.ndarray, source: str) -> Scene:
    return Scene(
        name=info.name,
        cube=np.ascontiguousarray(cube, dtype=np.float32),
        gt=np.ascontiguousarray(gt, dtype=np.int64),
        class_names=info.class_names,
        rgb_bands=info.rgb_bands,
        source=source,
    )
