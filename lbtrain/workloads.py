"""Workloads: what lbtrain profiles and trains, without lbtrain importing the application.

A `Workload` bundles a model factory, the shape of one sample, the number of classes, a loss
and an optimizer factory; for training it also carries the datasets, an evaluator whose state
is a summable array, and an optional rank-0 hook for artifacts. Applications make theirs
available in one of three ways, none of which needs lbtrain to import them:

- call `register_workload("name", factory)` at import time of their own package;
- declare an entry point in the group "lbtrain.workloads" (``name = "pkg.module:factory"``);
- or be named on the command line as ``--workload pkg.module:factory``.

A factory is either a callable with no required arguments that returns a Workload, or a
`WorkloadPlugin`: a builder that takes the workload's own options (declared as
`WorkloadOption`s, which the CLI turns into flags) and an optional `fetch` step that
downloads data once, on rank 0, before every rank builds.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from lbtrain.evaluation import ArtifactContext, ConfusionEvaluator, Evaluator

__all__ = [
    "ENTRY_POINT_GROUP",
    "DEFAULT_WORKLOAD",
    "ArtifactContext",
    "ConfusionEvaluator",
    "Evaluator",
    "Workload",
    "WorkloadOption",
    "WorkloadPlugin",
    "available_workloads",
    "correct_predictions",
    "get_plugin",
    "keep_batch",
    "patch_cnn_workload",
    "register_workload",
    "toy_workload",
]

ENTRY_POINT_GROUP = "lbtrain.workloads"
# What `lbtrain train` trains, and so what `profile` and `balance-report` time, by default.
DEFAULT_WORKLOAD = "hyperspectral"

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def correct_predictions(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """How many of a classifier's arg-max predictions equal the targets (a `step_metric`)."""
    return float((outputs.detach().argmax(1) == targets).sum())


def _default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


