"""The communication term of the step-time model: one step's gradient sync."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CommCost"]


@dataclass(frozen=True)
class CommCost:
    """Seconds one step's gradient sync takes, as measured on a job of `world_size` ranks.

    Args:
        seconds: measured time of one step's sync (the gradient allreduce and the small
            per-step allreduce), on `world_size` ranks.
        world_size: ranks that took part in the measurement.
        nbytes: gradient bytes reduced per step.

    The sync starts when the slowest rank's compute ends, so a step takes
    max_i(compute_i) + `time(ranks)`.
    """

    seconds: float
    world_size: int
    nbytes: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, int | float) and math.isfinite(self.seconds)) or (
            self.seconds < 0
        ):
            raise ValueError(
                f"comm seconds={self.seconds!r} is invalid: it must be a finite number >= 0"
            )
        if (
            isinstance(self.world_size, bool)
            or not isinstance(self.world_size, int)
            or (self.world_size < 1)
        ):
            raise ValueError(f"comm world_size={self.world_size!r} must be an integer >= 1")
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes < 0:
            raise ValueError(f"comm nbytes={self.nbytes!r} must be an integer >= 0")

    def time(self, ranks: int) -> float:
        """Predicted sync seconds when `ranks` ranks reduce the gradients.

        One rank has nothing to reduce. Between `world_size` and another count >= 2 the time
        scales like a ring allreduce, where each rank moves 2 (k - 1) / k of the bytes: a
        model of how the network behaves, used only to compare launches of fewer ranks.
        """
        if ranks <= 1:
            return 0.0
        if self.world_size <= 1 or ranks == self.world_size:
            return float(self.seconds)
        measured = (self.world_size - 1) / self.world_size
        return float(self.seconds) * ((ranks - 1) / ranks) / measured

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommCost:
        """Rebuild from `to_dict`."""
        return cls(**data)
