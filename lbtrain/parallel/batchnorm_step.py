"""The forward and backward of one synchronised BatchNorm layer (`SyncBatchNorm`'s arithmetic).

A layer runs twice a step (forward and backward), and a ResNet-44 has 43 of them, so the
per-channel arithmetic is where a synchronised step loses its time on a CPU: each torch call
costs 1.5-5 us of Python and dispatch (a view, a split, a conversion), against a few us of a
small layer's own tensor work. On a CPU rank the figures therefore live in one float64 numpy
buffer (numpy's calls on 64 values cost a fraction of torch's), which the communicator sees
as a CPU tensor sharing its memory; elsewhere (CUDA) they stay torch tensors on the device.
The formulas (`_combined`, `_correction`) are written once, with operators that mean the same
on both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from lbtrain.parallel.batchnorm_host import HostKernels, kernels

_FLAGS = 4  # forward's slots after the tags (batchnorm.py's _TAG of them): see _forward_head

if TYPE_CHECKING:
    from lbtrain.parallel.batchnorm import SyncBatchNorm


def _local_sums(input: torch.Tensor, channels: int, local: int, host: bool) -> tuple[Any, Any]:
    """This rank's per-channel sum of x and of x^2, float64 (numpy on the host)."""
    full = input.dtype in (torch.float32, torch.float64)  # half sums would round the figures
    if host and input.dim() > 2 and full:
        # Two passes, the mean, then sums of the input less it (the corrected two-pass
        # variance, in the input's precision): about 3x faster on one CPU thread than
        # BatchNorm's training kernel (BENCHMARKS.md, issue 37) and as precise, since the
        # sums of (x - mean) do not cancel, however far the mean is from 0 or one sample
        # from the others. (Less the first sample's mean alone, a sparse channel, one
        # active sample in 2048, was 1% off.)
        dims = (0, *range(2, input.dim()))  # all but the channels'
        shift = input.mean(dims, keepdim=True)
        shifted = input - shift
        d1 = _host(shifted.sum(dims))
        d2 = _host(shifted.square_().sum(dims))
        s = _host(shift).reshape(channels)
        # In float64: sum x = d1 + n s; sum x^2 = d2 + 2 s d1 + n s^2 = d2 + s (d1 + sum x).
        total = d1 + local * s
        return total, d2 + s * (d1 + total)
    # BatchNorm's own training kernel for this rank's mean and 1/std (eps 0, so the
    # variance is 1/invstd^2; it gives 1/std 0 for a variance of 0): stable, and the
    # quicker one for (N, C) inputs and on CUDA (float for half and bfloat16 inputs).
    _, mean, invstd = torch.native_batch_norm(input, None, None, None, None, True, 0.0, 0.0)
    invstd, mean = invstd.double(), mean.double()
    var = torch.where(invstd > 0, invstd.pow(-2), 0.0)
    if host:
        mean, var = mean.numpy(), var.numpy()
    return mean * local, (var + mean * mean) * local


