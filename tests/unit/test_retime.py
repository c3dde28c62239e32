"""retime_profiles / add_measurement / outside_measured on fake clocks and fake ranks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from lbtrain import SingleProcessCommunicator
from lbtrain.emulation import Slowdown
from lbtrain.profiling import (
    ProfileConfig,
    add_measurement,
    fit_step_time,
    outside_measured,
    retime_profiles,
)
from tests.unit.test_profiling import (
    ALPHA,
    BETA,
    FakeClock,
    _assert_same,
    _profile,
    _state,
    make_batch,
    run_profile,
    trained_setup,
)

CONFIG = ProfileConfig(repeats=3, seed=7)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def measured(clock: FakeClock):
    """A model, its optimizer, and its exact profile on the ladder 8, 16, 32."""
    model, optimizer = trained_setup(clock)
    config = ProfileConfig(batch_sizes=(8, 16, 32), time_budget=1e6, max_repeats=5)
    return model, optimizer, run_profile(clock, model, optimizer, config=config)


def retime(clock, model, optimizer, profiles, sizes, comm=None, **kwargs):
    return retime_profiles(
        comm or SingleProcessCommunicator(),
        model,
        optimizer,
        nn.functional.cross_entropy,
        make_batch,
        profiles,
        sizes,
        config=kwargs.pop("config", CONFIG),
        timer=clock,
        cpu_timer=None,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("batch", "outside"),
    [(0, False), (-3, False), (40, False), (50, False), (51, True), (8, False), (7, True)],
)
def test_outside_measured_allows_a_quarter_beyond_either_end(batch, outside):
    profile = _profile(batch_sizes=(10, 20, 40), step_times=(0.02, 0.03, 0.05))
    assert outside_measured(profile, batch) is outside


def test_outside_measured_tolerance_is_adjustable_and_checked():
    profile = _profile()  # ladder 10, 20
    assert outside_measured(profile, 21, tolerance=0.0)
    assert not outside_measured(profile, 29, tolerance=0.5)
    with pytest.raises(ValueError, match="tolerance"):
        outside_measured(profile, 30, tolerance=-0.1)


def test_add_measurement_inserts_in_order_or_replaces_and_refits():
    profile = _profile(reference_batch=20, repeats=5)
    added = add_measurement(profile, 15, 0.026, repeats=3)
    assert added.batch_sizes == (10, 15, 20)
    assert added.step_times == (0.02, 0.026, 0.03)
    fit = fit_step_time([10, 15, 20], [0.02, 0.026, 0.03])
    assert (added.alpha, added.beta) == (fit.alpha, fit.beta)
    assert (added.r_squared, added.fit_relative_error) == (fit.r_squared, fit.relative_error)
    assert (added.reference_batch, added.repeats, added.rank) == (20, 3, profile.rank)
    replaced = add_measurement(profile, 20, 0.05)
    assert replaced.batch_sizes == (10, 20) and replaced.step_times == (0.02, 0.05)
    refit = fit_step_time([10, 20], [0.02, 0.05])
    assert (replaced.alpha, replaced.beta) == (refit.alpha, refit.beta) != (0.01, 0.001)
    with pytest.raises(ValueError, match="batch"):
        add_measurement(profile, 0, 0.01)


def test_retime_adds_the_planned_batch_and_refits_from_the_new_point():
    clock = FakeClock()
    model, optimizer, profile = measured(clock)
    assert profile.alpha == pytest.approx(ALPHA, rel=1e-6)
    # Beyond the ladder the real cost grows faster than the measured line predicts.
    model.alpha, model.beta = 2 * ALPHA, 2 * BETA
    before, rng = _state(model, optimizer), torch.get_rng_state()
    start = clock.now
    (updated,) = retime(clock, model, optimizer, [profile], [256])
    assert updated.batch_sizes == (8, 16, 32, 256)
    assert updated.step_times[:3] == profile.step_times
    assert updated.step_times[3] == pytest.approx(2 * (ALPHA + BETA * 256))
    # One untimed warm-up step, then config.repeats timed steps, all at batch 256.
    assert clock.now - start == pytest.approx(4 * 2 * (ALPHA + BETA * 256))
    fit = fit_step_time(updated.batch_sizes, updated.step_times)
    assert (updated.alpha, updated.beta) == (fit.alpha, fit.beta)
    assert updated.beta > profile.beta
    assert updated.r_squared == fit.r_squared < 1.0
    assert updated.fit_relative_error == fit.relative_error > 0.0
    assert updated.reference_batch == profile.reference_batch
    assert updated.repeats == min(profile.repeats, CONFIG.repeats)
    _assert_same(before, _state(model, optimizer))
    assert torch.equal(rng, torch.get_rng_state())


def test_retime_applies_the_slowdown_as_profiling_does():
    clock = FakeClock()
    model, optimizer, profile = measured(clock)
    slowdown = Slowdown(3.0, sleep=clock.advance)
    (updated,) = retime(clock, model, optimizer, [profile], [64], slowdown=slowdown)
    assert updated.step_times[-1] == pytest.approx(3 * (ALPHA + BETA * 64))


def test_retime_replaces_a_batch_already_measured():
    clock = FakeClock()
    model, optimizer, profile = measured(clock)
    model.alpha = 10 * ALPHA
    (updated,) = retime(clock, model, optimizer, [profile], [16])
    assert updated.batch_sizes == profile.batch_sizes
    assert updated.step_times[1] == pytest.approx(10 * ALPHA + BETA * 16)
    assert updated.step_times[0::2] == profile.step_times[0::2]
    assert updated.alpha != pytest.approx(profile.alpha)


def test_retime_clips_to_the_memory_cap():
    clock = FakeClock()
    model, optimizer, profile = measured(clock)
    capped = dataclasses.replace(profile, cap=100)
    (updated,) = retime(clock, model, optimizer, [capped], [5000])
    assert updated.batch_sizes == (8, 16, 32, 100)
    assert updated.step_times[-1] == pytest.approx(ALPHA + BETA * 100)


@pytest.mark.parametrize("size", [None, 0])
def test_no_batch_means_no_timing_and_no_change(size):
    clock = FakeClock()
    model, optimizer, profile = measured(clock)
    start = clock.now
    assert retime(clock, model, optimizer, [profile], [size]) == [profile]
    assert clock.now == start


class SecondRank:
    """Rank 1 of two: rank 0's entry in allgather is the given profile's dict."""

    rank, size = 1, 2

    def __init__(self, other) -> None:
        self.other = other
        self.gathered = []

    def allgather(self, obj):
        self.gathered.append(obj)
        return [self.other.to_dict(), obj]


def test_each_rank_times_only_its_own_batch_and_all_get_the_list_in_rank_order():
    clock = FakeClock()
    model, optimizer, profile = measured(clock)
    mine = dataclasses.replace(profile, rank=1)
    other = dataclasses.replace(profile, rank=0, host="elsewhere")
    comm = SecondRank(other)
    updated = retime(clock, model, optimizer, [other, mine], [400, 48], comm=comm)
    assert len(comm.gathered) == 1
    assert updated[0] == other  # rank 0's 400 is rank 0's business
    assert updated[1].rank == 1 and updated[1].batch_sizes == (8, 16, 32, 48)
    with pytest.raises(ValueError, match="one profile and one batch size per rank"):
        retime(clock, model, optimizer, [mine], [48], comm=comm)
    with pytest.raises(ValueError, match="rank order"):
        retime(clock, model, optimizer, [mine, other], [48, 48], comm=comm)
