"""`BalancedDataParallel` and `plan_for` on in-process ranks: exactness, checks, buffers.

tests/mpi/test_exactness.py runs the same checks under mpiexec and torchrun (real ranks).
"""

from __future__ import annotations

import itertools
import re
import threading

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import BalancedDataParallel, balanced_loader, plan_batches, plan_for, sync_gradients
from lbtrain.collective import CollectiveError
from lbtrain.comm import SingleProcessCommunicator, run_ranks
from lbtrain.parallel.checks import shared_autograd_thread
from tests.mpi.scripts.bn_exactness import make_data, make_model
from tests.mpi.scripts.bn_exactness import run_case as bn_case
from tests.mpi.scripts.wrapper_exactness import _plan, check, mismatch
from tests.unit.test_profiling import _profile

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _values(results):
    for result in results:
        if result.error is not None:
            raise result.error
    return [result.value for result in results]


@pytest.mark.parametrize("mode", ["overlap", "plain", "accumulate"])
@pytest.mark.parametrize("sizes", [[5, 11, 48], [20, 0, 44], [1, 30]])
def test_a_users_loop_matches_one_process_and_the_naive_average_does_not(sizes, mode):
    lines = _values(run_ranks(len(sizes), lambda comm: check(comm, sizes, mode), timeout=60))
    assert lines[0].startswith("wrapper exactness ok")


@pytest.mark.parametrize("mode", ["accumulate-sync", "two-backward", "sum", "count"])
@pytest.mark.parametrize("sizes", [[5, 11, 48], [20, 0, 44]])
def test_the_loops_ddp_users_have_match_one_process(sizes, mode):
    """Accumulation without no_sync, two backwards per forward, a summed loss and one
    averaged over counted units: each exact, each with its own one-process reference."""
    lines = _values(run_ranks(len(sizes), lambda comm: check(comm, sizes, mode), timeout=60))
    assert lines[0].startswith("wrapper exactness ok")