def _host(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as a float64 numpy array (a float64 tensor's own memory)."""
    if tensor.dtype in (torch.float32, torch.float64):
        return tensor.numpy().astype(np.float64, copy=False)  # numpy's copy is the cheaper
    return tensor.double().numpy()


def _buffer(
    head: list[float], sums: tuple[Any, Any] | None, channels: int, device: torch.device
) -> tuple[torch.Tensor, Any]:
    """One float64 buffer for a collective, `head` and then the two figures of `sums` (zeros
    if None); and a view of its figures, numpy's on the host, summed once it returns."""
    k = len(head)
    if device.type == "cpu":  # the host's figures: numpy's, which the buffer shares
        array = np.zeros(k + 2 * channels)
        array[:k] = head
        if sums is not None:
            array[k : k + channels], array[k + channels :] = sums
        return torch.from_numpy(array), array[k:]
    tags = torch.tensor(head, dtype=torch.float64, device=device)
    if sums is None:
        figures = torch.zeros(2 * channels, dtype=torch.float64, device=device)
        buffer = torch.cat([tags, figures])
    else:
        buffer = torch.cat([tags, *sums])  # also promotes float32 sums to float64
    return buffer, buffer[k:]


def _combined(figures: Any, channels: int, count: float) -> tuple[Any, Any]:
    """The global mean and (biased) variance from the summed [sum x, sum x^2] (numpy or torch)."""
    mean = figures[:channels] / count
    return mean, (figures[channels:] / count - mean * mean).clip(0)


def _correction(
    mean: Any, invstd: Any, weight: Any, mean_dy: Any, mean_dy_xhat: Any
) -> tuple[Any, Any]:
    """The per-channel slope and offset that turn the eval-mode input gradient into the
    whole batch's: dx = w invstd (dy - mean(dy) - x_hat mean(dy x_hat)) = eval part + x slope
    + offset, with slope = -w invstd^2 mean(dy x_hat), offset = -(w invstd mean(dy) + slope mean).
    """
    scale = invstd if weight is None else weight * invstd
    slope = -(scale * invstd * mean_dy_xhat)
    return slope, -(scale * mean_dy + slope * mean)


# The torch dtypes numpy converts to itself (bfloat16 has no numpy type: torch converts it).
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def _tensor(values: Any, dtype: torch.dtype, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Per-channel `values` (numpy or torch) as a tensor of `dtype`, viewed as `shape`."""
    if isinstance(values, np.ndarray):
        if shape is not None:
            values = values.reshape(shape)
        if dtype in _NUMPY:  # converted by numpy, the cheaper
            return torch.from_numpy(values.astype(_NUMPY[dtype], copy=False))
        return torch.from_numpy(values).to(dtype)
    values = values.to(dtype)
    return values if shape is None else values.view(shape)


def _update_running(layer: SyncBatchNorm, mean: Any, unbiased: Any, factor: float) -> None:
    """running = (1 - factor) running + factor value, for the mean and the unbiased variance."""
    pairs = ((layer.running_mean, mean), (layer.running_var, unbiased))
    for running, value in pairs:
        if isinstance(value, np.ndarray) and running.dtype in _NUMPY:
            # In place through numpy (a few us less a layer than torch's calls); the version
            # counter is raised as torch's in-place update would, so autograd still refuses
            # a backward through a forward that read the figures before.
            array = running.numpy()
            array *= 1 - factor
            array += factor * value
            torch.autograd.graph.increment_version(running)
        else:
            running.mul_(1 - factor).add_(_tensor(value, running.dtype), alpha=factor)


def _forward_head(layer: SyncBatchNorm, stamp: int, input: torch.Tensor) -> list[float]:
    """Forward's slots before the figures: the tags; then, where this rank's input does not
    have the layer's channels, 1, its rank + 1 and its channels (else zeros), so that every
    rank learns of it in the same collective; then this rank's count of values a channel."""
    channels = input.shape[1]
    assert layer.comm is not None
    odd = channels != layer.num_features or any(
        tensor is not None and tensor.numel() != channels
        for tensor in (layer.weight, layer.bias, layer.running_mean, layer.running_var)
    )
    local = 0 if odd or not channels else input.numel() // channels
    flags = [1, layer.comm.rank + 1, channels] if odd else [0, 0, 0]
    return [*layer._tags(stamp), *flags, local]


def _refuse_channels(layer: SyncBatchNorm, head: list[float], input: torch.Tensor) -> None:
    """This rank's input does not fit the layer: join forward's collective with zeros (the
    layer's size) under `head` (`_forward_head`'s), so that the other ranks refuse too
    instead of waiting, then raise."""
    buffer, _ = _buffer(head, None, layer.num_features, input.device)
    layer._collective(buffer, head, "forward")
    sizes = [t.numel() for t in (layer.weight, layer.running_mean) if t is not None]
    features = sizes[0] if sizes else layer.num_features
    raise ValueError(
        f"synchronised BatchNorm layer '{layer.layer_name}' has {features} features, and its "
        f"input {input.shape[1]} channels (shape {tuple(input.shape)}): build it with "
        f"num_features={input.shape[1]}, or check the layer before it"
    )


def _counted(layer: SyncBatchNorm, buffer: torch.Tensor, head: list[float]) -> float:
    """Forward's collective; the global count, refused unless above 1, and refused on every
    rank where some rank's input does not fit the layer (`_forward_head`)."""
    summed = layer._collective(buffer, head, "forward")
    odd, rank, channels, count = summed[_FLAGS], summed[_FLAGS + 1], summed[_FLAGS + 2], summed[-1]
    if odd:
        where = (
            f"the input on rank {int(rank) - 1} {int(channels)} channels"
            if odd == 1
            else f"the inputs on {int(odd)} ranks other channel counts"
        )
        raise ValueError(
            f"synchronised BatchNorm layer '{layer.layer_name}' has {layer.num_features} "
            f"features, and {where}: build it with the input's channels as num_features, or "
            "check the layer before it"
        )
    if count <= 1:
        raise ValueError(
            f"synchronised BatchNorm layer '{layer.layer_name}' got {int(count)} value per "
            "channel over all ranks in training: it needs more than 1 (a global batch of at "
            "least 2 samples)"
        )
    return count


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        layer: SyncBatchNorm,
        factor: float,
    ) -> torch.Tensor:
        channels = input.shape[1]
        local = input.numel() // channels if channels else 0
        host = input.is_cpu
        if layer.stamp is None:
            layer._forwards += 1
        stamp = layer._forwards if layer.stamp is None else layer.stamp
        ctx.layer, ctx.stamp = layer, stamp
        head = _forward_head(layer, stamp, input)
        if head[_FLAGS]:
            _refuse_channels(layer, head, input)
        native = _native(input, weight, bias, layer) if host else None
        ctx.native = native
        if native is not None:
            return _native_forward(ctx, native, input, weight, bias, factor, head)
        sums = _local_sums(input, channels, local, host) if local else None
        buffer, figures = _buffer(head, sums, channels, input.device)
        count = _counted(layer, buffer, head)
        mean, var = _combined(figures, channels, count)
        if layer.track_running_stats and layer.running_mean is not None:
            _update_running(layer, mean, var * (count / (count - 1)), factor)
        invstd = (var + layer.eps) ** -0.5  # float64, for backward's correction
        ctx.count, ctx.mean, ctx.invstd = count, mean, invstd
        low = input.dtype
        if host and low in (torch.float16, torch.bfloat16):
            # A half or bfloat16 input with the figures and the parameters in float
            # (BatchNorm's own mixed case, which the CPU's kernels take; they refuse float
            # figures beside half parameters). In half, a variance above 65504 would be inf.
            # Autograd casts the parameters' float gradients back to their own type.
            low = torch.float32
            weight = None if weight is None else weight.float()
            bias = None if bias is None else bias.float()
        low_mean, low_var = _tensor(mean, low), _tensor(var, low)
        # BatchNorm in eval mode with the global figures: one fused pass.
        output = torch.batch_norm(
            input, weight, bias, low_mean, low_var, False, 0.0, layer.eps,
            torch.backends.cudnn.enabled,
        )  # fmt: skip
        ctx.save_for_backward(input, weight, low_mean, low_var)
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        if ctx.native is not None:
            return _native_backward(ctx, grad)
        input, weight, low_mean, low_var = ctx.saved_tensors
        layer: SyncBatchNorm = ctx.layer
        channels = input.shape[1]
        host = input.is_cpu
        if input.numel():
            # Eval-mode backward: grad * weight * invstd, and this rank's sum of grad * x_hat
            # (weight's gradient) and of grad (bias's gradient), in one pass. The CPU kernel
            # reads the running figures (mean, var) in eval mode; the CUDA one may read the
            # saved ones instead, and asserts that they are given.
            # The saved ones in the accumulation type on CUDA (float for half and bfloat16
            # inputs); on the CPU in the running figures' type, which its kernel requires.
            acc = low_mean.dtype if host else torch.promote_types(input.dtype, torch.float32)
            grad_input, sum_dy_xhat, sum_dy = torch.ops.aten.native_batch_norm_backward(
                grad.contiguous(), input, weight, low_mean, low_var, low_mean.to(acc),
                _tensor(ctx.invstd, acc), False, layer.eps, [True, True, True],
            )  # fmt: skip
            sums = (_host(sum_dy), _host(sum_dy_xhat)) if host else (sum_dy, sum_dy_xhat)
        else:
            grad_input = torch.zeros_like(input)
            sum_dy_xhat = sum_dy = torch.zeros(channels, dtype=input.dtype, device=input.device)
            sums = None
        head = layer._tags(ctx.stamp)
        buffer, figures = _buffer(head, sums, channels, input.device)
        layer._collective(buffer, head, "backward")
        if ctx.needs_input_grad[0] and input.numel():
            means = figures / ctx.count
            if weight is not None and host:
                weight = _host(weight.detach())
            slope, offset = _correction(
                ctx.mean, ctx.invstd, weight, means[:channels], means[channels:]
            )
            shape = (1, channels) + (1,) * (input.dim() - 2)
            grad_input.addcmul_(input, _tensor(slope, input.dtype, shape))
            grad_input.add_(_tensor(offset, input.dtype, shape))
        return (
            grad_input if ctx.needs_input_grad[0] else None,
            sum_dy_xhat if ctx.needs_input_grad[1] else None,
            sum_dy if ctx.needs_input_grad[2] else None,
            None,
            None,
        )


_SERIAL = 2**16  # values in a layer's input up to which many-thread ranks run the C passes


def _native(
    input: torch.Tensor, weight: Any, bias: Any, layer: SyncBatchNorm
) -> HostKernels | None:
    """The compiled passes for this CPU input, where they apply: float32 or float64 with
    parameters and running figures of its type, on one thread or a small layer (else None:
    torch's kernels)."""
    if input.dim() < 3 or not input.is_contiguous():
        # (N, C) or channels-last, where a channel's values are strided: BatchNorm's kernels
        # are the quicker there, and keep the memory format.
        return None
    if input.numel() > _SERIAL and torch.get_num_threads() > 1:
        # The C passes run on one thread. Small layers are their case on any rank (torch's
        # parallel kernels split no work below ATen's grain, 32768 values, and pay 30-60
        # calls around it); a large layer on a rank of many threads keeps torch's. Measured on
        # 2 threads, the C passes were still the quicker at 1M values (BENCHMARKS.md); above
        # 2 threads it is unmeasured, so the rule leaves large layers to torch there.
        return None
    dtype = input.dtype
    for tensor in (weight, bias, layer.running_mean, layer.running_var):
        if tensor is not None and (tensor.dtype != dtype or not tensor.is_contiguous()):
            return None
    return kernels(dtype)


def _sizes(input: torch.Tensor) -> tuple[int, int, int]:
    """(n, c, s) of a contiguous input: samples, channels, values a channel and sample."""
    n, c = input.shape[0], input.shape[1]
    return n, c, input.numel() // (n * c) if n * c else 0


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _native_forward(
    ctx: Any,
    native: HostKernels,
    input: torch.Tensor,
    weight: Any,
    bias: Any,
    factor: float,
    head: list[float],
) -> torch.Tensor:
    """Forward on a CPU rank through the compiled passes: this rank's sums, the collective
    (under `head`), then the figures, the running update and the output, one call each."""
    layer: SyncBatchNorm = ctx.layer
    n, channels, s = _sizes(input)
    buffer, _ = _buffer(head, None, channels, input.device)
    sums = buffer.data_ptr() + 8 * len(head)
    if input.numel():
        native.stats(input.data_ptr(), n, channels, s, sums, sums + 8 * channels)
    count = _counted(layer, buffer, head)
    # [mean, weight / std, bias, 1 / std], float64, kept for backward.
    figures = np.empty(4 * channels)
    running = layer.track_running_stats and layer.running_mean is not None
    native.finish(
        sums, channels, count, layer.eps, _pointer(weight), _pointer(bias),
        _pointer(layer.running_mean) if running else None,
        _pointer(layer.running_var) if running else None, factor, figures.ctypes.data,
    )  # fmt: skip
    if running:  # as torch's in-place update would: a backward through an older read fails
        torch.autograd.graph.increment_version(layer.running_mean)
        torch.autograd.graph.increment_version(layer.running_var)
    output = torch.empty_like(input)
    if input.numel():
        native.normalise(input.data_ptr(), output.data_ptr(), n, channels, s, figures.ctypes.data)
    ctx.figures, ctx.count = figures, count
    ctx.save_for_backward(input, weight, bias)
    return output


def _native_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    """Backward on a CPU rank through the compiled passes (forward's `_native_forward`)."""
    input, weight, bias = ctx.saved_tensors
    layer: SyncBatchNorm = ctx.layer
    native: HostKernels = ctx.native
    n, channels, s = _sizes(input)
    grad = grad.contiguous()
    head = layer._tags(ctx.stamp)
    buffer, _ = _buffer(head, None, channels, input.device)
    sums = buffer.data_ptr() + 8 * len(head)
    # This rank's parameter gradients (sum dy x_hat, sum dy), written as the sums are taken.
    grad_weight = None if weight is None else torch.zeros_like(weight)
    grad_bias = None if bias is None else torch.zeros_like(bias)
    figures = ctx.figures.ctypes.data
    if input.numel():
        native.grad_sums(
            grad.data_ptr(), input.data_ptr(), n, channels, s, figures, sums,
            _pointer(grad_weight), _pointer(grad_bias),
        )  # fmt: skip
    layer._collective(buffer, head, "backward")
    grad_input = None
    if ctx.needs_input_grad[0]:
        grad_input = torch.empty_like(input)
        if input.numel():
            native.input_grad(
                grad.data_ptr(), input.data_ptr(), grad_input.data_ptr(), n, channels, s,
                figures, sums, ctx.count,
            )  # fmt: skip
    return (
        grad_input,
        grad_weight if ctx.needs_input_grad[1] else None,
        grad_bias if ctx.needs_input_grad[2] else None,
        None,
        None,
    )
