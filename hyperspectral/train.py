"""Single-process training: build the workload, train, evaluate, write outputs.

The workload (:func:`build_workload`) is the seam lbtrain's distributed trainer reuses: a
model, a training and a test :class:`~hyperspectral.patches.PatchDataset` and a loss.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .datasets import Scene, get_scene
from .maps import predict_scene, require_matplotlib, save_map
from .metrics import confusion_matrix, format_table, metrics_from_confusion, write_metrics
from .models import MODELS, build_model
from .patches import PatchDataset
from .pipeline import prepare, split_scene
from .preprocess import Preprocessor
from .splits import Split, save_split

__all__ = [
    "LR_SCHEDULES",
    "TrainConfig",
    "Workload",
    "build_workload",
    "train_model",
    "evaluate",
    "run_training",
]

LR_SCHEDULES = ("cosine", "constant")


def _say(line: str) -> None:
    # Flushed, so progress shows up promptly in a log file or under mpiexec.
    print(line, flush=True)


@dataclass
class TrainConfig:
    """Settings of one run, filled from flags by ``python -m hyperspectral train``."""

    scene: str = "IndianPines"
    data_dir: str | None = None
    download: bool = True
    model: str = "hybridsn"
    patch_size: int | None = None
    pca: int | None = None
    split: str = "random"
    train_ratio: float | None = 0.1
    train_per_class: int | None = None
    split_file: str | None = None
    epochs: int = 60
    batch_size: int = 64
    lr: float = 1e-3
    lr_schedule: str = "cosine"
    dropout: float = 0.4
    seed: int = 0
    out: str = "/tmp/hyperspectral-run"
    threads: int | None = None
    draw_map: bool = True

    def resolved(self) -> TrainConfig:
        """A copy with model defaults filled in and values checked."""
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        spec = MODELS[self.model]
        cfg = TrainConfig(**asdict(self))
        cfg.patch_size = spec.patch_size if cfg.patch_size is None else cfg.patch_size
        if cfg.patch_size < 1 or cfg.patch_size % 2 == 0:
            raise ValueError(
                f"--patch-size {cfg.patch_size} must be a positive odd number, e.g. 25"
            )
        cfg.pca = spec.pca if cfg.pca is None else (cfg.pca or None)
        for name in ("epochs", "batch_size"):
            if getattr(cfg, name) < 1:
                raise ValueError(f"{name}={getattr(cfg, name)} must be >= 1")
        if cfg.lr <= 0:
            raise ValueError(f"lr={cfg.lr} must be > 0")
        if cfg.lr_schedule not in LR_SCHEDULES:
            raise ValueError(
                f"lr_schedule={cfg.lr_schedule!r}; choose one of {', '.join(LR_SCHEDULES)}"
            )
        if cfg.threads is not None and cfg.threads < 1:
            raise ValueError(f"threads={cfg.threads} must be >= 1 (or unset for torch's choice)")
        return cfg


@dataclass
class Workload:
    """Everything a trainer needs, built identically on every rank from a config and seed."""

    scene: Scene
    split: Split
    preprocessor: Preprocessor
    padded: torch.Tensor
    model: nn.Module
    train_set: PatchDataset
    test_set: PatchDataset
    loss_fn: nn.Module
    patch_size: int


def build_workload(cfg: TrainConfig, scene: Scene | None = None) -> Workload:
    """Load the scene, split, fit preprocessing on training pixels, build datasets and model."""
    cfg = cfg.resolved()
    assert cfg.patch_size is not None  # resolved() fills it
    # The synthetic scene stays the same whatever --seed is, so runs with different seeds
    # (and a saved --split-file) refer to one scene.
    scene = scene or get_scene(cfg.scene, cfg.data_dir, download=cfg.download)
    split = split_scene(
        scene,
        cfg.split,
        train_ratio=cfg.train_ratio,
        per_class=cfg.train_per_class,
        split_file=cfg.split_file,
        patch_size=cfg.patch_size,
        seed=cfg.seed,
    )
    data = prepare(scene, split, cfg.patch_size, cfg.pca, seed=cfg.seed)
    torch.manual_seed(cfg.seed)  # model initialisation depends on it
    model = build_model(
        cfg.model,
        bands=data.bands,
        num_classes=scene.num_classes,
        patch_size=cfg.patch_size,
        dropout=cfg.dropout,
    )
    return Workload(
        scene,
        split,
        data.preprocessor,
        data.padded,
        model,
        data.train_set,
        data.test_set,
        nn.CrossEntropyLoss(),
        cfg.patch_size,
    )


def train_model(
    work: Workload,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    log: Callable[[str], None] = _say,
    lr_schedule: str = "cosine",
) -> list[dict[str, float]]:
    """Adam on shuffled mini-batches; returns per-epoch loss, accuracy and seconds.

    Args:
        work: model and training data.
        epochs: passes over the training set.
        batch_size: samples per step.
        lr: initial Adam learning rate.
        seed: seed of the shuffling.
        log: receives one progress line per epoch.
        lr_schedule: ``"cosine"`` decays the rate to 0 over all steps; ``"constant"`` keeps it.
            At a constant 1e-3, HybridSN's training loss on Indian Pines jumps every few
            dozen epochs, so where the run stops decides the score; decay removes that luck.
    """
    model, data = work.model, work.train_set
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * -(-len(data) // batch_size)
    sched = (
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        if lr_schedule == "cosine"
        else None
    )
    gen = torch.Generator().manual_seed(seed)
    history = []
    model.train()
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        perm = torch.randperm(len(data), generator=gen)
        loss_sum, correct = 0.0, 0
        for start in range(0, len(data), batch_size):
            x, y = data.batch(perm[start : start + batch_size])
            logits = model(x)
            loss = work.loss_fn(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            loss_sum += loss.item() * len(y)
            correct += int((logits.argmax(1) == y).sum())
        row = {
            "epoch": epoch,
            "loss": loss_sum / len(data),
            "train_acc": correct / len(data),
            "seconds": time.perf_counter() - t0,
        }
        history.append(row)
        left = (epochs - epoch) * sum(h["seconds"] for h in history) / epoch
        log(
            f"epoch {epoch:3d}/{epochs}  loss {row['loss']:.4f}  "
            f"train acc {100 * row['train_acc']:6.2f} %  {row['seconds']:.1f} s  "
            f"(about {left:.0f} s left)"
        )
    return history


@torch.inference_mode()
def evaluate(
    model: nn.Module, data: PatchDataset, num_classes: int, batch_size: int = 256
) -> np.ndarray:
    """Confusion matrix of ``model`` on ``data`` (sum these across ranks before metrics)."""
    was_training = model.training
    model.eval()
    preds = []
    for start in range(0, len(data), batch_size):
        x, _ = data.batch(torch.arange(start, min(start + batch_size, len(data))))
        preds.append(model(x).argmax(1))
    model.train(was_training)
    pred = torch.cat(preds).numpy() if preds else np.empty(0, dtype=np.int64)
    return confusion_matrix(data.targets.numpy(), pred, num_classes)


def run_training(
    cfg: TrainConfig, log: Callable[[str], None] = _say, scene: Scene | None = None
) -> dict[str, Any]:
    """Run one training job and write metrics, split and map into ``cfg.out``."""
    cfg = cfg.resolved()
    if cfg.draw_map:
        require_matplotlib()  # fail now, not after a long training run
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    work = build_workload(cfg, scene)
    s = work.scene
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    save_split(work.split, out / "split.npz")
    log(
        f"{s.name} {s.cube.shape} from {s.source}: {len(work.train_set)} train / "
        f"{len(work.test_set)} test pixels, {work.preprocessor.out_bands} channels, "
        f"model {cfg.model}, patch {work.patch_size}, threads {torch.get_num_threads()}"
    )
    history = train_model(work, cfg.epochs, cfg.batch_size, cfg.lr, cfg.seed, log, cfg.lr_schedule)
    t_train = time.perf_counter() - t_start
    t_eval = time.perf_counter()
    if cfg.draw_map:
        # One pass over the whole scene serves both the map and the test metrics.
        log(f"predicting all {s.shape[0] * s.shape[1]} pixels of the scene for the map ...")
        full = predict_scene(work.model, work.padded, s.shape, work.patch_size, cfg.batch_size)
        flat = full.ravel()
        cm = confusion_matrix(work.test_set.targets.numpy(), flat[work.split.test], s.num_classes)
    else:
        cm = evaluate(work.model, work.test_set, s.num_classes, cfg.batch_size)
    metrics = metrics_from_confusion(cm)
    log(f"evaluated in {time.perf_counter() - t_eval:.1f} s")
    wall = time.perf_counter() - t_start
    extra = {
        "config": asdict(cfg),
        "history": history,
        "train_seconds": t_train,
        "wall_seconds": wall,
        "source": s.source,
        "train_pixels": len(work.train_set),
        "test_pixels": len(work.test_set),
    }
    write_metrics(metrics, out, s.class_names, extra)
    if cfg.draw_map:
        title = (
            f"{s.name} {cfg.model}: OA {100 * metrics['oa']:.2f}%  "
            f"AA {100 * metrics['aa']:.2f}%  kappa {100 * metrics['kappa']:.2f}"
        )
        save_map(out / "map.png", s.cube, s.gt, full, s.class_names, s.rgb_bands, title)
    log(format_table(metrics, s.class_names))
    log(f"wall time {wall:.1f} s; outputs in {out}")
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return {**metrics, "wall_seconds": wall}
