"""Classification metrics computed from a confusion matrix.

Working from the confusion matrix lets distributed ranks sum their matrices and compute
the metrics once: OA, AA and kappa are not averages of per-rank values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["confusion_matrix", "metrics_from_confusion", "format_table", "write_metrics"]


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """(K, K) ``int64`` counts; rows are true classes 0..K-1, columns predictions."""
    from sklearn.metrics import confusion_matrix as sk_confusion

    return sk_confusion(
        np.asarray(y_true), np.asarray(y_pred), labels=np.arange(num_classes)
    ).astype(np.int64)


def metrics_from_confusion(cm: np.ndarray) -> dict[str, Any]:
    """Overall accuracy, average accuracy, Cohen's kappa and per-class accuracy.

    AA is the mean of the per-class recalls (diagonal over row sums) over classes that have
    test samples; classes without samples get ``None`` and are left out of AA.

    Returns:
        A JSON-ready dict: ``oa``, ``aa``, ``kappa``, ``per_class_accuracy``, ``support``,
        ``total`` and ``confusion_matrix``.
    """
    cm = np.asarray(cm, dtype=np.float64)
    if cm.ndim != 2 or cm.shape[0] != cm.shape[1]:
        raise ValueError(f"confusion matrix must be square, got shape {cm.shape}")
    total = cm.sum()
    if total == 0:
        raise ValueError("confusion matrix is empty: no test samples were evaluated")
    support = cm.sum(axis=1)
    diag = np.diag(cm)
    oa = diag.sum() / total
    present = support > 0
    per_class = np.where(present, diag / np.maximum(support, 1), np.nan)
    aa = float(np.nanmean(per_class))
    expected = (support * cm.sum(axis=0)).sum() / total**2
    kappa = (oa - expected) / (1 - expected) if expected < 1 else 1.0
    return {
        "oa": float(oa),
        "aa": aa,
        "kappa": float(kappa),
        "per_class_accuracy": [None if np.isnan(a) else float(a) for a in per_class],
        "support": [int(s) for s in support],
        "total": int(total),
        "confusion_matrix": cm.astype(np.int64).tolist(),
    }


def format_table(metrics: dict[str, Any], class_names: Sequence[str] | None = None) -> str:
    """A plain-text report: per-class accuracy and support, OA and AA in %, kappa in [-1, 1]."""
    acc, support = metrics["per_class_accuracy"], metrics["support"]
    names = list(class_names) if class_names else [f"class {i + 1}" for i in range(len(acc))]
    width = max(12, *(len(n) for n in names))
    lines = [f"{'#':>3}  {'class':<{width}}  {'accuracy %':>10}  {'support':>7}"]
    for i, (name, a, s) in enumerate(zip(names, acc, support, strict=True), start=1):
        shown = "-" if a is None else f"{100 * a:.2f}"
        lines.append(f"{i:>3}  {name:<{width}}  {shown:>10}  {s:>7}")
    lines.append("")
    lines.append(f"OA    {100 * metrics['oa']:.2f} %")
    lines.append(f"AA    {100 * metrics['aa']:.2f} %")
    lines.append(f"kappa {metrics['kappa']:.4f}")
    return "\n".join(lines) + "\n"


def write_metrics(
    metrics: dict[str, Any],
    out_dir: str | Path,
    class_names: Sequence[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write ``metrics.json`` (metrics plus ``extra``) and ``metrics.txt`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = dict(metrics)
    if class_names is not None:
        payload["class_names"] = list(class_names)
    payload.update(extra or {})
    json_path, txt_path = out / "metrics.json", out / "metrics.txt"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    txt_path.write_text(format_table(metrics, class_names))
    return json_path, txt_path