def _penalised(comm, sizes: list[int], on_share: bool, reduction: str = "mean") -> float:
    """Two epochs of a loop whose loss (a mean, or a sum: `reduction`) adds a penalty on the
    parameters (with the rank's share on it, or not); the largest difference from one
    process's parameters."""
    from lbtrain.data import epoch_schedule
    from tests.mpi.scripts.exactness import EPOCHS, NUM_SAMPLES, flat_params, make_optimizer
    from tests.mpi.scripts.exactness import make_data as linear_data
    from tests.mpi.scripts.exactness import make_model as linear_model

    inputs, targets = linear_data()
    data = TensorDataset(inputs, targets)
    plan = _plan(sizes)
    loader = balanced_loader(plan, data, rank=comm.rank, seed=3)
    model = BalancedDataParallel(linear_model(), comm, loader, loss_reduction=reduction)
    reference = linear_model()

    def loss_of(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if reduction == "sum":  # a sum (times a constant, for SGD's sake)
            return nn.functional.cross_entropy(outputs, y, reduction="sum") / 64
        return nn.functional.cross_entropy(outputs, y)

    optimizer, one = make_optimizer(model), make_optimizer(reference)

    def penalty(net: nn.Module) -> torch.Tensor:
        return 0.05 * sum(p.square().sum() for p in net.parameters())

    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            share = loader.weight if on_share else 1.0
            (loss_of(model(x), y) + share * penalty(model)).backward()
            optimizer.step()
        perm = loader.batch_sampler.permutation()
        for begin, end, _ in epoch_schedule(NUM_SAMPLES, plan):
            batch = perm[begin:end]
            one.zero_grad()
            (loss_of(reference(inputs[batch]), targets[batch]) + penalty(reference)).backward()
            one.step()
    return (flat_params(model.module) - flat_params(reference)).abs().max().item()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("sizes", [[5, 11, 48], [20, 0, 44]])
def test_a_penalty_on_the_parameters_is_exact_with_the_share_on_it(sizes, reduction):
    """A loss term that is not from the outputs is not scaled by the wrapper: with
    `loader.weight` on it (docs/library.md, "The loss") the update is one process's; without,
    every rank adds it whole and the run misses."""
    exact = _values(run_ranks(3, lambda c: _penalised(c, sizes, True, reduction), timeout=60))
    plain = _values(run_ranks(3, lambda c: _penalised(c, sizes, False, reduction), timeout=60))
    assert max(exact) < 1e-10, exact
    assert min(plain) > 1e-3, plain


@pytest.mark.parametrize(
    "case", ["5,11,48", "20,0,44", "1,20,43", "5,11,48:resnet", "20,0,44:resnet"]
)
def test_a_model_with_batchnorm_matches_one_process_and_per_rank_statistics_do_not(case):
    lines = _values(run_ranks(3, lambda comm: bn_case(comm, case), timeout=60))
    assert lines[0].startswith("batchnorm exactness ok"), lines


@needs_cuda
@pytest.mark.parametrize(
    "case", ["wrapper:20,0,44:overlap", "bn:5,11,48", "bn:20,0,44:resnet", "bn:1,20,43"]
)
def test_a_gpu_rank_beside_cpu_ranks_matches_one_process(case):
    """Rank 1 on the GPU, ranks 0 and 2 on the CPU: gradient buckets and BatchNorm's
    collectives meet across devices (in-process ranks; mpiexec and torchrun in
    scripts/gpu_acceptance.sh)."""
    kind, _, rest = case.partition(":")
    devices = ["cpu", "cuda:0", "cpu"]
    if kind == "bn":
        work = lambda comm: bn_case(comm, f"{rest}@{','.join(devices)}")  # noqa: E731
    else:
        sizes, _, mode = rest.partition(":")
        work = lambda comm: check(comm, [int(s) for s in sizes.split(",")], mode, devices)  # noqa: E731
    lines = _values(run_ranks(3, work, timeout=120))
    assert "exactness ok" in lines[0] and "cuda:0" in lines[0], lines


def test_two_in_process_ranks_on_one_gpu_are_named_not_left_waiting():
    places = [("a", 7, "cuda:0"), ("a", 7, "cpu"), ("a", 7, "cuda:0"), ("a", 8, "cuda:0")]
    said = shared_autograd_thread(places)
    assert said.startswith("ranks 0 and 2 are threads of one process on cuda:0"), said
    assert "mpiexec" in said
    # Processes of their own (other pids, or one pid on two hosts), or CPU ranks, have
    # threads of their own.
    apart = [("a", 7, "cuda:0"), ("a", 8, "cuda:0"), ("b", 7, "cuda:0"), ("a", 7, "cpu")]
    assert shared_autograd_thread([*apart, ("a", 7, "cpu")]) is None


@pytest.mark.parametrize("sync_batchnorm", [True, False], ids=["batchnorm", "plain"])
def test_the_hooks_around_each_collective_inside_the_step_come_in_pairs(sync_batchnorm):
    """An emulated slowdown sleeps before each collective inside the model and times compute
    again after it (lbtrain.emulation.Segments): the wrapper calls both, in turn. Also around
    its epoch check after the first forward of an epoch, with BatchNorm or without: the fast
    ranks wait there for the slowest one's forward."""
    inputs, targets = make_data("convnet", 128)  # two steps of 64

    def work(comm):
        loader = balanced_loader(_plan([5, 11, 48]), TensorDataset(inputs, targets),
                                 rank=comm.rank, seed=3)  # fmt: skip
        model = BalancedDataParallel(make_model("convnet"), comm, loader,
                                     sync_batchnorm=sync_batchnorm)  # fmt: skip
        calls: list[list[str]] = []
        model.before_collective = lambda: calls[-1].append("before")
        model.after_collective = lambda: calls[-1].append("after")
        for x, y in itertools.islice(loader, 2):
            calls.append([])
            nn.functional.cross_entropy(model(x), y).backward()
        return calls

    layers = 6 if sync_batchnorm else 0  # 3 BatchNorm layers, forward and backward
    for first, second in _values(run_ranks(3, work, timeout=60)):
        assert first == ["before", "after"] * (layers + 1)  # the epoch check: once an epoch
        assert second == ["before", "after"] * layers


def _on_a_thread(step) -> None:
    """Run `step` on a thread of its own, as autograd runs a CUDA rank's backward."""
    raised = []
    thread = threading.Thread(target=lambda: _catch(step, raised))
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


def _catch(step, raised: list) -> None:
    try:
        step()
    except Exception as exc:  # noqa: BLE001 - handed back to the rank's own thread
        raised.append(exc)


def test_a_backward_on_another_thread_meets_the_collectives_in_one_order():
    """A CUDA rank's gradient hooks and BatchNorm backward run on autograd's device thread,
    where in-process ranks may not start buckets: the other ranks must not start theirs
    before BatchNorm's collectives either (this once summed a bucket with a BatchNorm buffer
    on a GPU machine). Rank 1's backward runs on a thread of its own here."""
    inputs, targets = make_data("convnet", 64)

    def work(comm):
        loader = balanced_loader(_plan([5, 11, 48]), TensorDataset(inputs, targets),
                                 rank=comm.rank, seed=3)  # fmt: skip
        model = BalancedDataParallel(make_model("convnet"), comm, loader, bucket_mb=0.001)
        assert len(model.gradients.buckets) > 2  # buckets between the BatchNorm layers
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            _on_a_thread(loss.backward) if comm.rank == 1 else loss.backward()
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    grads = _values(run_ranks(3, work, timeout=60))
    assert all(torch.equal(g, grads[0]) for g in grads)


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("mismatch", "layer 'head.1' (BatchNorm1d(8)) is on rank 0 but not on rank 1"),
        ("skip", "out of step at synchronised BatchNorm layer 'conv3d.1' (forward)"),
    ],
)
def test_batchnorm_layers_that_differ_or_a_skipped_forward_stop_every_rank(case, said):
    lines = _values(run_ranks(3, lambda comm: bn_case(comm, case), timeout=60))
    assert said in lines[0] and "refused on every rank" in lines[0], lines


