"""The hyperspectral application as an lbtrain workload (the adapter: with artifacts.py, the
modules here that import lbtrain besides the CLI alias).

Declared as the entry point ``hyperspectral = "hyperspectral.workload:plugin"`` in the group
``lbtrain.workloads``, so ``lbtrain train --workload hyperspectral --dataset pavia_u`` finds it
without lbtrain importing this package. The trainer calls :data:`plugin`'s ``fetch`` on rank 0
(downloads the scene into the cache once), then ``build`` on every rank with the same seed:

- the split, the preprocessing (fitted on training pixels only) and the datasets are
  identical on every rank;
- ``build_model`` does not seed: the trainer seeds torch before calling it and broadcasts
  rank 0's weights;
- ``predict_set`` is every pixel in row-major order and ``predict_unit`` the scene width, so
  ranks predict whole rows of the map (None with ``map`` off: nothing needs them);
- ``artifacts`` (rank 0, after the final evaluation) prints the per-class table and writes
  it (``metrics.txt``), ``split.npz`` and ``map.png`` into the run's folder.

Every option is checked before the scene is loaded where it can be, and a bad value is a
one-line ``ValueError`` naming the flag, the value and what to use instead (the converters
are in :mod:`hyperspectral.options`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lbtrain.workloads import (
    ConfusionEvaluator,
    Workload,
    WorkloadOption,
    WorkloadPlugin,
    keep_batch,
)

from .artifacts import artifacts_hook
from .checks import (
    check_sizes,
    check_split,
    check_split_options,
    new_model,
    published_shape,
    warn_untested,
)
from .datasets import get_scene, load_scene, search_dirs
from .maps import require_matplotlib
from .metrics import metrics_from_confusion
from .models import MODELS, member_correct_predictions, member_cross_entropy
from .options import (
    parse_bool,
    parse_choice,
    parse_dataset,
    parse_float,
    parse_int,
    parse_path,
)
from .patches import MemberBatches
from .pipeline import DATASET_NAMES, prepare, split_scene
from .splits import SPLIT_KINDS, guard_note, split_digest

__all__ = ["ARTIFACTS", "NAME", "build", "fetch", "plugin"]

NAME = "hyperspectral"
ENSEMBLE_BATCHES = ("own", "shared")

# The files the artifacts hook writes into the run folder.
ARTIFACTS = ("metrics.txt", "split.npz", "split.json", "map.png")


_MODELS_HELP = "; ".join(
    f"{k}: {v.description}, patch {v.patch_size}, PCA {v.pca or 'off'}" for k, v in MODELS.items()
)

OPTIONS: tuple[WorkloadOption, ...] = (
    WorkloadOption(
        "dataset",
        "indian_pines",
        f"scene: {', '.join(DATASET_NAMES)} (synthetic: a generated 48x48 scene with 32 bands "
        "and 4 classes, the same for every seed)",
        type=parse_dataset,
    ),
    WorkloadOption(
        "data_dir",
        None,
        "folder holding the scene's .mat files; default $LBTRAIN_DATA, then ~/.cache/lbtrain, "
        "then tensorly's Indian Pines copy, then a download",
        type=parse_path("data_dir"),
    ),
    WorkloadOption(
        "download", True, "download missing scene files into the cache (rank 0 only)", type=bool
    ),
    WorkloadOption(
        "model", "hybridsn", _MODELS_HELP, type=parse_choice("model", MODELS), choices=tuple(MODELS)
    ),
    WorkloadOption(
        "patch_size",
        None,
        "odd patch edge in pixels; default the model's reference size",
        type=parse_int("patch_size", 1, optional=True, odd=True),
    ),
    WorkloadOption(
        "pca",
        None,
        "PCA components fitted on training pixels, 0 to keep the bands; default the model's "
        "reference ("
        + ", ".join(f"{name} {spec.pca or 'none'}" for name, spec in MODELS.items())
        + ")",
        type=parse_int("pca", 0, optional=True),
    ),
    WorkloadOption(
        "split",
        "random",
        "random: stratified by --train-ratio; fixed: --train-per-class pixels per class; "
        "disjoint: spatially separated train and test regions",
        type=parse_choice("split", SPLIT_KINDS),
        choices=SPLIT_KINDS,
    ),
    WorkloadOption(
        "train_ratio",
        0.1,
        "share of each class used for training (random and disjoint splits)",
        type=parse_float("train_ratio", 0.0, 1.0, low_open=True),
    ),
    WorkloadOption(
        "train_per_class",
        None,
        "training pixels per class (fixed split)",
        type=parse_int("train_per_class", 1, optional=True),
    ),
    WorkloadOption(
        "split_file",
        None,
        "reuse the split.npz of an earlier run (overrides --split, --train-ratio and "
        "--train-per-class), so runs are comparable",
        type=parse_path("split_file"),
    ),
    WorkloadOption(
        "dropout",
        None,
        "dropout probability of the model (0 = off); default the model's reference (0.1 for "
        "ssftt, 0.4 otherwise)",
        type=parse_float("dropout", 0.0, 1.0, low_open=False, optional=True),
    ),
    WorkloadOption(
        "ensemble",
        1,
        "train this many copies of the model side by side, each from its own initial "
        "weights, on its own loss and (see --ensemble-batches) its own batches, and predict "
        "with their mean probability (a deep "
        "ensemble): N times the compute and memory of one model, and usually a higher "
        "accuracy; 1 = one model",
        type=parse_int("ensemble", 1),
    ),
    WorkloadOption(
        "ensemble_batches",
        "own",
        "with --ensemble: own: each member reads the training samples in its own order, so "
        "the members differ in their batches as well as their initial weights; shared: "
        "every member reads the same batches (as runs before this option did: resume "
        "their checkpoints with it)",
        type=parse_choice("ensemble_batches", ENSEMBLE_BATCHES),
        choices=ENSEMBLE_BATCHES,
    ),
    WorkloadOption(
        "map", True, "predict every pixel at the end and draw map.png (needs matplotlib)", type=bool
    ),
)


def _convert(options: Mapping[str, Any]) -> dict[str, Any]:
    """Every option through its converter, so Python callers get the CLI's checks too."""
    out = {}
    for option in OPTIONS:
        value = options[option.name]
        if option.type is bool:
            out[option.name] = parse_bool(option.name, value)
        elif value is None:
            out[option.name] = None
        else:
            out[option.name] = option.type(value)
    return out


