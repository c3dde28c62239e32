"""Every rank must train on the data rank 0 built: sizes and the workload's signature.

Each rank builds its own copy of the workload (its own files, on its own node). A copy that
differs would let the sampler's indices pick other samples on that rank, with no error; the
trainer compares them once, before profiling, and stops the job with one line.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lbtrain.workloads import Workload

__all__ = ["check_same_data", "data_identity", "same_value"]


def data_identity(workload: Workload) -> dict[str, Any]:
    """What every rank's copy of the data must agree on: its sizes and the workload's
    signature (the hyperspectral one holds a fingerprint of the split's pixels)."""
    return {
        "training samples": len(workload.train_set),  # type: ignore[arg-type]
        "evaluation samples": len(workload.eval_set),  # type: ignore[arg-type]
        **{str(k): v for k, v in dict(workload.signature).items()},
    }


def check_same_data(built: list[dict[str, Any]]) -> None:
    """Every rank built the data rank 0 built; else the sampler's indices would pick other
    samples on each rank, with no error. One line naming the first rank that differs."""
    for rank, theirs in enumerate(built[1:], start=1):
        keys = dict.fromkeys([*built[0], *theirs])
        differ = [k for k in keys if not same_value(theirs.get(k), built[0].get(k))]
        if differ:
            diff = ", ".join(f"{k} {theirs.get(k)!r} (rank 0: {built[0].get(k)!r})" for k in differ)
            raise ValueError(
                f"rank {rank} built other data than rank 0: {diff}; every rank must read the "
                "same data: check the data files, the workload's options and the seed on "
                "every node"
            )


def same_value(a: Any, b: Any) -> bool:
    """Equality for signature values as ranks build them: NaN equals NaN, floats within
    1e-9 of each other (a statistic summed in another order), arrays and tensors by value."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "shape") or hasattr(b, "shape"):  # numpy arrays, torch tensors
        try:
            x, y = _array(a), _array(b)
        except (TypeError, RuntimeError, NotImplementedError):  # bf16, sparse, meta tensors
            return a is b
        try:
            return bool(np.array_equal(x, y, equal_nan=True))
        except TypeError:  # not numbers: equal_nan does not apply
            return bool(np.array_equal(x, y))
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return a is b


def _array(value: Any) -> np.ndarray:
    # A tensor may sit on a GPU, which numpy cannot read.
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)
