"""Heterogeneity emulation: parsing, the sleep it adds, and that a 3x rank profiles 3x slower."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import pytest
import torch

from lbtrain.emulation import Slowdown, parse_slowdowns, precise_sleep, slowdown_for_rank
from lbtrain.profiling import ProfileConfig, profile_replica
from lbtrain.workloads import patch_cnn_workload


def test_parse_one_factor_per_rank_or_one_for_all():
    assert parse_slowdowns("1,2,4", 3) == (1.0, 2.0, 4.0)
    assert parse_slowdowns(" 1, 2.5 ", 2) == (1.0, 2.5)
    assert parse_slowdowns("3", 4) == (3.0,) * 4
    assert parse_slowdowns(None, 2) == (1.0, 1.0)
    assert parse_slowdowns("", 2) == (1.0, 1.0)
    assert parse_slowdowns([1, 2], 2) == (1.0, 2.0)
    assert slowdown_for_rank("1,2,4", 2, 3).factor == 4.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("1,2", "has 2 factors but the job has 3 ranks"),
        ("1,2,3,4", "has 4 factors but the job has 3 ranks"),
        ("1,0,2", "factor 0 for rank 1 is not positive"),
        ("1,-2,2", "factor -2 for rank 1 is not positive"),
        ("1,0.5,2", "below 1"),
        ("1,x,2", "'x' is not a number"),
        ("1,nan,2", "not positive"),
        ("1,1001,2", "factor 1001 for rank 1 is above 1000"),
        ("1,2,1e300", "factor 1e+300 for rank 2 is above 1000"),  # once an OverflowError
    ],
)
def test_bad_slowdown_lists_name_the_option_and_the_fix(text, needle):
    with pytest.raises(ValueError) as info:
        parse_slowdowns(text, 3)
    message = str(info.value)
    assert needle in message
    assert "--emulate-slowdown" in message and "\n" not in message


def test_slowdown_for_rank_checks_the_rank():
    with pytest.raises(ValueError, match=r"Invalid rank 3"):
        slowdown_for_rank("1,2,4", 3, 3)


@pytest.mark.parametrize("factor", [0.5, 0, -1, float("inf"), True])
def test_slowdown_rejects_factors_that_do_not_slow_down(factor):
    with pytest.raises(ValueError):
        Slowdown(factor)


def test_after_step_sleeps_factor_minus_one_times_the_compute():
    slept = []
    slow = Slowdown(3.0, sleep=slept.append)
    assert slow.after_step(0.25) == pytest.approx(0.5)
    assert slept == [pytest.approx(0.5)]
    Slowdown(1.0, sleep=slept.append).after_step(0.25)
    assert len(slept) == 1  # factor 1 never sleeps
    assert not Slowdown(1.0).active and slow.active


class Clocks:
    """A wall clock and a CPU clock that tests move by hand."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def compute(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu

    def sleep(self, seconds: float) -> None:
        self.wall += seconds


def test_step_measures_compute_as_cpu_time_when_descheduled():
    clocks = Clocks()
    slow = Slowdown(4.0, sleep=clocks.sleep)
    # 10 ms of wall time of which only 6 ms on the CPU: 4 ms waiting for a shared core must
    # not be multiplied by the factor.
    with slow.step(timer=lambda: clocks.wall, cpu_timer=lambda: clocks.cpu):
        clocks.compute(wall=0.010, cpu=0.006)
    assert clocks.wall == pytest.approx(0.010 + 3 * 0.006)
    # Multi-threaded steps use more CPU than wall time: then the wall time counts.
    clocks = Clocks()
    slow = Slowdown(2.0, sleep=clocks.sleep)
    with slow.step(timer=lambda: clocks.wall, cpu_timer=lambda: clocks.cpu):
        clocks.compute(wall=0.010, cpu=0.030)
    assert clocks.wall == pytest.approx(0.020)
    # Without a CPU clock (GPU ranks, fake clocks) the wall time counts.
    clocks = Clocks()
    synced = []
    with Slowdown(3.0, sleep=clocks.sleep).step(
        timer=lambda: clocks.wall, synchronize=lambda: synced.append(1), cpu_timer=None
    ):
        clocks.compute(wall=0.010, cpu=0.001)
    assert clocks.wall == pytest.approx(0.030)
    assert len(synced) == 2  # before and after: queued GPU work is part of the step


