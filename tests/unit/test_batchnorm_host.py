"""Synchronised BatchNorm's compiled CPU passes (batchnorm_host.c) against torch's kernels
and one process, and the way to torch's kernels where the C file cannot be built."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from lbtrain import SyncBatchNorm, convert_sync_batchnorm
from lbtrain.comm import SingleProcessCommunicator, run_ranks
from lbtrain.parallel import batchnorm_host, batchnorm_step
from tests.unit.test_sync_batchnorm import _split_run, _values

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


@pytest.fixture(params=["compiled", "torch"])
def passes(request, monkeypatch):
    """Each test twice: through the compiled passes, and through torch's kernels."""
    if request.param == "compiled" and batchnorm_host.kernels(torch.float64) is None:
        pytest.skip(f"no compiled passes here: {batchnorm_host.describe()}")
    monkeypatch.setenv("LBTRAIN_HOST_KERNELS", "1" if request.param == "compiled" else "0")
    return request.param


def _conv_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv3d(2, 3, (1, 2, 2)), nn.BatchNorm3d(3, affine=False), nn.ReLU(), nn.Flatten(1, 2),
        nn.Conv2d(6, 4, 2), nn.BatchNorm2d(4, momentum=None), nn.Tanh(),
        nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4, track_running_stats=False), nn.Flatten(),
        nn.Linear(16, 3),
    ).double()  # fmt: skip


@pytest.mark.parametrize("sizes", [[5, 11, 8], [1, 0, 23]], ids=["5-11-8", "1-0-23"])
def test_conv_layers_are_one_process_over_the_split_batch(passes, sizes):
    """BatchNorm3d and 2d, affine or not, momentum None, no running figures; float64."""
    torch.manual_seed(0)
    model = _conv_model()
    inputs = torch.randn(24, 2, 2, 4, 4, dtype=torch.float64) * 3 + 2
    for _ in range(2):  # the second forward starts from the first's running statistics
        outputs, grads, params = _split_run(model, inputs, sizes)
        assert max(outputs, grads, params) < 1e-12, (outputs, grads, params)


def test_a_channels_last_input_is_one_process_over_the_split_batch(passes):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 5, 1), nn.BatchNorm2d(5)).double()
    model = model.to(memory_format=torch.channels_last)
    inputs = torch.randn(20, 3, 4, 4, dtype=torch.float64).to(memory_format=torch.channels_last)
    outputs, grads, params = _split_run(model, inputs, [7, 13])
    assert max(outputs, grads, params) < 1e-12


def _compiled_here() -> None:
    if batchnorm_host.kernels(torch.float64) is None:
        pytest.skip(f"no compiled passes here: {batchnorm_host.describe()}")


@pytest.mark.parametrize("sizes", [[5, 11, 8], [1, 0, 23]], ids=["5-11-8", "1-0-23"])
def test_ranks_on_either_path_in_one_job_are_one_process(monkeypatch, sizes):
    """Rank 0 on torch's kernels (a CUDA rank, a node without a compiler, a large layer on
    many threads), the others compiled: both fill the collectives' slots alike."""
    _compiled_here()
    compiled = batchnorm_step._native

    def rank_0_on_torch(input, weight, bias, layer):
        return None if layer.comm.rank == 0 else compiled(input, weight, bias, layer)

    monkeypatch.setattr(batchnorm_step, "_native", rank_0_on_torch)
    torch.manual_seed(0)
    model, inputs = _conv_model(), torch.randn(24, 2, 2, 4, 4, dtype=torch.float64) * 3 + 2
    for _ in range(2):
        outputs, grads, params = _split_run(model, inputs, sizes)
        assert max(outputs, grads, params) < 1e-12, (outputs, grads, params)


@pytest.mark.parametrize("channels", [2, 64])
def test_an_input_of_other_channels_than_the_layer_s_is_one_line_on_every_rank(channels):
    def work(comm):
        layer = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3)), comm)
        try:
            layer(torch.randn(4, channels, 4, 4))
        except ValueError as exc:
            return str(exc)
        return None

    said = _values(run_ranks(2, work, timeout=30))
    assert (
        said[0]
        == said[1]
        == (
            f"synchronised BatchNorm layer '0' has 3 features, and its input {channels} channels "
            f"(shape (4, {channels}, 4, 4)): build it with num_features={channels}, or check the "
            "layer before it"
        )
    )


def test_one_rank_s_input_of_other_channels_stops_every_rank_with_a_line():
    """Only rank 0 is wrong: the others learn it in forward's collective, not by waiting."""

    def work(comm):
        layer = convert_sync_batchnorm(
            nn.Sequential(nn.BatchNorm2d(3, affine=False, track_running_stats=False)), comm
        )
        try:
            layer(torch.randn(4, 5 if comm.rank == 0 else 3, 4, 4))
        except ValueError as exc:
            return str(exc)
        return None

    said = _values(run_ranks(3, work, timeout=30))
    assert said[0].startswith("synchronised BatchNorm layer '0' has 3 features, and its input 5")
    assert (
        said[1]
        == said[2]
        == (
            "synchronised BatchNorm layer '0' has 3 features, and the input on rank 0 5 channels: "
            "build it with the input's channels as num_features, or check the layer before it"
        )
    )


def test_a_channels_last_input_gives_a_channels_last_output(passes):
    def work(comm):
        layer = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3)), comm)
        x = torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last).requires_grad_()
        out = layer(x)
        out.sum().backward()
        return out.is_contiguous(memory_format=torch.channels_last), x.grad.shape

    for channels_last, shape in _values(run_ranks(2, work, timeout=30)):
        assert channels_last and shape == (4, 3, 5, 5)


