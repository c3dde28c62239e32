"""`SyncBatchNorm` on its own: one process's BatchNorm over any split of the batch.

The training runs through `BalancedDataParallel` (every engine, zero shares, ResNet) are in
test_parallel.py and tests/mpi/test_exactness.py; here, the layer's own cases.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import BalancedDataParallel, SyncBatchNorm, balanced_loader, convert_sync_batchnorm
from lbtrain.comm import SingleProcessCommunicator, run_ranks
from tests.mpi.scripts.wrapper_exactness import _plan


def _values(results):
    for result in results:
        if result.error is not None:
            raise result.error
    return [result.value for result in results]


def _split_run(model: nn.Module, inputs: torch.Tensor, sizes: list[int], devices=None):
    """Forward and backward of `inputs` cut into `sizes` on in-process ranks (on `devices`, the
    CPU by default), against one process on the CPU: (max output difference, max
    input-gradient difference, max parameter-gradient difference); buffers are checked here."""
    reference = copy.deepcopy(model)
    x = inputs.clone().requires_grad_()
    out = reference(x)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out).double()
    (out * weights).sum().backward()

    def work(comm):
        device = torch.device(devices[comm.rank] if devices else "cpu")
        mine = convert_sync_batchnorm(copy.deepcopy(model), comm).to(device)
        start = sum(sizes[: comm.rank])
        part = inputs[start : start + sizes[comm.rank]].to(device).requires_grad_()
        y = mine(part)
        (y * weights[start : start + len(part)].to(device)).sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in mine.parameters()]).cpu()
        comm.allreduce_sum_(grads)
        return (
            (y.cpu() - out[start : start + len(part)]).abs().max().item() if len(part) else 0.0,
            (part.grad.cpu() - x.grad[start : start + len(part)]).abs().max().item()
            if len(part)
            else 0.0,
            (grads - torch.cat([p.grad.reshape(-1) for p in reference.parameters()])).abs().max(),
            [b.cpu().clone() for b in mine.buffers()],
        )

    results = _values(run_ranks(len(sizes), work, timeout=60))
    buffers = [r[3] for r in results]
    for rank_buffers in buffers:
        for mine, theirs in zip(rank_buffers, reference.buffers(), strict=True):
            assert torch.allclose(mine.double(), theirs.double(), rtol=0, atol=1e-12)
    return max(r[0] for r in results), max(r[1] for r in results), max(r[2] for r in results)


@pytest.mark.parametrize(
    "layer",
    [
        nn.BatchNorm1d(5, momentum=None),  # a cumulative average of the statistics
        nn.BatchNorm1d(5, track_running_stats=False),
        nn.BatchNorm1d(5, affine=False),
    ],
    ids=["momentum-none", "no-running-stats", "no-affine"],
)
def test_every_kind_of_batchnorm_layer_is_one_process_over_the_split_batch(layer):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), layer, nn.Tanh(), nn.Linear(5, 2)).double()
    inputs = torch.randn(24, 3, dtype=torch.float64) * 3 + 2
    for _ in range(2):  # the second forward starts from the first's running statistics
        outputs, grads, params = _split_run(model, inputs, [1, 0, 23])
        assert max(outputs, grads, params) < 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ranks_on_a_gpu_and_on_cpus_are_one_process_over_the_split_batch():
    """The collectives' float64 buffers live on each rank's device. One in-process rank on
    the GPU: two would share autograd's device thread and wait for each other there."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(12, 4), nn.BatchNorm1d(4)).double()  # fmt: skip
    inputs = torch.randn(30, 2, 4, 4, dtype=torch.float64) * 3 + 2
    for _ in range(2):
        outputs, grads, params = _split_run(model, inputs, [9, 0, 21], ["cuda:0", "cpu", "cpu"])
        assert max(outputs, grads, params) < 1e-12


