"""time_sync on recording communicators and fake clocks; comm_cost from the profiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lbtrain import SingleProcessCommunicator
from lbtrain.balancer import CommCost
from lbtrain.parallel.buckets import sync_layout
from lbtrain.parallel.gradients import sync_gradients
from lbtrain.profiling import comm_cost, time_sync
from tests.unit.test_profiling import _profile


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class RecordingComm:
    """Rank 0 of a fake job: records every collective, and moves the clock per allreduce.

    Args:
        clock: the fake clock each allreduce advances.
        costs: seconds each allreduce round costs, in order; the round's buffers share it.
        others: the medians the other ranks report through allgather.
    """

    rank = 0
    cuda_aware = False

    def __init__(self, clock: FakeClock, costs: list[float], others: list[float]) -> None:
        self.clock, self.costs, self.others = clock, list(costs), others
        self.size = 1 + len(others)
        self.calls: list[tuple] = []

    def allreduce_sum_(self, buffer) -> None:
        if isinstance(buffer, np.ndarray):
            self.calls.append(("numpy", buffer.dtype, buffer.shape))
            # The control allreduce opens each round: charge the round's cost here.
            self.clock.now += self.costs.pop(0)
        else:
            assert not buffer.any(), "the timed buffers are zeros, so the sum stays finite"
            self.calls.append(("torch", buffer.dtype, tuple(buffer.shape), buffer.device))

    def iallreduce_sum_(self, buffer):
        self.allreduce_sum_(buffer)
        return SingleProcessCommunicator().iallreduce_sum_(buffer)  # complete at once

    def barrier(self) -> None:
        self.calls.append(("barrier",))

    def allgather(self, obj):
        self.calls.append(("allgather", obj))
        return [obj, *self.others]


class MixedModel(nn.Module):
    """Two dtypes, a frozen layer and a parameter-free layer: several buckets, some skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(10, 20)
        self.frozen = nn.Linear(20, 20)
        self.frozen.requires_grad_(False)
        self.b = nn.Linear(20, 30)
        self.c = nn.Linear(30, 4).double()


def trainable_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def test_sync_reduces_the_control_array_then_each_gradient_bucket_after_a_barrier():
    model = MixedModel()
    clock = FakeClock()
    # Warm-up round (not kept), then five timed rounds with median 0.3.
    comm = RecordingComm(clock, [9.0, 0.5, 0.1, 0.3, 0.2, 0.4], others=[0.05, 0.1])
    seconds, nbytes = time_sync(comm, model, repeats=5, timer=clock)
    assert nbytes == trainable_bytes(model)
    assert seconds == pytest.approx(0.3)  # this rank is the slowest of the three
    buckets = sync_layout(model.parameters())  # reverse order, as backward fills them
    assert [b[0].dtype for b in buckets] == [torch.float64, torch.float32]
    one_round = [
        ("barrier",),
        ("numpy", np.dtype(np.float64), (6,)),
        *[("torch", b[0].dtype, (sum(p.numel() for p in b),), b[0].device) for b in buckets],
    ]
    assert comm.calls[:-1] == one_round * 6
    assert comm.calls[-1] == ("allgather", pytest.approx(0.3))


@pytest.mark.parametrize("sync", [True, False])
def test_synchronised_batchnorm_adds_two_small_allreduces_per_layer_to_each_round(sync):
    """The plan's communication term counts the collectives BatchNorm makes in training."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 5), nn.BatchNorm1d(5))
    clock = FakeClock()
    comm = RecordingComm(clock, [0.1] * 2, others=[0.1])
    _, nbytes = time_sync(comm, model, repeats=1, timer=clock, sync_batchnorm=sync)
    assert nbytes == trainable_bytes(model)  # the bytes stay the gradients'
    small = [call[2] for call in comm.calls if call[:2] == ("torch", torch.float64)]
    expected = [(5 + 2 * 4,), (4 + 2 * 4,), (5 + 2 * 5,), (4 + 2 * 5,)] if sync else []
    assert small == expected * 2  # the warm-up round, then the timed one


def test_the_job_figure_is_the_slowest_ranks_median():
    clock = FakeClock()
    comm = RecordingComm(clock, [1.0, 0.1, 0.2, 0.1], others=[0.7])
    seconds, _ = time_sync(comm, nn.Linear(3, 2), repeats=3, timer=clock)
    assert seconds == pytest.approx(0.7)


def test_buffers_match_what_sync_gradients_reduces_bucket_for_bucket():
    model = MixedModel()  # no gradients yet: sync_gradients reduces zeros, as time_sync does
    clock = FakeClock()
    timed = RecordingComm(clock, [0.0] * 3, others=[])
    time_sync(timed, model, repeats=2, timer=clock, bucket_mb=0.001)
    real = RecordingComm(clock, [], others=[])
    sync_gradients(model, 1.0, real, bucket_mb=0.001)  # one rank: its weight is 1
    gradients = [call for call in real.calls if call[0] == "torch"]
    assert len(gradients) > 2  # the tiny bucket size splits the float32 layers
    timed_round = [call for call in timed.calls if call[0] == "torch"][: len(gradients)]
    assert timed_round == gradients
    assert sum(np.prod(c[2]) * c[1].itemsize for c in gradients) == trainable_bytes(model)


def test_one_rank_still_times_its_local_cost():
    model = nn.Linear(4, 3)
    clock = FakeClock()
    seconds, nbytes = time_sync(SingleProcessCommunicator(), model, timer=clock)
    assert (seconds, nbytes) == (0.0, (4 * 3 + 3) * 4)
    seconds, _ = time_sync(SingleProcessCommunicator(), model)  # the real clock
    assert 0.0 <= seconds < 1.0


@pytest.mark.parametrize("repeats", [0, -1, 1.5, True])
def test_bad_repeats_are_refused(repeats):
    with pytest.raises(ValueError, match="repeats"):
        time_sync(SingleProcessCommunicator(), nn.Linear(2, 2), repeats=repeats)


def test_comm_cost_takes_the_largest_time_when_all_profiles_agree():
    profiles = [
        _profile(0, sync_time=0.002, sync_bytes=800, sync_ranks=2),
        _profile(1, sync_time=0.003, sync_bytes=800, sync_ranks=2),
    ]
    cost = comm_cost(profiles)
    assert cost == CommCost(seconds=0.003, world_size=2, nbytes=800)
    assert cost.time(2) == pytest.approx(0.003)
    assert cost.time(1) == 0.0


@pytest.mark.parametrize(
    "second",
    [
        {},  # an old profile without the fields
        {"sync_time": 0.003, "sync_bytes": 800, "sync_ranks": 3},
        {"sync_time": 0.003, "sync_bytes": 900, "sync_ranks": 2},
    ],
)
def test_comm_cost_is_none_when_a_profile_lacks_or_disagrees(second):
    first = _profile(0, sync_time=0.002, sync_bytes=800, sync_ranks=2)
    assert comm_cost([first, _profile(1, **second)]) is None


def test_comm_cost_of_no_profiles_is_none():
    assert comm_cost([]) is None