def test_models_that_differ_are_refused_on_every_rank_naming_the_parameter():
    messages = _values(run_ranks(3, mismatch, timeout=30))
    assert len(set(messages)) == 1
    assert "'0.weight'" in messages[0] and "(33, 8)" in messages[0] and "(32, 8)" in messages[0]


def _toy(n: int = 16) -> TensorDataset:
    return TensorDataset(torch.randn(n, 4), torch.randint(0, 2, (n,)))


def _run_all(size: int, work):
    """Each rank's exception, caught on the rank (an uncaught one would abort the others)."""

    def caught(comm):
        try:
            work(comm)
        except Exception as exc:  # noqa: BLE001 - the test judges it
            return exc
        return None

    return _values(run_ranks(size, caught, timeout=30))


def test_a_loader_planned_for_another_world_size_is_one_error_on_every_rank():
    def work(comm):
        loader = balanced_loader([1.0, 1.0, 1.0], _toy(), global_batch_size=6, rank=comm.rank)
        BalancedDataParallel(nn.Linear(4, 2), comm, loader)

    errors = _run_all(2, work)
    assert all(isinstance(e, CollectiveError) for e in errors), errors
    assert "plan is for 3 ranks but the job has 2" in str(errors[0])


def test_a_loader_built_for_another_rank_is_named():
    def work(comm):
        loader = balanced_loader([1.0, 1.0], _toy(), global_batch_size=4, rank=0)
        BalancedDataParallel(nn.Linear(4, 2), comm, loader)

    errors = _run_all(2, work)
    assert all(isinstance(e, CollectiveError) for e in errors), errors
    assert "rank 1: loader was built for rank 0; pass rank=comm.rank" in str(errors[0])


