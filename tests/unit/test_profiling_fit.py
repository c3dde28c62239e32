"""fit_step_time: exact recovery, fit quality, and the physical bounds on alpha and beta."""

from __future__ import annotations

import pytest

from lbtrain.profiling import LinearFit, fit_step_time


def test_recovers_alpha_and_beta_from_exact_data():
    sizes = [16, 32, 64, 128, 256]
    fit = fit_step_time(sizes, [0.002 + 0.0003 * b for b in sizes])
    assert fit.alpha == pytest.approx(0.002, rel=1e-9)
    assert fit.beta == pytest.approx(0.0003, rel=1e-9)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.relative_error == pytest.approx(0.0, abs=1e-12)
    assert fit.step_time(100) == pytest.approx(0.032)


def test_fit_quality_drops_with_noise():
    sizes = [10, 20, 40, 80]
    clean = fit_step_time(sizes, [0.001 * b for b in sizes])
    noisy = fit_step_time(
        sizes, [0.001 * b * f for b, f in zip(sizes, [1.3, 0.8, 1.2, 0.9], strict=True)]
    )
    assert noisy.r_squared < clean.r_squared
    assert 0.05 < noisy.relative_error < 0.3


def test_relative_weighting_keeps_one_noisy_large_rung_from_inventing_a_fixed_cost():
    # True t = 50 us/sample, no fixed cost; the largest rung is 10% slow (a burst of load).
    sizes = [32, 64, 128, 256, 512]
    times = [5e-5 * b for b in sizes]
    times[-1] *= 1.1
    fit = fit_step_time(sizes, times)
    # Plain least squares on these points gives a negative intercept and a slope 10% high;
    # relative weighting stays within a few percent of the truth at every rung but the last.
    assert fit.alpha < 0.05 * times[0]
    for b, t in zip(sizes[:-1], times[:-1], strict=True):
        assert fit.step_time(b) == pytest.approx(t, rel=0.05)


def test_negative_intercept_is_refitted_through_the_origin():
    fit = fit_step_time([10, 20, 40], [0.009, 0.020, 0.042])
    assert fit.alpha == 0.0
    assert fit.beta > 0


def test_alpha_never_exceeds_the_fastest_step_and_beta_stays_positive():
    # Falling times (noise at tiny GPU batches) would fit a negative slope.
    fit = fit_step_time([1, 2, 4, 8], [0.010, 0.009, 0.0095, 0.0085])
    assert 0 <= fit.alpha <= 0.0085
    assert fit.beta > 0
    flat = fit_step_time([1, 2, 4], [0.01, 0.01, 0.01])
    assert flat.beta > 0 and flat.alpha <= 0.01
    assert flat.r_squared is None  # all times equal: R^2 undefined


def test_single_point_is_all_per_sample():
    fit = fit_step_time([64], [0.032])
    assert fit == LinearFit(alpha=0.0, beta=0.0005, r_squared=None, relative_error=0.0)


@pytest.mark.parametrize(
    ("sizes", "times"),
    [([], []), ([1, 2], [0.1]), ([0, 2], [0.1, 0.2]), ([1, 2], [0.1, -0.2]), ([1], [float("nan")])],
)
def test_rejects_bad_input(sizes, times):
    with pytest.raises(ValueError):
        fit_step_time(sizes, times)
