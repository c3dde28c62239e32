"""BatchNorm over the global batch, synchronised through any `Communicator`.

With unequal shares a rank normalises over its own b_i samples, which is neither one
process's statistics nor DDP's; the slowest rank may hold 2 samples, or 1, or none.
`SyncBatchNorm` makes every training forward normalise with the statistics of all B samples
and every backward the input gradient one process computes, whatever the shares:

* forward: one sum-allreduce per layer of the per-channel count, sum and sum of squares
  (each rank's own come from sums of the input less its mean: on a CPU rank in float64 in
  the compiled passes of batchnorm_host.c, or in the input's precision through torch's
  kernels where those cannot run, and from BatchNorm's kernel on CUDA; all are combined in
  float64: the sum of squares minus N mean^2 cancels, and float32 would lose the variance
  of a channel whose mean is a few hundred times its spread);
* backward: one sum-allreduce of the per-channel sum of dy and of dy * x_hat; with the global
  count they give the input gradient of the whole batch. The parameters' gradients stay this
  rank's sums, which the gradient sync adds up like every other parameter's.

The running statistics come from the global figures (the unbiased variance over N - 1), so
they are the same on every rank and the wrapper no longer copies them after each step.

Every collective carries the layer's index and a stamp, the loader batch the wrapper is on
(or the layer's call count): a rank that skipped a forward (or ran another layer) meets the
others out of step, and every rank raises one line naming the layer instead of summing
unrelated figures. A rank with no samples joins both collectives with zeros.

torch's own `nn.SyncBatchNorm` runs on CUDA only and over torch.distributed only; this one
runs on CPU and CUDA ranks in one job, over MPI, torch.distributed, in-process ranks or one
process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lbtrain.collective import CollectiveError, agree
from lbtrain.comm import Communicator
from lbtrain.parallel.batchnorm_host import kernels, setting
from lbtrain.parallel.batchnorm_step import _SyncBatchNormFunction
from lbtrain.parallel.checks import require_communicator

__all__ = [
    "BatchNormMismatch",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "sync_batchnorm_layers",
    "timed_as_synchronised",
]

# The stock layers whose forward is the formula this module reproduces; anything else that
# is a _BatchNorm (a subclass with a forward of its own, a lazy layer) is refused by name.
_STOCK = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
_TAG = 4  # slots before the figures: stamp, its square, layer index, its square
_WRAP = 2**20  # stamps modulo this keep every sum of squares exact in float64


class BatchNormMismatch(CollectiveError, ValueError):
    """The ranks' models differ in their BatchNorm layers, or one cannot be synchronised.

    Raised on every rank alike, with the first difference.
    """


class SyncBatchNorm(_BatchNorm):
    """BatchNorm1d/2d/3d whose training statistics are those of the global batch.

    Built by `convert_sync_batchnorm` (or `BalancedDataParallel`, which converts by
    default) from a model's BatchNorm layers, keeping their parameters and buffers. Before
    `comm` is set, or on one rank, it is plain BatchNorm. In eval mode it uses the running
    statistics, with no collective, as BatchNorm does (a layer with
    `track_running_stats=False` normalises an evaluation batch by its own statistics, as
    BatchNorm does).

    Every rank must run the same training forwards and backwards, an empty batch included:
    each one is a collective.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.comm: Communicator | None = None
        self.layer_name = ""
        self.layer_index = 0
        # Called before each collective; the wrapper starts the gradient buckets that are
        # complete, so that every rank starts its collectives in one order.
        self.before_collective: Callable[[], None] | None = None
        # Called once each collective returns (an emulated slowdown times compute again).
        self.after_collective: Callable[[], None] | None = None
        # The step every rank must be on (the wrapper's loader batch); None: the call count.
        self.stamp: int | None = None
        # Run the synchronised arithmetic on one rank too (profiling: `timed_as_synchronised`).
        self.alone_as_synchronised = False
        self._forwards = 0

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of at least 2 dimensions, got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative average, as BatchNorm's
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or self.running_mean is None
        comm = self.comm
        alone = comm is not None and comm.size == 1 and not self.alone_as_synchronised
        if not batch_stats or not self.training or comm is None or alone:
            # Eval, or one rank: BatchNorm itself, with no collective.
            return nn.functional.batch_norm(
                input,
                self.running_mean if not self.training or self.track_running_stats else None,
                self.running_var if not self.training or self.track_running_stats else None,
                self.weight,
                self.bias,
                batch_stats,
                factor,
                self.eps,
            )
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self, factor)

    def _tags(self, stamp: int) -> list[float]:
        """The slots before a collective's figures: the stamp, the layer, and their squares."""
        tag = stamp % _WRAP
        return [tag, tag**2, self.layer_index, self.layer_index**2]

    def _collective(self, buffer: torch.Tensor, head: list[float], phase: str) -> list[float]:
        """Sum `buffer` over the ranks, in place: its first slots hold `head` (tags, then a
        count or nothing), then the figures. The summed head, after refusing the sums on
        every rank if out of step."""
        if self.before_collective is not None:
            self.before_collective()
        assert self.comm is not None
        self.comm.allreduce_sum_(buffer)
        summed = buffer[: len(head)].tolist()  # one read from the device
        # After the read: an NCCL allreduce returns once queued, and its wait ends here.
        if self.after_collective is not None:
            self.after_collective()
        size = self.comm.size
        # Every rank holds the same sums: if they all carry this rank's tags, the sums are
        # size * tag and size * tag^2, and then all tags are equal (sum of (t - own)^2 = 0);
        # otherwise every rank fails one test and raises the same line.
        if any(summed[k] != size * head[k] for k in range(_TAG)):
            raise RuntimeError(
                f"rank {self.comm.rank}: the ranks are out of step at synchronised BatchNorm "
                f"layer '{self.layer_name}' ({phase}): every rank must run forward and backward "
                "on every batch, an empty one too, with the same BatchNorm layers in train mode"
            )
        return summed