@pytest.mark.parametrize(
    ("speeds", "lengths", "said"),
    [
        # One plan per rank from its own speeds: the weights would sum to 2/3.
        ([[1.0, 2.0], [2.0, 1.0]], [16, 16], "on the plan ([2, 4] on rank 0, [4, 2] on rank 1)"),
        # Datasets of other lengths: rank 0 would finish its epoch while rank 1 waits.
        ([[1.0, 1.0], [1.0, 1.0]], [16, 24], "on the dataset length (16 on rank 0, 24 on rank 1)"),
    ],
)
def test_loaders_that_differ_between_ranks_are_one_error_on_every_rank(speeds, lengths, said):
    def work(comm):
        data = _toy(lengths[comm.rank])
        loader = balanced_loader(speeds[comm.rank], data, global_batch_size=6, rank=comm.rank)
        BalancedDataParallel(nn.Linear(4, 2), comm, loader)

    errors = _run_all(2, work)
    assert all(isinstance(e, CollectiveError) for e in errors), errors
    assert all(f"the ranks' loaders disagree {said}" in str(e) for e in errors), errors


def test_buckets_that_differ_between_ranks_are_one_error_on_every_rank():
    # Once: rank 1 summed its one bucket with rank 0's first (NaN weights), rank 0 hung.
    def work(comm):
        loader = balanced_loader([1.0, 1.0], _toy(), global_batch_size=4, rank=comm.rank)
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
        BalancedDataParallel(model, comm, loader, bucket_mb=[1e-4, 25.0][comm.rank])

    errors = _run_all(2, work)
    assert all(isinstance(e, CollectiveError) for e in errors), errors
    assert len({str(e) for e in errors}) == 1
    assert "rank 1 cuts the gradients into 1 bucket (58 elements)" in str(errors[0])
    assert "pass the same bucket_mb and overlap" in str(errors[0])


def test_a_communicator_that_is_none_is_a_type_error_naming_it():
    loader = balanced_loader([1.0], _toy(), global_batch_size=4, rank=0)
    with pytest.raises(TypeError, match=r"comm=None is not a communicator"):
        BalancedDataParallel(nn.Linear(4, 2), None, loader)


def test_seeds_that_differ_without_shuffling_are_no_disagreement():
    def work(comm):
        loader = balanced_loader(
            [1.0, 1.0], _toy(), global_batch_size=4, rank=comm.rank, shuffle=False, seed=comm.rank
        )
        BalancedDataParallel(nn.Linear(4, 2), comm, loader)

    assert _run_all(2, work) == [None, None]


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))


