"""What the balancer needs to know about one replica: its speed model and its cap."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from numbers import Real
from typing import Any, Protocol, runtime_checkable

from lbtrain.balancer.checks import real, whole

__all__ = ["ReplicaSpeed", "SupportsReplicaSpeed", "as_replica_speed"]


@dataclass(frozen=True)
class ReplicaSpeed:
    """Speed model of one replica: t(b) = alpha + beta * b seconds for a batch of b.

    Args:
        throughput: measured samples per second (> 0).
        alpha: fixed cost per step in seconds (>= 0). 0 when only a throughput is known.
        beta: seconds per sample (> 0). Defaults to 1 / throughput.
        cap: largest batch this replica may take (memory), or None for no cap.
    """

    throughput: float
    alpha: float = 0.0
    beta: float | None = None
    cap: int | None = None

    def __post_init__(self) -> None:
        # A wrong type is a TypeError naming the field; numpy scalars become Python numbers,
        # so plans stay JSON-serialisable.
        for name in ("throughput", "alpha", "beta"):
            if name != "beta" or self.beta is not None:  # beta None: 1 / throughput
                object.__setattr__(self, name, real(name, getattr(self, name)))
        if self.cap is not None:
            object.__setattr__(self, "cap", whole("cap", self.cap))
        if not _is_positive_finite(self.throughput):
            raise ValueError(
                f"throughput={self.throughput!r} is invalid: it must be a finite number of "
                "samples/s greater than 0; re-run profiling or pass positive speeds"
            )
        if not (_is_finite(self.alpha) and self.alpha >= 0):
            raise ValueError(
                f"alpha={self.alpha!r} is invalid: the fixed per-step time must be a finite "
                "number of seconds >= 0"
            )
        if self.beta is None:
            object.__setattr__(self, "beta", 1.0 / float(self.throughput))
        elif not _is_positive_finite(self.beta):
            raise ValueError(
                f"beta={self.beta!r} is invalid: seconds per sample must be finite and > 0"
            )
        if self.cap is not None and (
            isinstance(self.cap, bool) or not isinstance(self.cap, int) or self.cap < 1
        ):
            raise ValueError(
                f"cap={self.cap!r} is invalid: a batch-size cap must be an integer >= 1, "
                "or None for no cap"
            )

    def step_time(self, batch_size: int) -> float:
        """Predicted seconds for one step on `batch_size` samples."""
        return self.alpha + self.beta * batch_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


@runtime_checkable
class SupportsReplicaSpeed(Protocol):
    """Anything (such as a profiling record) that can describe itself as a ReplicaSpeed."""

    def replica_speed(self) -> ReplicaSpeed: ...


def as_replica_speed(entry: object, index: int = 0) -> ReplicaSpeed:
    """Normalise one entry of `ranks` into a ReplicaSpeed.

    Args:
        entry: a throughput in samples/s, a ReplicaSpeed, an object with `replica_speed()`,
            or a mapping with the ReplicaSpeed fields (as read back from JSON).
        index: position of the entry, used in error messages.
    """
    if isinstance(entry, ReplicaSpeed):
        return entry
    if isinstance(entry, SupportsReplicaSpeed):
        return entry.replica_speed()
    if isinstance(entry, Real) and not isinstance(entry, bool):
        if not _is_positive_finite(entry):
            raise ValueError(
                f"ranks[{index}]={entry!r} is not a valid throughput: each replica needs a "
                "finite speed in samples/s greater than 0"
            )
        return ReplicaSpeed(throughput=float(entry))
    if isinstance(entry, dict):
        fields = {"throughput", "alpha", "beta", "cap"}
        unknown = set(entry) - fields
        if unknown or "throughput" not in entry:
            raise ValueError(
                f"ranks[{index}] is a dict with keys {sorted(entry)}; expected 'throughput' "
                "and optionally 'alpha', 'beta', 'cap'"
            )
        return ReplicaSpeed(**entry)
    raise TypeError(
        f"ranks[{index}] has type {type(entry).__name__}; pass a throughput (samples/s), a "
        "ReplicaSpeed, or a profile record such as lbtrain.profiling.ReplicaProfile"
    )


def _is_finite(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_positive_finite(value: object) -> bool:
    return _is_finite(value) and value > 0