def sync_batchnorm_layers(model: nn.Module) -> list[tuple[str, SyncBatchNorm]]:
    """The model's synchronised BatchNorm layers, by name, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, SyncBatchNorm)]


def convert_sync_batchnorm(model: nn.Module, comm: Communicator) -> nn.Module:
    """Turn every BatchNorm1d/2d/3d of `model` into a `SyncBatchNorm` over `comm`; collective.

    The layers keep their parameters and buffers (an optimizer built before still holds
    them). Children are replaced in place; the model itself is returned, or its replacement
    if it is a BatchNorm layer. Every rank must convert the same layers: the ranks compare
    them in one allgather and raise `BatchNormMismatch` on every rank, naming the first
    layer that differs. A BatchNorm subclass with a forward of its own, or a lazy one, is
    refused by name: pass it through unconverted only knowing it normalises per rank.

    Example:
        >>> model = lbtrain.convert_sync_batchnorm(model, comm)  # before the optimizer
    """
    if not isinstance(model, nn.Module):  # the same on every rank: before the collective
        raise TypeError(f"model={model!r:.60} is not an nn.Module; pass the model to convert")
    require_communicator(comm)
    problem = _unsupported(model) or _host_kernels_problem(model)
    layers = comm.allgather(None if problem else _layout(model))
    try:
        agree(comm, lambda: _raise(problem or _disagreement(layers)), name_rank=True)
    except CollectiveError as exc:
        raise BatchNormMismatch(str(exc)) from None
    converted = _convert(model)
    for index, (name, layer) in enumerate(sync_batchnorm_layers(converted)):
        layer.comm, layer.layer_name, layer.layer_index = comm, name or "(the model)", index
    return converted


@contextmanager
def timed_as_synchronised(model: nn.Module, enabled: bool = True) -> Iterator[nn.Module]:
    """`model` whose BatchNorm layers compute as synchronised BatchNorm does on many ranks,
    with one-rank collectives; put back as it was on exit.

    For profiling: each rank is timed alone, but a synchronised layer costs otherwise than a
    plain one (the Python around its passes and collectives, about 0.07 ms more a small layer
    and step on one CPU thread here with the compiled passes, 0.2 ms with torch's kernels; on
    larger layers its passes are quicker than BatchNorm's), which a plan must see.
    The stand-in layers share the originals' parameters and buffers, so an optimizer and a
    snapshot of the model still hold them. A model that is itself one BatchNorm layer, or a
    layer of a type `convert_sync_batchnorm` refuses, is timed as it is.
    """
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    kept: list[tuple[SyncBatchNorm, tuple[Any, ...]]] = []
    if enabled:
        from lbtrain.comm.single import SingleProcessCommunicator

        problem = _host_kernels_problem(model)  # built now, not in a timed step
        if problem is not None:
            raise ValueError(problem)
        alone = SingleProcessCommunicator()
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) in _STOCK:
                    parent.add_module(name, _convert(child))
                    swapped.append((parent, name, child))
        for layer in model.modules():
            if isinstance(layer, SyncBatchNorm):
                # A layer already converted (by the user) keeps its own settings afterwards.
                kept.append((layer, _settings(layer)))
                layer.comm, layer.alone_as_synchronised = alone, True
                layer.before_collective = layer.after_collective = layer.stamp = None
    try:
        yield model
    finally:
        for layer, settings in kept:
            (layer.comm, layer.alone_as_synchronised, layer.before_collective,
             layer.after_collective, layer.stamp, layer._forwards) = settings  # fmt: skip
        for parent, name, child in swapped:
            child.train(parent.get_submodule(name).training)
            parent.add_module(name, child)


def _settings(layer: SyncBatchNorm) -> tuple[Any, ...]:
    # `_forwards` too: without the wrapper it is the stamp of the layer's next collective,
    # and ranks take different numbers of profiling steps.
    return (layer.comm, layer.alone_as_synchronised, layer.before_collective,
            layer.after_collective, layer.stamp, layer._forwards)  # fmt: skip


def _convert(module: nn.Module) -> nn.Module:
    if type(module) in _STOCK:
        layer = SyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine,
            module.track_running_stats,
        )  # fmt: skip
        if module.affine:
            layer.weight, layer.bias = module.weight, module.bias
        layer.running_mean, layer.running_var = module.running_mean, module.running_var
        layer.num_batches_tracked = module.num_batches_tracked
        layer.train(module.training)
        # Its hooks too (spectral norm, pruning, a user's): the same model, synchronised.
        for name in ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                     "_forward_hooks_with_kwargs", "_forward_hooks_always_called"):  # fmt: skip
            getattr(layer, name).update(getattr(module, name, {}))
        return layer
    for name, child in module.named_children():
        new = _convert(child)
        if new is not child:
            module.add_module(name, new)
    return module


def _host_kernels_problem(model: nn.Module) -> str | None:
    """A wrong LBTRAIN_HOST_KERNELS, refused on every rank; else, for a model with BatchNorm,
    the compiled passes are built or loaded now, before any step is timed (a fraction of a
    second, once a machine)."""
    try:
        if setting() and any(isinstance(m, _BatchNorm) for m in model.modules()):
            kernels(torch.float32)
    except ValueError as exc:
        return str(exc)
    return None


def _layout(model: nn.Module) -> list[tuple]:
    rows = []
    for name, m in model.named_modules():
        if isinstance(m, _BatchNorm):
            rows.append((name, type(m).__name__ if type(m) is not SyncBatchNorm else "BatchNorm",
                         m.num_features, m.affine, m.track_running_stats))  # fmt: skip
    return rows


def _unsupported(model: nn.Module) -> str | None:
    for name, m in model.named_modules():
        if isinstance(m, _BatchNorm) and type(m) not in (*_STOCK, SyncBatchNorm):
            return (
                f"layer '{name}' is a {type(m).__name__}, a BatchNorm of its own that lbtrain "
                "cannot synchronise: use nn.BatchNorm1d/2d/3d there, or pass "
                "sync_batchnorm=False and accept per-rank statistics (not exact)"
            )
    return None


def _disagreement(layers: list[list[tuple] | None]) -> str | None:
    first = layers[0] or []
    for rank, rows in enumerate(layers[1:], start=1):
        rows = rows or []
        if rows == first:
            continue
        for mine, theirs in zip(first, rows, strict=False):
            if mine != theirs:
                return (
                    f"the ranks' BatchNorm layers differ: rank 0 has '{mine[0]}' ({_row(mine)}), "
                    f"rank {rank} '{theirs[0]}' ({_row(theirs)}): build the same model on "
                    "every rank"
                )
        if len(first) > len(rows):
            extra, has, lacks = first[len(rows)], 0, rank
        else:
            extra, has, lacks = rows[len(first)], rank, 0
        return (
            f"the ranks' BatchNorm layers differ: layer '{extra[0]}' ({_row(extra)}) is on "
            f"rank {has} but not on rank {lacks}: build the same model on every rank"
        )
    return None


def _row(row: tuple) -> str:
    name, kind, features, affine, track = row
    return f"{kind}({features}{'' if affine else ', affine=False'}" + (
        ")" if track else ", track_running_stats=False)"
    )


def _raise(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)