@pytest.mark.parametrize(("broadcast", "sync"), [(True, False), (False, False), (False, True)])
def test_buffers_are_one_state_after_each_step_from_the_largest_share(broadcast, sync):
    """Plain BatchNorm's statistics are copied; synchronised ones agree with no copy."""
    plan = plan_batches([2.0, 10.0, 4.0], 16, "proportional")

    def work(comm):
        loader = balanced_loader(plan, _toy(64), rank=comm.rank)
        model = BalancedDataParallel(
            _bn_model(), comm, loader, broadcast_buffers=broadcast, sync_batchnorm=sync
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return model.module[1].running_mean.clone(), int(model.module[1].num_batches_tracked)

    states = _values(run_ranks(3, work, timeout=60))
    same = all(torch.equal(states[0][0], s[0]) for s in states)
    assert same == (broadcast or sync)  # without either, each rank keeps its own statistics
    assert states[0][1] == 4  # 64 samples / 16 per global batch


def test_a_rank_that_skips_backward_is_told_at_its_next_batch():
    loader = balanced_loader([1.0], _toy(8), global_batch_size=4, rank=0)
    model = BalancedDataParallel(nn.Linear(4, 2), SingleProcessCommunicator(), loader)
    batches = iter(loader)
    x, _ = next(batches)
    model(x)  # no backward
    x, _ = next(batches)
    with pytest.raises(RuntimeError, match="every rank must run forward and backward"):
        model(x)


def test_an_eval_mode_forward_between_steps_is_not_a_step():
    loader = balanced_loader([1.0], _toy(8), global_batch_size=4, rank=0)
    model = BalancedDataParallel(nn.Linear(4, 2), SingleProcessCommunicator(), loader)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        model.eval()
        nn.functional.cross_entropy(model(x), y)  # a validation loss, grad enabled
        model.train()


def _step(model, x, y) -> float:
    """One step's forward and backward; the gradient's norm after the sync."""
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return float(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm())


@pytest.mark.parametrize("how", ["list", "another loader", "a second step on one batch"])
def test_a_training_forward_without_a_new_batch_is_refused_not_weighted_zero(how):
    # Each of these once trained silently on gradients of zero: the weight comes from the
    # wrapped loader's latest batch, and that one was synced already (or never drawn).
    data = _toy(16)
    loader = balanced_loader([1.0], data, global_batch_size=4, rank=0, seed=3)
    model = BalancedDataParallel(nn.Linear(4, 2), SingleProcessCommunicator(), loader)
    if how == "list":
        batches = list(loader)
        assert _step(model, *batches[0]) > 0  # the first forward counts the newest batch
        step = batches[1]
    elif how == "another loader":
        step = next(iter(balanced_loader([1.0], data, global_batch_size=4, rank=0)))
    else:
        step = next(iter(loader))
        assert _step(model, *step) > 0
    with pytest.raises(RuntimeError, match=r"rank 0: a training forward without a new batch"):
        _step(model, *step)
    with torch.no_grad():
        model(step[0])  # a forward that is no training step stays allowed


@pytest.mark.parametrize("skipped", ["set_epoch", "set_plan", "set_plan with a zero share"])
def test_a_rank_that_skips_set_epoch_or_set_plan_is_one_error_on_every_rank(skipped):
    # Once silent: rank 1 drew epoch 0's permutation again (76 of 96 samples seen in an
    # epoch), or weighed its batch by the old plan, and every sum still ran.
    data = _toy(24)
    old = plan_batches([1.0, 1.0], 8, "proportional")
    new = _plan([8, 0]) if "zero" in skipped else plan_batches([3.0, 1.0], 8, "proportional")

    skipper = 0 if "zero" in skipped else 1  # with the zero share on rank 1, which branches

    def work(comm):
        loader = balanced_loader(old, data, rank=comm.rank)
        model = BalancedDataParallel(nn.Linear(4, 2), comm, loader)
        for epoch in range(2):
            if epoch == 1 and (comm.rank != skipper or "set_epoch" not in skipped):
                loader.set_epoch(epoch)
            if epoch == 1 and (comm.rank != skipper or "set_plan" not in skipped):
                loader.set_plan(new)
            for x, y in loader:
                if loader.empty:
                    model.finish()  # a zero share that branches meets the check here
                    continue
                _step(model, x, y)

    errors = _run_all(2, work)
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError], errors
    assert str(errors[0]) == str(errors[1])
    if skipped == "set_epoch":
        assert "rank 1 starts epoch 0 and rank 0 epoch 1" in str(errors[0])
    elif skipped == "set_plan":
        assert "rank 1 shares the batch as [4, 4] and rank 0 as [6, 2]" in str(errors[0])
    else:
        assert "rank 1 shares the batch as [8, 0] and rank 0 as [4, 4]" in str(errors[0])


