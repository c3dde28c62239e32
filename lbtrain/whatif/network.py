"""Alpha-beta (latency-bandwidth) models of an allreduce of `n` bytes over `p` ranks.

Every formula is from Thakur, Rabenseifner and Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 19(1), 2005, written with this library's units:
a message of m bytes costs ``alpha + m / beta`` seconds (alpha: latency in s, beta: link
bandwidth in bytes/s) and reducing m bytes costs ``m * gamma`` seconds (gamma in s/byte).
``L = ceil(log2 p)`` is the number of rounds of the log-depth algorithms; the paper's extra
rounds for a p that is not a power of two are folded into the ceiling, which keeps every
time non-decreasing in p.

The functions take scalars or numpy arrays for `n` and `p` (broadcast together) and return
a float for scalars, an array otherwise: a what-if over 100,000 devices or thousands of
message sizes is a handful of vector operations. One rank (p = 1) costs 0 everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "ALGORITHMS",
    "Best",
    "Link",
    "best",
    "binomial_tree",
    "broadcast",
    "crossover_bytes",
    "hierarchical",
    "rabenseifner",
    "recursive_doubling",
    "ring",
]

Seconds = float | NDArray[np.float64]


@dataclass(frozen=True)
class Link:
    """One level of the network, in SI units.

    Args:
        alpha: latency of one message, seconds (>= 0, finite).
        beta: bandwidth of one link, bytes per second (> 0; ``math.inf`` models a link whose
            transfer time is negligible).
        gamma: seconds to reduce (add) one byte on a rank (>= 0); 0 ignores the reduction.
    """

    alpha: float
    beta: float
    gamma: float = 0.0

    def __post_init__(self) -> None:
        if not _number(self.alpha) or not math.isfinite(self.alpha) or self.alpha < 0:
            raise ValueError(f"link alpha={self.alpha!r} must be a latency in seconds >= 0")
        if not _number(self.beta) or math.isnan(self.beta) or self.beta <= 0:
            raise ValueError(f"link beta={self.beta!r} must be a bandwidth in bytes/s > 0")
        if not _number(self.gamma) or not math.isfinite(self.gamma) or self.gamma < 0:
            raise ValueError(f"link gamma={self.gamma!r} must be seconds per byte >= 0")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Best(NamedTuple):
    """The fastest algorithm's time and name (arrays of both when the input was an array)."""

    seconds: Seconds
    algorithm: str | NDArray[np.str_]