def test_a_collective_inside_the_step_is_waited_for_not_stretched():
    """Synchronised BatchNorm meets the other ranks inside the step: the slow rank sleeps its
    stretch before each meeting, and the wait in it (spinning, on the CPU) is not compute.
    Stretched, a 2x rank waiting 50 ms for a 4x one would sleep 50 ms more, and the 4x rank
    would then wait for it at the next meeting."""
    clocks = Clocks()
    slow = Slowdown(2.0, sleep=clocks.sleep)
    with slow.step(timer=lambda: clocks.wall, cpu_timer=lambda: clocks.cpu) as segments:
        clocks.compute(wall=0.010, cpu=0.010)
        segments.split()  # before the collective: sleeps 10 ms
        clocks.compute(wall=0.050, cpu=0.050)  # waiting in it, MPI spinning
        segments.resume()  # it returned
        clocks.compute(wall=0.004, cpu=0.004)
    assert clocks.wall == pytest.approx(0.010 + 0.010 + 0.050 + 0.004 + 0.004)


def test_precise_sleep_reaches_the_deadline_on_a_fake_clock():
    now = [0.0]
    calls = []

    def coarse(seconds: float) -> None:
        calls.append(seconds)
        now[0] += seconds * 0.5  # wakes up early, as after a signal

    def clock() -> float:
        now[0] += 1e-6  # time moves while spinning
        return now[0]

    precise_sleep(0.01, clock=clock, sleep=coarse)
    assert now[0] >= 0.01
    assert now[0] < 0.01 + 1e-5
    assert len(calls) > 1  # the early wake-up was slept again, not ignored
    calls.clear()
    precise_sleep(0.0, clock=clock, sleep=coarse)
    precise_sleep(-1.0, clock=clock, sleep=coarse)
    assert calls == []


def test_precise_sleep_really_sleeps():
    """The one real-time check: a lower bound only, which a busy machine cannot break."""
    start = time.perf_counter()
    precise_sleep(0.02)
    assert time.perf_counter() - start >= 0.02
    # Emulation sleeps this way unless a test injects a fake sleep.
    assert Slowdown(3.0).sleep is precise_sleep


@dataclass(frozen=True)
class RecordingSlowdown(Slowdown):
    """A Slowdown that also records the compute time of every step it stretched."""

    computes: list[float] = field(default_factory=list, compare=False)

    def after_step(self, compute_seconds: float) -> float:
        self.computes.append(compute_seconds)
        return super().after_step(compute_seconds)


class FakeClock:
    """A wall clock that moves only when a forward pass or the emulated sleep moves it."""

    def __init__(self) -> None:
        self.now = 50.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)


# Fake seconds each forward pass of the real workload costs.
FORWARD_SECONDS = 0.004


def test_a_rank_emulated_three_times_slower_profiles_three_times_slower():
    """Real training steps of the patch CNN (CPU, one thread), timed on a fake clock.

    Every forward pass moves the clock by FORWARD_SECONDS and the emulated sleep moves it by
    what it sleeps, so the profiled step must be exactly three compute times, whatever else
    runs on the machine. The profiler's exact factor on a toy model is checked in
    test_profiling.py, the CPU-time correction on fake clocks above, and that the default
    sleep really sleeps in test_precise_sleep_really_sleeps.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    workload = patch_cnn_workload()
    config = ProfileConfig(batch_sizes=(64,), warmup=1, repeats=7, max_repeats=7)
    torch.manual_seed(0)
    model = workload.build_model()
    optimizer = workload.build_optimizer(model.parameters())
    clock = FakeClock()
    model.register_forward_pre_hook(lambda module, args: clock.advance(FORWARD_SECONDS))
    slowdown = RecordingSlowdown(3.0, sleep=clock.sleep)
    try:
        profile = profile_replica(
            model,
            optimizer,
            workload.loss_fn,
            workload.make_batch,
            config=config,
            slowdown=slowdown,
            timer=clock,
            cpu_timer=None,
        )
    finally:
        torch.set_num_threads(threads)
    assert profile.slowdown == 3.0
    # The pilot step and the timed ones were stretched, each by twice its compute.
    assert slowdown.computes == [pytest.approx(FORWARD_SECONDS)] * (1 + 7)
    assert clock.slept == [pytest.approx(2 * FORWARD_SECONDS)] * (1 + 7)
    assert profile.repeats == 7
    assert profile.step_times[0] == pytest.approx(3 * FORWARD_SECONDS)
    assert profile.step_times[0] / statistics.median(slowdown.computes) == pytest.approx(3.0)
    assert profile.throughput == pytest.approx(64 / profile.step_times[0])
