"""The run's outputs on rank 0: the per-class table, the split and the map.

With :mod:`hyperspectral.workload`, the only modules here that import lbtrain.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lbtrain.outputs import atomic_write
from lbtrain.workloads import ArtifactContext

from .datasets import Scene
from .maps import save_map
from .metrics import format_table
from .splits import Split, save_split, split_counts

__all__ = ["artifacts_hook"]


def artifacts_hook(
    scene: Scene, split: Split, draw_map: bool, model: str
) -> Callable[[ArtifactContext], list[Path]]:
    """The rank-0 hook; it keeps three bands for the false-colour panel, not the raw cube.

    ``model`` names the model in the map's title (the trainer's title names the job only).
    """
    name, shape = scene.name, scene.shape
    gt, class_names, bands = scene.gt, scene.class_names, scene.rgb_bands
    rgb = np.ascontiguousarray(scene.cube[..., list(bands)]) if draw_map else None
    # Errors are counted on the split's test pixels only: training pixels are not errors.
    test = np.zeros(shape[0] * shape[1], dtype=bool)
    test[split.test] = True
    test = test.reshape(shape)
    guard = np.zeros(shape[0] * shape[1], dtype=bool)
    guard[split.guard] = True
    guard = guard.reshape(shape)
    counts = json.dumps(split_counts(split, gt, class_names), indent=2) + "\n"

    def artifacts(ctx: ArtifactContext) -> list[Path]:
        out = Path(ctx.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        metrics = dict(ctx.metrics)
        table = format_table(metrics, class_names)
        # Printed too: the run summary that follows shows only OA, AA and kappa.
        print("\n" + table, end="", flush=True)
        written = [
            atomic_write(out / "metrics.txt", lambda p: p.write_text(table)),
            atomic_write(out / "split.npz", lambda p: save_split(split, p)),
            atomic_write(out / "split.json", lambda p: p.write_text(counts)),
        ]
        if draw_map and ctx.predictions is not None:
            predicted = np.asarray(ctx.predictions)
            if predicted.size != shape[0] * shape[1]:
                raise ValueError(
                    f"got {predicted.size} predictions for the {shape[0]}x{shape[1]} map of "
                    f"{name}; predict every item of the workload's predict_set"
                )
            title = (
                f"{name}, {model}{f' ({ctx.title})' if ctx.title else ''}: "
                f"OA {100 * metrics['oa']:.2f}%  "
                f"AA {100 * metrics['aa']:.2f}%  kappa {metrics['kappa']:.4f}"
            )
            written.append(
                atomic_write(
                    out / "map.png",
                    lambda p: save_map(
                        p,
                        rgb,
                        gt,
                        predicted.reshape(shape),
                        class_names,
                        bands=bands,
                        test=test,
                        guard=guard,
                        title=title,
                    ),
                )
            )
        return written

    return artifacts
