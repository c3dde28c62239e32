"""Model registry: name -> factory with one uniform signature.

All models take ``float32`` patches shaped (N, C, P, P) and return (N, K) logits; an
:class:`Ensemble` of them returns (N, K, M) member logits while training (for
:func:`member_cross_entropy`) and (N, K) log mean probabilities in eval mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .ensemble import Ensemble, member_correct_predictions, member_cross_entropy
from .hamida import HamidaEtAl, build_hamida
from .hu import HuEtAl, build_hu
from .hybridsn import HybridSN, build_hybridsn
from .ssftt import SSFTT, build_ssftt

__all__ = [
    "MODELS",
    "ModelSpec",
    "build_model",
    "model_names",
    "HuEtAl",
    "HamidaEtAl",
    "HybridSN",
    "SSFTT",
    "Ensemble",
    "member_correct_predictions",
    "member_cross_entropy",
]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model.

    Args:
        factory: ``factory(*, bands, num_classes, patch_size, dropout) -> nn.Module``.
        patch_size: default (reference) patch size.
        pca: reference number of PCA components, ``None`` for raw bands.
        description: one line for ``--help``.
        spatial: whether the model reads the pixels around the centre; a model that does
            not (``hu``) takes patch 1 only, since a larger one would change nothing but
            the cost.
        dropout: reference dropout probability.
    """

    factory: Callable[..., nn.Module]
    patch_size: int
    pca: int | None
    description: str
    spatial: bool = True
    dropout: float = 0.4


MODELS: dict[str, ModelSpec] = {
    "hu": ModelSpec(
        build_hu, 1, None, "1-D spectral CNN (Hu et al. 2015), centre pixel only", spatial=False
    ),
    "hamida": ModelSpec(build_hamida, 5, None, "3-D CNN (Ben Hamida et al. 2018)"),
    "hybridsn": ModelSpec(build_hybridsn, 25, 30, "3-D + 2-D CNN (Roy et al. 2019)"),
    "ssftt": ModelSpec(
        build_ssftt,
        13,
        30,
        "spectral-spatial tokenizer transformer (Sun et al. 2022)",
        dropout=0.1,
    ),
}


def model_names() -> list[str]:
    """Registered model names."""
    return list(MODELS)


def build_model(
    name: str,
    *,
    bands: int,
    num_classes: int,
    patch_size: int | None = None,
    dropout: float | None = None,
    members: int = 1,
    own_batches: bool = False,
) -> nn.Module:
    """Build the registered model ``name``, or an :class:`Ensemble` of ``members`` of it.

    Args:
        name: a key of :data:`MODELS`.
        bands: input channels C (after PCA, if any).
        num_classes: number of classes K.
        patch_size: odd patch edge P; ``None`` uses the model's default.
        dropout: dropout probability in [0, 1); 0 makes the model deterministic; ``None``
            uses the model's reference.
        members: 1 for one model; more for a deep ensemble of that many, each from its own
            initial weights (train it with :func:`member_cross_entropy`).
        own_batches: an ensemble's members each read their own samples in training, (N, M,
            ...) inputs from :class:`hyperspectral.patches.MemberBatches`.

    Raises:
        ValueError: unknown name, or an invalid size or dropout.
    """
    try:
        spec = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None
    dropout = spec.dropout if dropout is None else dropout
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout={dropout} must be in [0, 1)")
    if bands < 1 or num_classes < 2:
        raise ValueError(f"need bands >= 1 and num_classes >= 2, got {bands} and {num_classes}")
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"members={members!r} must be a whole number >= 1")

    def one() -> nn.Module:
        return spec.factory(
            bands=bands,
            num_classes=num_classes,
            patch_size=patch_size or spec.patch_size,
            dropout=dropout,
        )

    return one() if members == 1 else Ensemble(one, members, own_batches)