@pytest.mark.parametrize("skip", [False, True])
def test_the_epoch_check_meets_a_zero_share_that_branches_while_accumulating(skip):
    # The branching rank counts only the batches it syncs: a check at each epoch's step-0
    # forward once paired an allgather on one rank with a gradient allreduce on the other.
    data = _toy(32)

    def work(comm):
        loader = balanced_loader(_plan([8, 0]), data, rank=comm.rank)
        model = BalancedDataParallel(nn.Linear(4, 2), comm, loader)
        for epoch in range(2):
            if not (skip and comm.rank == 1):
                loader.set_epoch(epoch)
            for step, (x, y) in enumerate(loader):
                sync = step % 2 == 1
                if loader.empty:
                    if sync:
                        model.finish()
                    continue
                if sync:
                    nn.functional.cross_entropy(model(x), y).backward()
                else:
                    with model.no_sync():
                        nn.functional.cross_entropy(model(x), y).backward()

    errors = _run_all(2, work)
    if skip:
        assert [type(e) for e in errors] == [RuntimeError, RuntimeError], errors
        assert "rank 1 starts epoch 0 and rank 0 epoch 1" in str(errors[0])
    else:
        assert errors == [None, None]


def test_evaluation_sums_over_ranks():
    from lbtrain.evaluation import ConfusionEvaluator

    data = _toy(40)
    plan = plan_batches([1.0, 3.0], 8, "proportional")

    def work(comm):
        loader = balanced_loader(plan, data, rank=comm.rank)
        model = BalancedDataParallel(nn.Linear(4, 2), comm, loader)
        return model.evaluate(data, ConfusionEvaluator(2))["total"]

    assert _values(run_ranks(2, work, timeout=30)) == [40, 40]


def test_plan_for_plans_from_given_profiles_the_same_on_every_rank():
    # A rank three times slower per sample gets fewer samples. (Ladders that cover every
    # share: nothing to re-time.)
    profiles = [
        _profile(0, beta=0.001, batch_sizes=(4, 64), step_times=(0.014, 0.074)),
        _profile(1, beta=0.003, batch_sizes=(4, 64), step_times=(0.022, 0.202)),
    ]
    model, sample = nn.Linear(4, 2), (torch.randn(2, 4), torch.zeros(2, dtype=torch.long))

    def work(comm):
        plan = plan_for(model, nn.CrossEntropyLoss(), sample, comm, 64, "proportional",
                        profiles=profiles)  # fmt: skip
        return plan.batch_sizes

    plans = _values(run_ranks(2, work, timeout=30))
    assert plans[0] == plans[1] and sum(plans[0]) == 64 and plans[0][0] > plans[0][1]


def test_plan_for_times_a_share_outside_the_measured_batches_where_it_falls(monkeypatch):
    """The trainer's way from profiles to a plan, for a user's loop too: rank 0's share
    (about 48 of 64) lies beyond its ladder (10, 20) by more than 25%, so it is timed at
    that share on the real model and the plan made again; rank 1's (about 16) is not."""
    from lbtrain.profiling import measured_plan

    calls = []
    retime = measured_plan.retime_profiles

    def counted(comm, model, optimizer, loss_fn, make_batch, profiles, wanted, **kwargs):
        calls.append((comm.rank, list(wanted)))
        return retime(comm, model, optimizer, loss_fn, make_batch, profiles, wanted, **kwargs)

    monkeypatch.setattr(measured_plan, "retime_profiles", counted)
    profiles = [_profile(0, beta=0.001), _profile(1, beta=0.003, step_times=(0.04, 0.07))]
    sample = (torch.randn(2, 4), torch.zeros(2, dtype=torch.long))

    def work(comm):
        torch.set_num_threads(1)
        plan = plan_for(nn.Linear(4, 2), nn.CrossEntropyLoss(), sample, comm, 64,
                        "proportional", profiles=profiles)  # fmt: skip
        return plan.batch_sizes

    plans = _values(run_ranks(2, work, timeout=60))
    assert plans[0] == plans[1] and sum(plans[0]) == 64
    # Each rank's first round: the same batches asked of both (a collective), rank 0's only.
    first = [next(w for r, w in calls if r == rank) for rank in (0, 1)]
    assert first[0] == first[1], calls
    assert first[0][0] is not None and first[0][0] > 25 and first[0][1] is None, calls