@dataclass(frozen=True)
class Workload:
    """A model to train, how to make synthetic batches for it, and (to train) its data.

    Args:
        name: short name shown in profiles and reports.
        build_model: returns a fresh model (on the CPU; the caller moves it).
        sample_shape: shape of one input sample, without the batch dimension.
        num_classes: number of target classes; targets are integer class indices.
        loss_fn: loss on (outputs, targets), reduced by mean.
        build_optimizer: optimizer factory taking the model's parameters (used by the
            profile verbs; the trainer builds the optimizer its options ask for).
        input_dtype: dtype of synthetic inputs.
        train_set: map-style training dataset, identical on every rank (needed to train).
        eval_set: map-style evaluation dataset, identical on every rank.
        evaluator: scores eval_set; default a ConfusionEvaluator with overall accuracy.
        predict_set: optional dataset predicted as a whole for artifacts (a scene's every
            pixel); its targets are ignored.
        predict_unit: predict_set is cut between ranks at multiples of this many items (a
            scene row, so each rank predicts whole horizontal strips).
        collate_fn: collate function for the loaders; a dataset with a vectorised
            `__getitems__` that returns a whole batch passes `keep_batch`.
        artifacts: rank-0 hook called once after the final evaluation; returns the paths
            it wrote.
        outputs: names of the files `artifacts` writes into the run folder, so that an
            overwritten run's old ones are removed before the new run starts.
        signature: what identifies the trained model and data (dataset, model, sizes); a
            checkpoint whose signature differs is refused on resume, and every rank must
            build the same one.
        signature_defaults: what a key missing from a signature stands for: an option
            added later, which older checkpoints trained as if it had this value (and which
            a signature may leave out at it). The refusal names these values.
        description: one line about the data, printed at the start of training.
        step_metric: the training step's metric, summed over the batch (a classifier passes
            `correct_predictions`); the trainer reports its sum over the global batch divided
            by the samples as the epoch's training accuracy. None: no accuracy is reported.
        predict_note: what predicting predict_set is for, in the line the trainer prints
            before it ("every pixel of the scene, for the map"); default "the predict set".
    """

    name: str
    build_model: Callable[[], nn.Module]
    sample_shape: tuple[int, ...]
    num_classes: int
    loss_fn: LossFn = nn.functional.cross_entropy
    build_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] = field(
        default=_default_optimizer
    )
    input_dtype: torch.dtype = torch.float32
    train_set: Dataset | None = None
    eval_set: Dataset | None = None
    evaluator: Evaluator | None = None
    predict_set: Dataset | None = None
    predict_unit: int = 1
    collate_fn: Callable[[Any], Any] | None = None
    artifacts: Callable[[ArtifactContext], list[Path]] | None = None
    outputs: tuple[str, ...] = ()
    signature: Mapping[str, Any] = field(default_factory=dict)
    signature_defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    step_metric: Callable[[torch.Tensor, torch.Tensor], float] | None = None
    predict_note: str = ""  # last: a field added later, so positional builds keep their order

    def get_evaluator(self) -> Evaluator:
        """The workload's evaluator, or overall accuracy over num_classes."""
        return self.evaluator or ConfusionEvaluator(self.num_classes)

    def make_batch(
        self, batch_size: int, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Synthetic (inputs, targets) of `batch_size` samples on `device`.

        Profiling measures speed, which does not depend on the values, only on the shapes.
        Made on `device` itself: on the meta device (what-if's counts) that costs nothing,
        where a scene-sized batch drawn on the CPU first took 0.7 s.
        """
        inputs = torch.randn(batch_size, *self.sample_shape, dtype=self.input_dtype, device=device)
        targets = torch.randint(0, self.num_classes, (batch_size,), device=device)
        return inputs, targets


def keep_batch(batch: Any) -> Any:
    """Collate function for datasets whose `__getitems__` already returns a whole batch."""
    return batch


_NO_DEFAULT = object()


@dataclass(frozen=True)
class WorkloadOption:
    """One option of a workload, in the library's terms; the CLI shows it as --name-with-dashes.

    Args:
        name: a Python identifier, e.g. "patch_size" (the flag is --patch-size).
        default: the value when the option is not given (None: the workload decides).
        help: one sentence for --help.
        type: converts a command-line string (or a TOML value) to the option's value;
            `bool` makes an on/off flag pair (--name / --no-name).
        choices: allowed values, if the option is an enumeration.
    """

    name: str
    default: Any
    help: str
    type: Callable[[Any], Any] = str
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"workload option name {self.name!r} must be a Python identifier")

    @property
    def flag(self) -> str:
        """The command-line flag."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class WorkloadPlugin:
    """A workload with options of its own, as an entry point or registry value provides it.

    Args:
        build: `build(seed=..., **options)` returns the Workload; called on every rank, it
            must build identical datasets (and model initialisation) from the same seed.
        options: the options `build` accepts, with their defaults.
        fetch: `fetch(**options)` downloads or caches what `build` reads; the trainer calls
            it on rank 0 alone before any rank builds, so N ranks never download into one
            cache at once.
        description: one line for --help.
    """

    build: Callable[..., Workload]
    options: tuple[WorkloadOption, ...] = ()
    fetch: Callable[..., None] | None = None
    description: str = ""

    def defaults(self) -> dict[str, Any]:
        """Every option's default."""
        return {option.name: option.default for option in self.options}

    def resolve_options(self, given: Mapping[str, Any] | None) -> dict[str, Any]:
        """Defaults overridden by `given`; an unknown name is a ValueError naming the valid ones."""
        known = self.defaults()
        for name in given or {}:
            if name not in known:
                valid = ", ".join(sorted(known)) or "none"
                raise ValueError(
                    f"workload option {name!r} is unknown; this workload's options are: {valid}"
                )
        return {**known, **(given or {})}

    def make(self, seed: int = 0, options: Mapping[str, Any] | None = None) -> Workload:
        """Build the workload with `options` over the defaults."""
        workload = self.build(seed=seed, **self.resolve_options(options))
        if not isinstance(workload, Workload):
            raise ValueError(
                f"the workload plug-in returned {type(workload).__name__}, not an "
                "lbtrain.workloads.Workload"
            )
        return workload


def _plain(factory: Callable[[], Workload]) -> WorkloadPlugin:
    """Wrap a no-argument factory, which has no options and ignores the seed."""

    def build(seed: int = 0) -> Workload:
        return factory()

    return WorkloadPlugin(build=build)


class _ToyMLP(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def toy_workload(features: int = 64, hidden: int = 256, classes: int = 10) -> Workload:
    """A small MLP on synthetic vectors, for fast tests.

    Its steps take well under a millisecond on a CPU core, where timer, sleep and Python
    overheads rival the compute, so do not judge balancing by it; use "patch-cnn".

    Args:
        features: input vector length.
        hidden: width of the two hidden layers.
        classes: number of classes.
    """
    return Workload(
        name="toy",
        build_model=lambda: _ToyMLP(features, hidden, classes),
        sample_shape=(features,),
        num_classes=classes,
    )


class _PatchCNN(nn.Module):
    """Three unpadded 3x3 convolutions shrink a (bands, P, P) patch, then a linear classifier."""

    def __init__(self, bands: int, patch: int, width: int, classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels, size = bands, patch
        for _ in range(3):
            # Stop shrinking at 1x1 so small patches still work; pad from then on.
            padding = 0 if size >= 3 else 1
            layers += [nn.Conv2d(channels, width, 3, padding=padding), nn.ReLU()]
            channels, size = width, size - 2 + 2 * padding
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def patch_cnn_workload(
    bands: int = 30, patch: int = 7, width: int = 64, classes: int = 16
) -> Workload:
    """A small 2-D CNN on hyperspectral-like patches: the default workload to profile.

    Shaped like pixel-patch classification of a hyperspectral scene after PCA (Indian Pines
    has 16 classes; 30 components and 7x7 patches are common choices). A training step costs
    about 45 us per sample on one CPU core against a fixed cost under a millisecond, so
    steps at the profiled batch sizes take milliseconds to tens of milliseconds and grow
    close to linearly with the batch, as the step-time model t(b) = alpha + beta*b assumes.
    The more compute per sample, the less the fixed cost per step (Python, kernel launches,
    the caches a sleeping emulated rank finds cold) weighs against it.
    No batch normalisation: it saves extra activations and makes large batches spill the
    caches sooner, bending the line.

    Args:
        bands: spectral channels per patch.
        patch: patch edge in pixels (>= 1).
        width: convolution channels.
        classes: number of classes.
    """
    if patch < 1 or bands < 1 or width < 1 or classes < 2:
        raise ValueError(
            f"patch-cnn needs patch, bands, width >= 1 and classes >= 2; got patch={patch}, "
            f"bands={bands}, width={width}, classes={classes}"
        )
    return Workload(
        name="patch-cnn",
        build_model=lambda: _PatchCNN(bands, patch, width, classes),
        sample_shape=(bands, patch, patch),
        num_classes=classes,
    )


# Registry of in-process factories; it holds code, not rank state, so a module-level dict
# is fine here (like torch's backend registries).
_REGISTRY: dict[str, Callable[[], Workload] | WorkloadPlugin] = {
    "patch-cnn": patch_cnn_workload,
    "toy": toy_workload,
}


def register_workload(name: str, factory: Callable[[], Workload] | WorkloadPlugin) -> None:
    """Make `factory` selectable as `--workload name`.

    Args:
        name: the name; must not contain ':' (that form means module:function).
        factory: callable with no required arguments returning a Workload, or a
            WorkloadPlugin.
    """
    if not name or ":" in name:
        raise ValueError(f"workload name {name!r} is invalid: use a non-empty name without ':'")
    _REGISTRY[name] = factory


def available_workloads() -> list[str]:
    """Names of registered and entry-point workloads."""
    names = set(_REGISTRY)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _install_hint(ep: Any, exc: Exception) -> str:
    """The fix for an entry point that failed to load: lbtrain's own application misses its
    extra's packages (an install without [hyperspectral]); another package is the user's."""
    dist = getattr(getattr(ep, "dist", None), "name", None)
    if isinstance(exc, ImportError) and dist == "lbtrain":
        return (
            f"install its extra: pip install 'lbtrain[{ep.name}]' (or name another workload, "
            "e.g. --workload patch-cnn)"
        )
    return "fix or reinstall the package that provides it"


def get_plugin(spec: str) -> WorkloadPlugin:
    """Resolve `--workload` to its plug-in: a registered name, an entry point, or "module:function".

    A plain factory becomes a plug-in without options.

    Args:
        spec: the workload specification.
    """
    factory: Any = _REGISTRY.get(spec)
    if factory is None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == spec:
                try:
                    factory = ep.load()
                except Exception as exc:  # a broken plug-in package: name it, not a traceback
                    raise ValueError(
                        f"--workload {spec!r}: entry point {ep.value!r} failed to load ({exc}); "
                        f"{_install_hint(ep, exc)}"
                    ) from exc
                break
    if factory is None and ":" in spec:
        module_name, _, attribute = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
            factory = getattr(module, attribute)
        except (ImportError, AttributeError) as exc:
            raise ValueError(
                f"--workload {spec!r}: cannot load {attribute!r} from module {module_name!r} "
                f"({exc}); check the module is importable (a module of the current folder: run "
                "`python -m lbtrain ...` there, or set PYTHONPATH=.) and defines that function"
            ) from exc
    if factory is None:
        raise ValueError(
            f"--workload {spec!r} is unknown; choose one of {available_workloads()} or give "
            "'package.module:function' returning an lbtrain.workloads.Workload"
        )
    if isinstance(factory, WorkloadPlugin):
        return factory
    if not callable(factory):
        raise ValueError(
            f"--workload {spec!r} names a {type(factory).__name__}, not a function or an "
            "lbtrain.workloads.WorkloadPlugin"
        )
    return _plain(factory)