def test_with_one_rank_or_none_it_is_batchnorm_itself():
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3).double()
    synced = convert_sync_batchnorm(copy.deepcopy(plain), SingleProcessCommunicator())
    assert isinstance(synced, SyncBatchNorm)
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    assert torch.equal(plain(x), synced(x))
    plain.eval(), synced.eval()
    assert torch.equal(plain(x), synced(x))


def test_eval_mode_uses_the_running_statistics_with_no_collective():
    class NoCollectives(SingleProcessCommunicator):
        size = 2  # looks like a job, and fails if a collective is made

        def allreduce_sum_(self, buffer):
            raise AssertionError("a collective in eval mode")

    layer = SyncBatchNorm(3)
    layer.comm = NoCollectives()
    layer.running_mean.fill_(1.0)
    layer.eval()
    x = torch.full((2, 3), 1.0)
    assert torch.allclose(layer(x), torch.zeros(2, 3))


@pytest.mark.parametrize("kind", [nn.BatchNorm1d, nn.BatchNorm2d])
def test_float32_statistics_of_an_off_centre_channel_are_combined_in_float64(kind):
    """A channel of mean 1e4 and spread 1: in float32 the sum of squares minus N mean^2
    gives +8 or -8 for a variance of about 1 (an ulp of 6e9, over 60); the ranks' figures
    are combined in float64. What remains is the float32 rounding of each rank's
    mean (an ulp of 1e4 is 1e-3), which moves the between-ranks term by about 1e-4.
    BatchNorm2d's inputs take the other way to a rank's figures (shifted float32 sums on
    the CPU): its shift must keep them as precise."""
    torch.manual_seed(0)
    inputs = torch.randn(60, 2) + 1e4 if kind is nn.BatchNorm1d else torch.randn(60, 2, 4, 4) + 1e4
    dims = [0] if kind is nn.BatchNorm1d else [0, 2, 3]

    def work(comm):
        layer = convert_sync_batchnorm(kind(2, momentum=1.0), comm)
        layer(inputs[comm.rank * 20 : (comm.rank + 1) * 20])
        return layer.running_var

    expected = inputs.double().var(dim=dims)
    for variance in _values(run_ranks(3, work, timeout=30)):
        assert torch.allclose(variance.double(), expected, rtol=1e-3)


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("params", ["low", "float32"])
def test_half_and_bfloat16_inputs_train_on_cpu_ranks_as_batchnorm_does(low, params):
    """A half or bfloat16 input, with the layer in that type or in float (BatchNorm's mixed
    case), on CPU ranks with shares 4/12: one process's float32 BatchNorm up to the low
    type's rounding. (Backward refused both before: the CPU's kernels want the figures in
    the parameters' type.) Per-rank statistics miss by tenths."""
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(4)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5), plain.bias.uniform_(-1, 1)
    inputs = (torch.randn(16, 4, 3, 3) * 2 + torch.linspace(-3, 3, 16).view(16, 1, 1, 1)).to(low)
    grads = torch.randn(16, 4, 3, 3).to(low)
    reference = copy.deepcopy(plain)
    x = inputs.float().requires_grad_()
    expected = reference(x)
    expected.backward(grads.float())
    tolerance = 2e-2 if low is torch.float16 else 1e-1  # against values of order 1 to 10

    def work(comm):
        layer = convert_sync_batchnorm(copy.deepcopy(plain).to(low if params == "low" else None),
                                       comm)  # fmt: skip
        start, stop = (0, 4) if comm.rank == 0 else (4, 16)
        part = inputs[start:stop].clone().requires_grad_()
        out = layer(part)
        out.backward(grads[start:stop])
        assert out.dtype == part.grad.dtype == low
        weight_grad = layer.weight.grad.float()
        comm.allreduce_sum_(weight_grad)
        return (
            (out.float() - expected[start:stop]).abs().max().item(),
            (part.grad.float() - x.grad[start:stop]).abs().max().item(),
            (weight_grad - reference.weight.grad).abs().max().item() / 10,  # sums of 144
            (layer.running_var.float() - reference.running_var).abs().max().item(),
            (layer.running_mean.float() - reference.running_mean).abs().max().item(),
        )

    for errors in _values(run_ranks(2, work, timeout=60)):
        assert max(errors) < tolerance, errors
    # The negative control: rank 0's own statistics (its 4 samples) in forward.
    alone = copy.deepcopy(plain)(inputs[:4].float())
    assert (alone - expected[:4].detach()).abs().max() > 10 * tolerance