def test_plan_for_does_not_time_a_share_of_one_sample():
    """Rank 0, re-timed on the real (tiny) model, looks so fast that the next plan gives
    rank 1 one sample of 64: one sample cannot train plain BatchNorm, so re-timing leaves a
    share of 1 alone (it once failed there, where training would not)."""
    profiles = [_profile(0, beta=0.001), _profile(1, beta=0.003, step_times=(0.04, 0.07))]
    sample = (torch.randn(2, 4), torch.zeros(2, dtype=torch.long))

    def work(comm):
        torch.set_num_threads(1)
        model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
        return plan_for(model, nn.CrossEntropyLoss(), sample, comm, 64, "proportional",
                        profiles=profiles).batch_sizes  # fmt: skip

    plans = _values(run_ranks(2, work, timeout=60))
    assert plans[0] == plans[1] and sum(plans[0]) == 64, plans


@pytest.mark.parametrize(
    ("name", "values"),
    [("global_batch", (64, 32)), ("policy", ("proportional", "equal")), ("min_batch", (0, 2))],
)
def test_plan_for_arguments_that_differ_between_ranks_are_named(name, values):
    # Once found only later, as loaders that disagree on the plan.
    profiles = [_profile(0, beta=0.001), _profile(1, beta=0.003, step_times=(0.04, 0.07))]
    model, sample = nn.Linear(4, 2), (torch.randn(2, 4), torch.zeros(2, dtype=torch.long))

    def work(comm):
        given = {"global_batch": 64, "policy": "proportional", "min_batch": 0}
        given[name] = values[comm.rank]
        plan_for(model, nn.CrossEntropyLoss(), sample, comm, profiles=profiles, **given)

    errors = _run_all(2, work)
    assert len({str(e) for e in errors}) == 1 and errors[0] is not None, errors
    assert f"plan_for got {name}={values[1]!r} on rank 1" in str(errors[0]), errors[0]


def test_plan_for_profiles_the_real_model_on_every_rank():
    sample = (torch.randn(3, 4), torch.zeros(3, dtype=torch.long))

    def work(comm):
        torch.set_num_threads(1)
        model = nn.Linear(4, 2)
        plan = plan_for(model, nn.CrossEntropyLoss(), sample, comm, 32, time_budget=0.2)
        return plan.batch_sizes, plan.policy

    plans = _values(run_ranks(2, work, timeout=60))
    assert plans[0] == plans[1] and sum(plans[0][0]) == 32 and plans[0][1] == "cost"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"global_batch": 0}, "global_batch=0 is invalid"),
        ({"global_batch": 2.5}, "global_batch=2.5"),
        ({"policy": "fast"}, "policy='fast' must be one of"),
        ({"sample": (torch.zeros(0, 4), torch.zeros(0))}, "sample must be one batch"),
        # Its own parameter's name and value, not the command line's flag at 75% of it.
        ({"time_budget": -1}, "time_budget=-1 must be a positive number of seconds"),
        ({"time_budget": float("nan")}, "time_budget=nan must be a positive number"),
        ({"time_budget": "10"}, "time_budget='10' (str) is not a number"),
        # Each once failed deep in profiling, in torch's words.
        ({"sample": torch.zeros(2, 4)}, "sample must be one batch as a pair (inputs, targets)"),
        ({"model": nn.ReLU()}, "model ReLU has no trainable parameters"),
        ({"optimizer": "sgd"}, "optimizer='sgd' is not a torch.optim.Optimizer"),
    ],
)
def test_plan_for_refuses_bad_arguments_before_profiling(kwargs, message):
    arguments = {
        "model": nn.Linear(4, 2),
        "loss_fn": nn.CrossEntropyLoss(),
        "sample": (torch.zeros(2, 4), torch.zeros(2, dtype=torch.long)),
        "comm": SingleProcessCommunicator(),
        "global_batch": 8,
    } | kwargs
    with pytest.raises(CollectiveError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_for(**arguments)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overlap": "yes"}, "overlap='yes' (str) must be True or False"),
        ({"sync_batchnorm": 1}, "sync_batchnorm=1 (int) must be True or False"),
        ({"sync_in_backward": "no"}, "sync_in_backward='no' (str) must be True or False"),
    ],
)
def test_the_wrappers_flags_must_be_bools(kwargs, message):
    """A string "no" is true to Python: a flag that is not a bool is refused, not read."""
    from lbtrain.parallel.gradients import GradientSync

    comm = SingleProcessCommunicator()
    loader = balanced_loader(plan_batches([1.0], 4, "proportional"), _toy(), rank=0)
    with pytest.raises(CollectiveError, match=re.escape(message)):
        BalancedDataParallel(nn.Linear(4, 2), comm, loader, **kwargs)
    with pytest.raises(TypeError, match=re.escape("overlap='no' (str) must be True or False")):
        GradientSync(nn.Linear(4, 2), comm, overlap="no")
    with pytest.raises(TypeError, match="model=None is not a module or its parameters"):
        GradientSync(None, comm)
    with pytest.raises(TypeError, match="comm=None is not a communicator; pass lbtrain.world_"):
        sync_gradients(nn.Linear(4, 2), 1.0, None)