def test_float32_figures_agree_with_torch_s_kernels(monkeypatch):
    """The same float32 split through both, on 2 ranks: outputs, gradients and running
    figures within float32 rounding of each other."""
    if batchnorm_host.kernels(torch.float32) is None:
        pytest.skip(f"no compiled passes here: {batchnorm_host.describe()}")
    torch.manual_seed(0)
    inputs = torch.randn(12, 4, 6, 6) * 5 + 30

    def run(setting):
        monkeypatch.setenv("LBTRAIN_HOST_KERNELS", setting)

        def work(comm):
            layer = convert_sync_batchnorm(nn.BatchNorm2d(4), comm)
            start, stop = [(0, 4), (4, 12)][comm.rank]  # shares 4 and 8
            x = inputs[start:stop].clone().requires_grad_()
            out = layer(x)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            return out, x.grad, layer.weight.grad, layer.bias.grad, layer.running_var

        return _values(run_ranks(2, work, timeout=60))

    for compiled, torch_s in zip(run("1"), run("0"), strict=True):
        for mine, theirs in zip(compiled, torch_s, strict=True):
            assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-5)


def test_without_a_compiler_torch_s_kernels_run_and_env_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    batchnorm_host._library.cache_clear()
    try:
        assert batchnorm_host.kernels(torch.float32) is None
        assert batchnorm_host.describe() == (
            "torch's kernels (no C compiler 'no-such-compiler-here' on PATH; set CC to one)"
        )
        monkeypatch.setenv("CC", "false")  # a compiler that fails: the same way out
        batchnorm_host._library.cache_clear()
        assert batchnorm_host.kernels(torch.float32) is None
        assert batchnorm_host.describe() == "torch's kernels (the C compiler failed: exit 1)"
        monkeypatch.setenv("CC", "true")  # one that writes nothing and says it worked
        batchnorm_host._library.cache_clear()
        assert batchnorm_host.kernels(torch.float32) is None
        assert batchnorm_host.describe().startswith(
            f"torch's kernels (the library built in {tmp_path / 'lbtrain'} does not load ("
        )
        monkeypatch.setenv("CC", 'gcc "-O2')  # unbalanced quotes: named, not a parser's words
        batchnorm_host._library.cache_clear()
        assert batchnorm_host.describe() == (
            "torch's kernels (CC='gcc \"-O2' cannot be read (No closing quotation); set CC to a "
            "C compiler)"
        )
        assert list(tmp_path.rglob("*.so")) == []  # nothing half-built left in the cache
    finally:
        batchnorm_host._library.cache_clear()


@needs_cc
def test_a_damaged_library_in_the_cache_is_built_again_with_cc_s_words(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", f"{shutil.which('cc')} -DLBTRAIN_TEST=1")  # a command and a flag
    path = batchnorm_host._cached_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a library")
    batchnorm_host._library.cache_clear()
    try:
        assert batchnorm_host.kernels(torch.float64) is not None, batchnorm_host.describe()
        assert path.read_bytes()[:4] == b"\x7fELF" or path.stat().st_size > 1000
    finally:
        batchnorm_host._library.cache_clear()


@needs_cc
def test_the_library_is_built_once_into_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    batchnorm_host._library.cache_clear()
    try:
        assert batchnorm_host.kernels(torch.float64) is not None, batchnorm_host.describe()
        (built,) = (tmp_path / "lbtrain").iterdir()
        assert built.suffix == ".so"
        # Found there by a later process: no compiler needed any more.
        monkeypatch.setenv("CC", "false")
        batchnorm_host._library.cache_clear()
        assert batchnorm_host.kernels(torch.float64) is not None
        assert batchnorm_host.describe() == f"compiled ({built})"
    finally:
        batchnorm_host._library.cache_clear()


def test_a_wrong_setting_is_one_line_on_every_rank(monkeypatch):
    monkeypatch.setenv("LBTRAIN_HOST_KERNELS", "yes")

    def work(comm):
        try:
            convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(2)), comm)
        except ValueError as exc:
            return str(exc)
        return None

    said = _values(run_ranks(2, work, timeout=30))
    assert said[0] == said[1] and said[0].startswith("LBTRAIN_HOST_KERNELS='yes': use 1"), said


@needs_cc
def test_a_large_layer_on_a_rank_of_many_threads_keeps_torch_s_parallel_kernels():
    from lbtrain.parallel.batchnorm_step import _SERIAL, _native

    layer = SyncBatchNorm(2)
    small, large = torch.zeros(2, 2, 8), torch.zeros(2, 2, _SERIAL // 4 + 1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _native(small, layer.weight, layer.bias, layer) is not None
        assert _native(large, layer.weight, layer.bias, layer) is None
        torch.set_num_threads(1)
        assert _native(large, layer.weight, layer.bias, layer) is not None
    finally:
        torch.set_num_threads(threads)


def test_a_model_without_batchnorm_builds_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    batchnorm_host._library.cache_clear()
    try:
        convert_sync_batchnorm(nn.Sequential(nn.Linear(2, 2)), SingleProcessCommunicator())
        assert not (tmp_path / "lbtrain").exists()
    finally:
        batchnorm_host._library.cache_clear()


def test_env_names_a_difference_in_the_passes_and_not_in_the_cache_folders():
    from lbtrain.cli.env import _same_or_by_rank

    assert _same_or_by_rank(["compiled (/a/x.so)", "compiled (/b/x.so)"]) == "compiled (/a/x.so)"
    assert _same_or_by_rank(["compiled (/a/x.so)", "torch's kernels (LBTRAIN_HOST_KERNELS=0)"]) == (
        "differs by rank (below)"
    )