def test_a_half_layer_normalises_a_variance_beyond_half_s_range():
    """A float16 layer and input of spread 400: the variance, 1.6e5, is past float16's
    65504. As half figures it was inf: the output collapsed to the bias, every gradient to
    0. The figures and parameters go to the kernels in float, as BatchNorm's mixed case."""
    torch.manual_seed(0)
    inputs = (torch.randn(16, 3, 4, 4) * 400).half()
    plain = nn.BatchNorm2d(3)
    expected = plain(inputs.float())

    def work(comm):
        layer = convert_sync_batchnorm(copy.deepcopy(nn.BatchNorm2d(3)).half(), comm)
        part = inputs[comm.rank * 8 : (comm.rank + 1) * 8].clone().requires_grad_()
        out = layer(part)
        out.float().square().sum().backward()
        return (
            (out.float() - expected[comm.rank * 8 : (comm.rank + 1) * 8]).abs().max().item(),
            part.grad.float().abs().max().item(),
            (layer.running_var.float() / plain.running_var - 1).abs().max().item(),
        )

    for output_error, grad_size, running_error in _values(run_ranks(2, work, timeout=60)):
        assert output_error < 2e-2 and running_error < 1e-2
        assert grad_size > 0  # a normalised output's gradient: small, not exactly 0


def test_a_rank_s_variance_stays_precise_with_one_sample_far_from_the_others():
    """A rank's figures come from sums of the input less its mean (BatchNorm2d on the CPU):
    a sparse channel, one sample active among 2048, against float64. Less the first
    sample's mean instead, the float32 sums cancel: 1e-2 off."""
    torch.manual_seed(0)
    inputs = torch.randn(2048, 2, 2, 2) * 1e-2
    inputs[0] += 100

    def work(comm):
        layer = convert_sync_batchnorm(nn.BatchNorm2d(2, momentum=1.0), comm)
        layer(inputs[comm.rank * 1024 : (comm.rank + 1) * 1024])
        return layer.running_var

    expected = inputs.double().var(dim=[0, 2, 3])
    for variance in _values(run_ranks(2, work, timeout=30)):
        assert torch.allclose(variance.double(), expected, rtol=1e-4)


def test_a_batchnorm_of_its_own_is_refused_by_name_on_every_rank():
    class MyNorm(nn.BatchNorm1d):
        def forward(self, x):
            return super().forward(x) * 2

    def work(comm):
        try:
            convert_sync_batchnorm(nn.Sequential(nn.Linear(2, 3), MyNorm(3)), comm)
        except ValueError as exc:
            return str(exc)
        return None

    said = _values(run_ranks(2, work, timeout=30))
    assert said[0] == said[1]
    assert said[0].startswith("layer '1' is a MyNorm, a BatchNorm of its own"), said


def test_a_global_batch_of_one_sample_is_refused_as_batchnorm_does():
    def work(comm):
        layer = convert_sync_batchnorm(nn.BatchNorm1d(2), comm)
        try:
            layer(torch.ones(comm.rank, 2))  # 0 and 1 samples
        except ValueError as exc:
            return str(exc)
        return None

    said = _values(run_ranks(2, work, timeout=30))
    assert said[0] == said[1] and "got 1 value per channel over all ranks" in said[0], said


def _count_model(reduction: str):
    loader = balanced_loader(_plan([4]), TensorDataset(torch.randn(8, 2)), rank=0)
    comm = SingleProcessCommunicator()
    return BalancedDataParallel(nn.Linear(2, 1), comm, loader, loss_reduction=reduction), loader


