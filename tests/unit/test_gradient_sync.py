"""GradientSync in one process: zero-copy buckets, overlap with backward, staging, order."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn

import lbtrain.parallel.gradients as gradients
from lbtrain import SingleProcessCommunicator, sync_gradients
from lbtrain.parallel.buckets import sync_layout
from lbtrain.parallel.gradients import GradientSync


class Pending:
    """A request that completes only at wait(), summing as two ranks with equal values would."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer, self.done, self.tests = buffer, False, 0

    def test(self) -> bool:
        self.tests += 1
        return self.done

    def wait(self) -> None:
        if not self.done:
            self.buffer.mul_(2)
            self.done = True


class TwoRankComm:
    """Rank 0 of two: records each started allreduce (its buffer and whether backward ran)."""

    rank, size, cuda_aware = 0, 2, False

    def __init__(self) -> None:
        self.started: list[tuple[int, bool]] = []
        self.requests: list[Pending] = []
        self.in_backward = False

    def iallreduce_sum_(self, buffer: torch.Tensor) -> Pending:
        self.started.append((buffer.data_ptr(), self.in_backward))
        self.requests.append(Pending(buffer))
        return self.requests[-1]

    def allgather(self, obj: object) -> list[object]:
        return [obj, obj]  # two equal ranks


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))


