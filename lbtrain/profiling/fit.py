"""Fit of the per-step time model t(b) = alpha + beta * b to measured step times."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LinearFit", "fit_step_time"]


@dataclass(frozen=True)
class LinearFit:
    """A fitted step-time model and how well it fits.

    Args:
        alpha: fixed seconds per step, 0 <= alpha <= the fastest step measured.
        beta: seconds per sample (> 0).
        r_squared: coefficient of determination of the returned line on the points, or None
            when it is undefined (a single point, or all times equal).
        relative_error: root-mean-square of (measured - fitted) / measured over the points;
            0.02 means the line is typically 2% off a measured median.
    """

    alpha: float
    beta: float
    r_squared: float | None
    relative_error: float

    def step_time(self, batch_size: float) -> float:
        """Fitted seconds for one step on `batch_size` samples."""
        return self.alpha + self.beta * batch_size


def fit_step_time(batch_sizes: Sequence[int], times: Sequence[float]) -> LinearFit:
    """Fit t(b) = alpha + beta * b, weighting relative errors, with physical bounds.

    Timing noise grows with the step, so a plain least-squares line is steered by the largest
    batches and its intercept, extrapolated across the ladder, can swing from 0 to several
    times the true fixed cost. Minimising relative errors, sum(((t_i - alpha - beta b_i) /
    t_i)^2), lets every rung count alike. The result is then held to what a step can be:
    alpha >= 0, alpha no more than the fastest step measured, and beta > 0.

    Args:
        batch_sizes: the batch sizes measured (at least one, all > 0).
        times: median seconds per step at each batch size (all > 0).

    Returns:
        The LinearFit, with its quality computed for the bounded line actually returned.
    """
    if len(batch_sizes) != len(times) or not batch_sizes:
        raise ValueError(
            f"need equally many batch sizes and times (got {len(batch_sizes)} and {len(times)})"
        )
    xs = [float(b) for b in batch_sizes]
    ys = [float(t) for t in times]
    if any(not (math.isfinite(x) and x > 0) for x in xs) or any(
        not (math.isfinite(y) and y > 0) for y in ys
    ):
        raise ValueError(f"batch sizes and times must be positive; got {xs} and {ys}")
    weights = [1.0 / (y * y) for y in ys]
    alpha, beta = _weighted_line(xs, ys, weights)
    if alpha < 0:
        alpha = 0.0
        beta = _slope_given_intercept(xs, ys, weights, alpha)
    # The fixed part of a step cannot exceed the whole of the fastest step.
    ceiling = min(ys)
    if alpha > ceiling:
        alpha = ceiling
        beta = _slope_given_intercept(xs, ys, weights, alpha)
    # A floor of 0.1% of the cheapest per-sample cost seen: small enough not to matter when
    # time does grow with b, large enough to keep beta > 0 where it does not (tiny GPU batches).
    floor = 1e-3 * min(y / x for x, y in zip(xs, ys, strict=True))
    if beta < floor:
        beta = floor
        alpha = min(ceiling, max(0.0, _intercept_given_slope(xs, ys, weights, beta)))
    return LinearFit(
        alpha=alpha,
        beta=beta,
        r_squared=_r_squared(xs, ys, alpha, beta),
        relative_error=math.sqrt(
            sum(((y - alpha - beta * x) / y) ** 2 for x, y in zip(xs, ys, strict=True)) / len(xs)
        ),
    )


def _weighted_line(xs: list[float], ys: list[float], ws: list[float]) -> tuple[float, float]:
    total = sum(ws)
    mean_x = sum(w * x for w, x in zip(ws, xs, strict=True)) / total
    mean_y = sum(w * y for w, y in zip(ws, ys, strict=True)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(ws, xs, strict=True))
    if sxx <= 0:
        # One distinct batch size: no slope can be fitted, so treat the step as all per-sample.
        return 0.0, mean_y / mean_x
    sxy = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(ws, xs, ys, strict=True))
    beta = sxy / sxx
    return mean_y - beta * mean_x, beta


def _slope_given_intercept(
    xs: list[float], ys: list[float], ws: list[float], alpha: float
) -> float:
    numerator = sum(w * x * (y - alpha) for w, x, y in zip(ws, xs, ys, strict=True))
    return numerator / sum(w * x * x for w, x in zip(ws, xs, strict=True))


def _intercept_given_slope(xs: list[float], ys: list[float], ws: list[float], beta: float) -> float:
    return sum(w * (y - beta * x) for w, x, y in zip(ws, xs, ys, strict=True)) / sum(ws)


def _r_squared(xs: list[float], ys: list[float], alpha: float, beta: float) -> float | None:
    if len(xs) < 2:
        return None
    mean_y = sum(ys) / len(ys)
    total = sum((y - mean_y) ** 2 for y in ys)
    if total == 0:
        return None
    residual = sum((y - alpha - beta * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return 1.0 - residual / total