def test_train_state_and_the_batchnorm_conversion_name_a_wrong_argument_at_once():
    """Each failed late before (TrainState at its first save, mid-run), as AttributeError."""
    from lbtrain import TrainState, convert_sync_batchnorm

    comm = SingleProcessCommunicator()
    model = nn.Linear(4, 2)
    loader = balanced_loader(plan_batches([1.0], 4, "proportional"), _toy(), rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for args, needle in [
        ((model, None, loader, comm), "optimizer=None is not Optimizer"),
        ((model, optimizer, list(loader), comm), "is not BalancedLoader: pass this rank"),
        ((model, optimizer, loader, None), "comm=None is not a communicator"),
    ]:
        with pytest.raises(TypeError, match=re.escape(needle)):
            TrainState(*args)
    with pytest.raises(TypeError, match="model=None is not an nn.Module; pass the model"):
        convert_sync_batchnorm(None, comm)


def test_plan_for_without_a_communicator_says_which_to_pass():
    sample = (torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="comm=None is not a communicator; pass lbtrain.world_"):
        plan_for(nn.Linear(4, 2), nn.CrossEntropyLoss(), sample, None, 8)


def test_the_ddp_hook_state_wants_a_balanced_loader():
    from torch.utils.data import DataLoader

    from lbtrain import WeightedHookState

    with pytest.raises(ValueError, match="is not a BalancedLoader"):
        WeightedHookState(DataLoader(_toy()))


def test_outputs_kept_past_the_wrapper_do_not_keep_it_alive():
    """As DDP's _DDPSink holds its reducer weakly: a loss kept for logging must not keep the
    wrapper, its buckets and model alive; a backward through it then says why."""
    import gc
    import weakref

    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    loader = balanced_loader(_plan([8]), data, rank=0)
    model = BalancedDataParallel(nn.Linear(4, 2), SingleProcessCommunicator(), loader)
    inputs, targets = next(iter(loader))
    loss = nn.functional.cross_entropy(model(inputs), targets)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None
    with pytest.raises(RuntimeError, match="BalancedDataParallel that no longer exists"):
        loss.backward()


def test_a_prescaled_that_is_not_a_bool_is_refused_not_read_as_true():
    """`prescaled="no"` is truthy: the weight was left out of every gradient (2.08 off one
    process on 2 ranks, with no error)."""
    from lbtrain import WeightedHookState

    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"prescaled='no' \(str\) must be True or False"):
        sync_gradients(model, 1.0, SingleProcessCommunicator(), prescaled="no")
    loader = balanced_loader(plan_batches([1.0], 4, "equal"), list(range(8)), rank=0)
    with pytest.raises(TypeError, match=r"prescaled='no' \(str\) must be True or False"):
        WeightedHookState(loader, prescaled="no")