# ---------------------------------------------------------------------------------------
# The plug-in's two steps.


def _settle(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options over their defaults, converted and checked as far as the registry allows.

    Nothing is read or downloaded yet. ``patch_size`` and ``pca`` come back resolved: the
    model's reference when unset, and ``pca`` None when PCA is off.
    """
    opts = _convert(plugin.resolve_options(options))
    spec = MODELS[opts["model"]]
    if opts["ensemble_batches"] == "shared" and opts["ensemble"] == 1:
        # Recorded in config.toml and compared between runs, it would say something untrue.
        raise ValueError(
            "--ensemble-batches shared applies to an ensemble, and --ensemble is 1 (one "
            "model); give --ensemble N with N >= 2, or leave --ensemble-batches out"
        )
    if not spec.spatial and opts["patch_size"] not in (None, 1):
        raise ValueError(
            f"--patch-size {opts['patch_size']}: --model {opts['model']} reads only the centre "
            "pixel's spectrum, so a larger patch would be ignored; leave --patch-size unset "
            f"(1), or choose a model that reads patches: "
            f"{', '.join(k for k, v in MODELS.items() if v.spatial)}"
        )
    if opts["patch_size"] is None:
        opts["patch_size"] = spec.patch_size
    opts["pca"] = spec.pca if opts["pca"] is None else (opts["pca"] or None)
    if opts["dropout"] is None:
        opts["dropout"] = spec.dropout
    split_file = opts["split_file"]
    if opts["map"]:
        require_matplotlib()  # fail now, not after a long training run
    check_split_options(opts)
    if split_file is not None and not Path(split_file).is_file():
        raise ValueError(
            f"--split-file {split_file}: no such file; pass the split.npz that an earlier run "
            "wrote into its output folder"
        )
    if opts["dataset"] == "synthetic":
        if opts["data_dir"] is not None:
            raise ValueError(
                f"--data-dir {opts['data_dir']!r} is not used by the synthetic scene, which "
                "is generated; drop it, or choose a --dataset read from files"
            )
    else:
        search_dirs(opts["data_dir"])  # a mistyped folder fails now, not by falling back
    check_sizes(opts["dataset"], published_shape(opts["dataset"]), opts)
    return opts


def fetch(**options: Any) -> None:
    """Check the options, then make sure the scene's files are on disk (downloaded if allowed).

    Rank 0 runs this alone before any rank builds, so a later `get_scene` on every rank
    finds the files. The synthetic scene needs nothing.
    """
    opts = _settle(options)
    if opts["dataset"] != "synthetic":
        load_scene(opts["dataset"], opts["data_dir"], download=opts["download"])


def build(seed: int = 0, **options: Any) -> Workload:
    """Load, split, preprocess and wrap the scene as an lbtrain Workload.

    Args:
        seed: seed of the split and the PCA solver (the same on every rank).
        **options: the values of :data:`OPTIONS`, by name; missing ones take their default.

    Raises:
        ValueError: a bad option (one line naming the flag), a scene that cannot be read,
            or a split that leaves a class without training or test pixels.
        MissingDependencyError: ``map`` is on and matplotlib is missing.
    """
    opts = _settle(options)
    model, patch, pca, split_file = (opts[k] for k in ("model", "patch_size", "pca", "split_file"))
    # The synthetic scene is the same whatever the seed, so a saved split fits every run.
    scene = get_scene(opts["dataset"], opts["data_dir"], download=opts["download"])
    h, w = scene.shape
    if (h, w, scene.bands) != published_shape(opts["dataset"]):
        # The file read is not the published scene: check it too.
        check_sizes(scene.name, (h, w, scene.bands), opts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split = split_scene(
            scene,
            opts["split"],
            train_ratio=opts["train_ratio"],
            per_class=opts["train_per_class"],
            split_file=split_file,
            patch_size=patch,
            seed=seed,
        )
    origin = f"--split-file {split_file}" if split_file else f"the {opts['split']} split"
    # A class left without pixels is one error line, not a warning per class and then it.
    check_split(split, scene.gt, scene.class_names, origin)
    names = dict(enumerate(scene.class_names, start=1))
    for caught_warning in caught:
        warnings.warn(_in_flags(str(caught_warning.message), names), stacklevel=2)
    if split_file:
        warn_untested(split, split_file)
    if pca is not None and pca > split.train.size:
        raise ValueError(
            f"--pca {pca} is more than the {split.train.size} training pixels; use 1.."
            f"{split.train.size}, 0 to keep the bands, or a larger --train-ratio"
        )
    data = prepare(scene, split, patch, pca, seed=seed)
    channels, classes, dropout = data.bands, scene.num_classes, opts["dropout"]
    members = opts["ensemble"]
    own = members > 1 and opts["ensemble_batches"] == "own"
    train_set = MemberBatches(data.train_set, members, seed) if own else data.train_set

    def build_model_fn() -> nn.Module:
        # No seeding here: the trainer seeds torch, builds, and broadcasts rank 0's weights.
        return new_model(model, channels, classes, patch, dropout, members, own)

    return Workload(
        name=NAME,
        build_model=build_model_fn,
        # A sample as the model trains on it: one patch per member with their own batches.
        sample_shape=(members, channels, patch, patch) if own else (channels, patch, patch),
        num_classes=classes,
        # Plain cross-entropy for one model; each member's own, averaged, for an ensemble.
        loss_fn=member_cross_entropy,
        # What profiling times; the reference recipe of all three models is Adam at 1e-3.
        build_optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
        train_set=train_set,
        eval_set=data.test_set,
        evaluator=ConfusionEvaluator(
            classes, summarize=metrics_from_confusion, headline=("oa", "aa", "kappa")
        ),
        step_metric=member_correct_predictions,
        # Only the map needs every pixel predicted; without it the trainer can skip that pass.
        predict_set=data.predict_set() if opts["map"] else None,
        predict_unit=w,
        predict_note="every pixel of the scene for the map (--no-map skips it)",
        collate_fn=keep_batch,
        artifacts=artifacts_hook(scene, split, opts["map"], _model_label(model, patch, members)),
        outputs=ARTIFACTS,
        signature={
            "dataset": scene.name,
            "model": model,
            "patch_size": patch,
            "bands": channels,
            "num_classes": classes,
            "split": split.meta.get("kind", opts["split"]),
            # The exact pixels: resuming on another split would score trained-on pixels.
            "split_digest": split_digest(split),
            **({"ensemble": members} if members > 1 else {}),
            **({"ensemble_batches": opts["ensemble_batches"]} if members > 1 else {}),
        },
        # What checkpoints from before these options trained: one model; shared batches.
        signature_defaults={"ensemble": 1, "ensemble_batches": "shared"},
        description=(
            f"{scene.name} {scene.cube.shape} from {scene.source}: {len(data.train_set)} train "
            f"/ {len(data.test_set)} test pixels{guard_note(split)}, {channels} channels, "
            f"model {_model_label(model, patch, members)}"
        ),
    )


def _model_label(model: str, patch: int, members: int) -> str:
    """``ssftt x5, patch 13``: the model as the map's title names it."""
    return f"{model}{f' x{members}' if members > 1 else ''}, patch {patch}"


plugin = WorkloadPlugin(
    build=build,
    options=OPTIONS,
    fetch=fetch,
    description="hyperspectral land-cover classification of one scene's pixels (patches)",
)


def _in_flags(message: str, names: dict[int, str]) -> str:
    """The split's warning in the command line's words: its flag, and each class's name."""

    def named(match: re.Match[str]) -> str:
        number, bracket = int(match.group(1)), match.group(2)
        if number not in names:
            return match.group(0)
        # "class 7 (28 pixels)" becomes "class 7 (Grass-pasture-mowed, 28 pixels)".
        return f"class {number} ({names[number]}" + (", " if bracket else ")")

    message = message.replace("per_class=", "--train-per-class ")
    return re.sub(r"\bclass (\d+)( \()?", named, message)