def _args(n: ArrayLike, p: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    n_arr = np.asarray(n, dtype=np.float64)
    p_arr = np.asarray(p, dtype=np.float64)
    if np.any(~(n_arr >= 0)):  # also catches NaN
        raise ValueError("allreduce bytes n must be >= 0")
    if np.any(~(p_arr >= 1)) or np.any(p_arr != np.floor(p_arr)):
        raise ValueError("allreduce ranks p must be whole numbers >= 1")
    return n_arr, p_arr


def _out(values: NDArray[np.float64]) -> Seconds:
    return float(values) if np.ndim(values) == 0 else values


def _rounds(p: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.ceil(np.log2(p))


def ring(n: ArrayLike, p: ArrayLike, link: Link) -> Seconds:
    """Ring allreduce (ring reduce-scatter then ring allgather), Thakur et al. 2005:

    ``2 (p-1) alpha + 2 (p-1)/p n/beta + (p-1)/p n gamma``.
    """
    n, p = _args(n, p)
    share = (p - 1) / p * n
    return _out(2 * (p - 1) * link.alpha + share * (2 / link.beta + link.gamma))


def recursive_doubling(n: ArrayLike, p: ArrayLike, link: Link) -> Seconds:
    """Recursive-doubling allreduce, Thakur et al. 2005 section 4.5:

    ``L alpha + L n/beta + L n gamma`` with ``L = ceil(log2 p)``; best for short messages.
    """
    n, p = _args(n, p)
    return _out(_rounds(p) * (link.alpha + n / link.beta + n * link.gamma))


def binomial_tree(n: ArrayLike, p: ArrayLike, link: Link) -> Seconds:
    """Binomial-tree reduce then binomial-tree broadcast, Thakur et al. 2005:

    ``2 L alpha + 2 L n/beta + L n gamma`` with ``L = ceil(log2 p)``.
    """
    n, p = _args(n, p)
    rounds = _rounds(p)
    return _out(rounds * (2 * link.alpha + 2 * n / link.beta + n * link.gamma))


def rabenseifner(n: ArrayLike, p: ArrayLike, link: Link) -> Seconds:
    """Rabenseifner's allreduce (recursive-halving reduce-scatter, recursive-doubling
    allgather), Thakur et al. 2005 section 4.5:

    ``2 L alpha + 2 (p-1)/p n/beta + (p-1)/p n gamma`` with ``L = ceil(log2 p)``.
    """
    n, p = _args(n, p)
    share = (p - 1) / p * n
    return _out(2 * _rounds(p) * link.alpha + share * (2 / link.beta + link.gamma))


ALGORITHMS: dict[str, Callable[[ArrayLike, ArrayLike, Link], Seconds]] = {
    "ring": ring,
    "recursive-doubling": recursive_doubling,
    "binomial-tree": binomial_tree,
    "rabenseifner": rabenseifner,
}


def best(n: ArrayLike, p: ArrayLike, link: Link, algorithms: Iterable[str] | None = None) -> Best:
    """The fastest of `algorithms` (default: all of `ALGORITHMS`) for each (n, p).

    Ties go to the first name in order, so p = 1 (0 s under every algorithm) names "ring".
    """
    names = list(ALGORITHMS) if algorithms is None else list(algorithms)
    unknown = [name for name in names if name not in ALGORITHMS]
    if unknown or not names:
        raise ValueError(f"unknown allreduce algorithm {unknown}; choose from {list(ALGORITHMS)}")
    times = np.stack([np.asarray(ALGORITHMS[name](n, p, link)) for name in names])
    index = np.argmin(times, axis=0)
    seconds = np.take_along_axis(times, index[None, ...], axis=0)[0]
    chosen = np.asarray(names)[index]
    if np.ndim(seconds) == 0:
        return Best(float(seconds), str(chosen))
    return Best(seconds, chosen)


def broadcast(n: ArrayLike, p: ArrayLike, link: Link) -> Seconds:
    """The faster of the two broadcasts of Thakur et al. 2005 section 4.1:

    binomial tree ``L (alpha + n/beta)``, or scatter then ring allgather (van de Geijn)
    ``(L + p - 1) alpha + 2 (p-1)/p n/beta``.
    """
    n, p = _args(n, p)
    rounds = _rounds(p)
    tree = rounds * (link.alpha + n / link.beta)
    scatter_allgather = (rounds + p - 1) * link.alpha + 2 * (p - 1) / p * n / link.beta
    return _out(np.minimum(tree, scatter_allgather))


def hierarchical(
    n: ArrayLike,
    p: ArrayLike,
    per_node: ArrayLike,
    intra: Link,
    inter: Link,
    nodes: ArrayLike | None = None,
) -> Best:
    """Two-level allreduce over nodes of `per_node` ranks (the last node may hold fewer).

    1. the ranks of each node allreduce over `intra` (``g = min(per_node, p)`` ranks);
    2. one leader per node allreduces over `inter` (`nodes` leaders: default
       ``ceil(p / per_node)``; a cluster whose entries fill nodes of their own has more);
    3. each leader broadcasts the result over `intra` (skipped when there is one node).

    Each level uses its fastest algorithm (`best`, `broadcast`); the nodes run in parallel,
    so the fullest node sets the time. One node is the flat `intra` allreduce, one rank per
    node the flat `inter` one. The name reads ``"intra=ALGO; inter=ALGO"``.
    """
    n_arr, p_arr = _args(n, p)
    g_arr = np.asarray(per_node, dtype=np.float64)
    if np.any(~(g_arr >= 1)) or np.any(g_arr != np.floor(g_arr)):
        raise ValueError("ranks per node must be whole numbers >= 1")
    g = np.minimum(g_arr, p_arr)
    nodes = np.ceil(p_arr / g_arr) if nodes is None else np.asarray(nodes, dtype=np.float64)
    inside = best(n_arr, g, intra)
    across = best(n_arr, nodes, inter)
    spread = np.where(nodes > 1, broadcast(n_arr, g, intra), 0.0)
    seconds = np.asarray(inside.seconds) + np.asarray(across.seconds) + spread
    name = np.char.add(np.char.add("intra=", inside.algorithm), "; inter=")
    name = np.char.add(name, across.algorithm)
    if np.ndim(seconds) == 0:
        return Best(float(seconds), str(name))
    return Best(seconds, name)


def crossover_bytes(p: int, link: Link) -> float:
    """Message size (bytes) above which `ring` beats `recursive_doubling` on `p` ranks.

    Equating the two formulas: ``n* = alpha (2(p-1) - L) / (L (1/beta + gamma)
    - (p-1)/p (2/beta + gamma))``. ``math.inf`` when recursive doubling is never slower
    (p <= 2 with gamma = 0, or a per-byte cost no higher than the ring's).
    """
    if p <= 1:
        return math.inf
    rounds = math.ceil(math.log2(p))
    latency = link.alpha * (2 * (p - 1) - rounds)
    per_byte = rounds * (1 / link.beta + link.gamma) - (p - 1) / p * (2 / link.beta + link.gamma)
    if per_byte <= 0:
        return math.inf
    return max(latency, 0.0) / per_byte