def test_a_count_loss_without_its_count_is_one_line_at_backward():
    model, loader = _count_model("count")
    (x,) = next(iter(loader))
    with pytest.raises(RuntimeError, match=r"call model.set_loss_count\(n\) on every rank"):
        model(x).sum().backward()


def test_set_loss_count_is_refused_for_another_reduction():
    model, _ = _count_model("mean")
    with pytest.raises(RuntimeError, match="set_loss_count\\(\\) is for loss_reduction='count'"):
        model.set_loss_count(3)


def test_profiling_times_the_synchronised_arithmetic_and_puts_the_model_back(monkeypatch):
    """Each rank is profiled alone, where a synchronised layer would be plain BatchNorm; the
    plan must see what training computes, so profiling runs the synchronised path with
    one-rank collectives, then hands back the very layers it found."""
    from lbtrain.parallel import batchnorm
    from lbtrain.profiling import ProfileConfig, profile_replica

    calls = []
    apply = batchnorm._SyncBatchNormFunction.apply
    monkeypatch.setattr(batchnorm._SyncBatchNormFunction, "apply",
                        lambda *args: calls.append(1) or apply(*args))  # fmt: skip
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Sequential(nn.BatchNorm1d(3)))
    layers = [model[1], model[2][0]]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = copy.deepcopy(model.state_dict())

    def make_batch(size, device):
        return torch.randn(size, 4, device=device), torch.randint(0, 3, (size,), device=device)

    config = ProfileConfig(min_batch=2, max_batch=4, time_budget=5.0, memory_cap=False)
    profile_replica(model, optimizer, nn.functional.cross_entropy, make_batch, config=config,
                    sync_batchnorm=True)  # fmt: skip
    assert calls, "no step ran synchronised BatchNorm"
    assert [model[1], model[2][0]] == layers and all(type(m) is nn.BatchNorm1d for m in layers)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
    # The flag off (one-rank jobs) times plain BatchNorm.
    calls.clear()
    profile_replica(model, optimizer, nn.functional.cross_entropy, make_batch, config=config)
    assert not calls


def test_timed_as_synchronised_computes_what_batchnorm_computes_and_restores_a_converted_layer():
    from lbtrain.parallel.batchnorm import timed_as_synchronised

    torch.manual_seed(0)
    plain = nn.Sequential(nn.BatchNorm2d(3)).double()
    converted = convert_sync_batchnorm(copy.deepcopy(plain), SingleProcessCommunicator())
    converted[0].stamp, converted[0]._forwards = 7, 5
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    seen = []
    hooked = copy.deepcopy(plain)
    hooked[0].register_forward_hook(lambda module, args, output: seen.append(type(module)))
    with timed_as_synchronised(converted), timed_as_synchronised(hooked) as other:
        assert type(other[0]) is SyncBatchNorm and converted[0].alone_as_synchronised
        assert torch.allclose(other(x), plain(x), atol=1e-12)
        assert torch.allclose(other[0].running_var, plain[0].running_var, atol=1e-12)
        converted.train()(x)
    # The stand-in ran the layer's hooks; the converted layer got back its own settings
    # (its call count is the stamp of its next collective without the wrapper).
    assert seen == [SyncBatchNorm]
    assert not converted[0].alone_as_synchronised
    assert (converted[0].stamp, converted[0]._forwards) == (7, 5)


def test_running_figures_updated_through_numpy_still_raise_their_version():
    # On a CPU rank the update goes through numpy, which torch does not see: without the
    # version raised, a backward through an earlier eval forward (which saved the running
    # figures) would silently use the new ones, where BatchNorm's own update makes autograd
    # refuse it.
    from lbtrain.parallel.batchnorm import timed_as_synchronised

    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3))
    x = torch.randn(4, 3, 5, 5)
    with timed_as_synchronised(model) as stand_in:
        stand_in.eval()
        out = stand_in(x).sum()
        versions = stand_in[1].running_mean._version, stand_in[1].running_var._version
        stand_in.train()(x)
        assert stand_in[1].running_mean._version > versions[0]
        assert stand_in[1].running_var._version > versions[1]
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.backward()