def batch(n: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def plain_grads(model: nn.Module, weight: float) -> list[torch.Tensor]:
    """The expected result on rank 0 of two equal ranks: 2 * weight * mean-loss gradient."""
    model.zero_grad(set_to_none=True)
    x, y = batch()
    nn.functional.cross_entropy(model(x), y).backward()
    return [2 * weight * p.grad.clone() for p in model.parameters()]


def overlapped_step(sync: GradientSync, comm: TwoRankComm, model: nn.Module, weight: float):
    x, y = batch()
    sync.begin(weight)
    comm.in_backward = True
    nn.functional.cross_entropy(model(x), y).backward()
    comm.in_backward = False
    sync.wait()


def test_gradients_are_views_into_the_buckets_and_stay_there_step_after_step():
    model = make_model()
    comm = TwoRankComm()
    sync = GradientSync(model, comm, bucket_mb=0.0005)
    pointers = [p.grad.data_ptr() for p in model.parameters()]
    for bucket in sync.buckets:
        start = bucket.flat.data_ptr()
        end = start + bucket.flat.numel() * bucket.flat.element_size()
        assert all(start <= p.grad.data_ptr() < end for p in bucket.params)
    expected = plain_grads(make_model(), 0.25)
    for _ in range(2):
        sync.zero_grad()
        x, y = batch()
        nn.functional.cross_entropy(model(x), y).backward()
        sync.sync(0.25)
        assert [p.grad.data_ptr() for p in model.parameters()] == pointers  # no new memory
        for p, g in zip(model.parameters(), expected, strict=True):
            torch.testing.assert_close(p.grad, g)
    # Every bucket was reduced in place: the buffers handed to MPI are the buckets.
    assert {ptr for ptr, _ in comm.started} == {b.flat.data_ptr() for b in sync.buckets}


def test_overlap_starts_buckets_during_backward_in_reverse_parameter_order():
    model = make_model()
    comm = TwoRankComm()
    sync = GradientSync(model, comm, bucket_mb=0.0005, overlap=True)
    assert len(sync.buckets) >= 3
    overlapped_step(sync, comm, model, 0.5)
    assert [ptr for ptr, _ in comm.started] == [b.flat.data_ptr() for b in sync.buckets]
    assert sum(during for _, during in comm.started) >= len(sync.buckets) - 1
    assert sync.buckets[0].params[0] is list(model.parameters())[-1]
    assert any(r.tests for r in comm.requests)  # progress calls from the hooks
    for p, g in zip(model.parameters(), plain_grads(make_model(), 0.5), strict=True):
        torch.testing.assert_close(p.grad, g)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("stage", [False, True])
def test_overlap_and_staging_give_the_same_gradients_bit_for_bit(overlap, stage):
    reference_model = make_model()
    reference = GradientSync(reference_model, TwoRankComm(), bucket_mb=0.0005)
    overlapped_step(reference, TwoRankComm(), reference_model, 0.3)
    model = make_model()
    comm = TwoRankComm()
    sync = GradientSync(model, comm, bucket_mb=0.0005, overlap=overlap, stage=stage)
    overlapped_step(sync, comm, model, 0.3)
    for p, q in zip(model.parameters(), reference_model.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    if stage:  # MPI saw the host copies, never the buckets
        assert not {ptr for ptr, _ in comm.started} & {b.flat.data_ptr() for b in sync.buckets}


class WithUnused(nn.Module):
    """A layer in the middle of the parameter list that forward never uses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(6, 64)
        self.unused = nn.Linear(64, 64)
        self.b = nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def test_a_parameter_without_gradient_holds_later_buckets_back_but_never_reorders():
    model = WithUnused()
    comm = TwoRankComm()
    # 0.0008 MiB: [b.bias, b.weight], [unused.bias], [unused.weight], [a.bias], [a.weight]
    sync = GradientSync(model, comm, bucket_mb=0.0008, overlap=True)
    assert [len(b.params) for b in sync.buckets] == [2, 1, 1, 1, 1]
    x, y = batch()
    sync.begin(1.0)
    comm.in_backward = True
    nn.functional.cross_entropy(model(x), y).backward()
    comm.in_backward = False
    assert len(comm.started) == 1  # only the bucket before the unused layer's started
    sync.launch()
    assert [ptr for ptr, _ in comm.started] == [b.flat.data_ptr() for b in sync.buckets]
    sync.wait()
    assert not model.unused.weight.grad.any()  # no gradient: zeros went into the sum
    assert model.a.weight.grad.any()


def test_zero_weight_adds_zeros_over_stale_nan_and_needs_no_backward():
    model = make_model()
    comm = TwoRankComm()
    sync = GradientSync(model, comm, overlap=True)
    sync.begin(0.0)
    for p in model.parameters():
        p.grad.fill_(float("nan"))  # stale values must not reach the sum
    sync.wait()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())
    assert len(comm.started) == len(sync.buckets)


def test_prescaled_gradients_are_not_scaled_again():
    model = make_model()
    comm = TwoRankComm()
    sync = GradientSync(model, comm)
    x, y = batch()
    sync.begin(0.25, prescaled=True)
    (nn.functional.cross_entropy(model(x), y) * 0.25).backward()
    sync.wait()
    for p, g in zip(model.parameters(), plain_grads(make_model(), 0.25), strict=True):
        torch.testing.assert_close(p.grad, g)


def test_a_second_backward_into_a_bucket_in_flight_is_refused():
    model = make_model()
    sync = GradientSync(model, TwoRankComm(), overlap=True)
    x, y = batch()
    sync.begin(0.5)
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="one backward per step"):
        nn.functional.cross_entropy(model(x), y).backward()


def test_gradients_the_user_released_are_copied_in():
    """optimizer.zero_grad(set_to_none=True) detaches .grad from the buckets each step."""
    model = make_model()
    comm = TwoRankComm()
    expected = plain_grads(make_model(), 0.5)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        x, y = batch()
        nn.functional.cross_entropy(model(x), y).backward()
        sync_gradients(model, 0.5, comm)
        for p, g in zip(model.parameters(), expected, strict=True):
            torch.testing.assert_close(p.grad, g)


def test_sync_gradients_keeps_one_sync_per_model_whatever_communicators_it_sees():
    model = make_model()
    for _ in range(3):  # a new communicator object each call must not pile up buckets
        comm = SingleProcessCommunicator()
        sync_gradients(model, 1.0, comm)
    assert gradients._SYNCS[model].comm is comm
    assert all(p.grad.data_ptr() == v.data_ptr() for b in gradients._SYNCS[model].buckets
               for p, v in zip(b.params, b.views, strict=True))  # fmt: skip


def test_a_step_begun_with_allreduces_still_in_flight_is_refused():
    model = make_model()
    comm = TwoRankComm()
    sync = GradientSync(model, comm, overlap=True)
    x, y = batch()
    sync.begin(0.5)
    nn.functional.cross_entropy(model(x), y).backward()
    sync.launch()  # started, never waited for
    with pytest.raises(RuntimeError, match="still in flight"):
        sync.begin(0.5)
    sync.wait()
    sync.begin(0.5)  # once waited for, the next step may begin


def test_hooks_on_another_thread_leave_mpi_to_the_callers_thread_when_mpi_is_not_thread_safe():
    """CUDA parameters' hooks run on autograd's device threads; FUNNELED MPI forbids that."""
    model = make_model()
    comm = TwoRankComm()
    comm.thread_safe = False
    sync = GradientSync(model, comm, bucket_mb=0.0005, overlap=True)
    x, y = batch()
    sync.begin(0.5)
    worker = threading.Thread(target=lambda: nn.functional.cross_entropy(model(x), y).backward())
    worker.start()
    worker.join()
    assert comm.started == []  # every bucket ready, none started from the hooks' thread
    sync.wait()
    assert [ptr for ptr, _ in comm.started] == [b.flat.data_ptr() for b in sync.buckets]
    for p, g in zip(model.parameters(), plain_grads(make_model(), 0.5), strict=True):
        torch.testing.assert_close(p.grad, g)


def test_sync_gradients_builds_the_buckets_once_per_model():
    model = make_model()
    comm = SingleProcessCommunicator()
    sync_gradients(model, 1.0, comm)
    pointers = [p.grad.data_ptr() for p in model.parameters()]
    sync_gradients(model, np.float32(0.5), comm)  # numpy reals are numbers too
    assert [p.grad.data_ptr() for p in model.parameters()] == pointers
    model.double()  # a new layout: new buckets
    sync_gradients(model, 1.0, comm)
    assert all(p.grad.dtype == torch.float64 for p in model.parameters())


@pytest.mark.parametrize(
    ("weight", "error"),
    [(True, TypeError), ("0.5", TypeError), (None, TypeError), (-0.1, ValueError),
     (float("inf"), ValueError), (np.float64(1.5), ValueError)],
)  # fmt: skip
def test_bad_weights_name_the_parameter(weight, error):
    with pytest.raises(error, match="weight="):
        GradientSync(make_model(), TwoRankComm()).begin(weight)


def test_layout_is_reverse_order_and_matches_the_buckets():
    model = make_model()
    sync = GradientSync(model, TwoRankComm(), bucket_mb=0.0005)
    layout = sync_layout(model.parameters(), 0.0005)
    assert [[id(p) for p in g] for g in layout] == [[id(p) for p in b.params] for b in sync.buckets]
    assert sync.nbytes == sum(p.numel() * 4 for p in model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("stage", [True, False])
def test_cuda_buckets_staged_or_direct_match_the_cpu_result(stage):
    """Staged: pinned host buffers, the download on a side stream; direct: CUDA-aware MPI.

    Three steps on different data, so the host buffers and streams are reused.
    """
    cpu_model, model = make_model(), make_model().cuda()
    cpu_sync = GradientSync(cpu_model, TwoRankComm(), bucket_mb=0.0005, overlap=True)
    comm = TwoRankComm()
    comm.cuda_aware = not stage
    sync = GradientSync(model, comm, bucket_mb=0.0005, overlap=True, stage=stage)
    for step in range(3):
        x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
        for target, s, inputs, labels in (
            (cpu_model, cpu_sync, x, y),
            (model, sync, x.cuda(), y.cuda()),
        ):
            s.begin(0.3)
            nn.functional.cross_entropy(target(inputs), labels).backward()
            s.wait()
        for p, q in zip(model.parameters(), cpu_model.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), q.grad, msg=f"step {step}")
