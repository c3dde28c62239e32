"""Hyperspectral scenes: registry, loaders with clear errors, and a synthetic generator."""

from __future__ import annotations

from pathlib import Path

from .errors import DatasetError
from .loader import default_cache_dir, load_scene, search_dirs, tensorly_data_dir
from .registry import SCENES, SceneFile, SceneInfo, get_scene_info, scene_names
from .scene import Scene
from .synthetic import make_synthetic_scene

__all__ = [
    "DatasetError",
    "SCENES",
    "Scene",
    "SceneFile",
    "SceneInfo",
    "default_cache_dir",
    "get_scene",
    "get_scene_info",
    "load_scene",
    "make_synthetic_scene",
    "scene_names",
    "search_dirs",
    "tensorly_data_dir",
]


def get_scene(
    name: str, data_dir: str | Path | None = None, *, download: bool = True, seed: int = 0
) -> Scene:
    """Load a registered scene by name, or ``"synthetic"`` for the generated one."""
    if name.lower() == "synthetic":
        return make_synthetic_scene(seed=seed)
    return load_scene(name, data_dir, download=download)
