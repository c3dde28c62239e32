"""Helpers shared by the hyperspectral tests: tiny scenes, fake .mat files, a loopback server."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import scipy.io

from hyperspectral.datasets import SceneFile, SceneInfo

__all__ = ["empty_dir", "fake_info", "write_fake_scene", "serve_directory"]


def empty_dir(parent: Path, name: str = "empty") -> Path:
    """A new empty folder: a --data-dir that holds no scene files."""
    folder = parent / name
    folder.mkdir(exist_ok=True)
    return folder


def fake_info(
    name: str = "Fake",
    cube_sha: str | None = None,
    gt_sha: str | None = None,
    base_url: str = "http://127.0.0.1:9/",
) -> SceneInfo:
    """A registry entry for a 6x5x4 scene with 3 classes stored as fake_cube.mat/fake_gt.mat."""
    return SceneInfo(
        name=name,
        cube=SceneFile("fake_cube.mat", "cube", base_url + "fake_cube.mat", cube_sha),
        gt=SceneFile("fake_gt.mat", "gt", base_url + "fake_gt.mat", gt_sha),
        class_names=("a", "b", "c"),
        rgb_bands=(0, 1, 2),
        shape=(6, 5, 4),
    )


def write_fake_scene(
    folder: Path, *, cube_key: str = "cube", gt_key: str = "gt", gt_shape: tuple[int, int] = (6, 5)
) -> tuple[np.ndarray, np.ndarray]:
    """Write fake_cube.mat and fake_gt.mat (MATLAB v5) into ``folder``; return the arrays."""
    rng = np.random.default_rng(0)
    cube = rng.integers(0, 1000, size=(6, 5, 4)).astype(np.uint16)
    gt = (np.arange(gt_shape[0] * gt_shape[1]) % 4).reshape(gt_shape).astype(np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(folder / "fake_cube.mat", {cube_key: cube})
    scipy.io.savemat(folder / "fake_gt.mat", {gt_key: gt})
    return cube, gt


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass


@contextlib.contextmanager
def serve_directory(
    folder: Path, handler: type[http.server.BaseHTTPRequestHandler] | None = None
) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 (random port) in a thread; yields the base URL."""
    cls = handler or functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), cls)
    # A short poll interval keeps shutdown (and so each test) fast.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
