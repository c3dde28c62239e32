"""The wrapper's checks of its arguments and the lines it refuses a loop with."""

from __future__ import annotations

from torch import nn

from lbtrain.balancer.checks import flag
from lbtrain.collective import agree
from lbtrain.comm import Communicator
from lbtrain.data import BalancedLoader
from lbtrain.data.sampler import disagreement, fingerprint
from lbtrain.text import plural

__all__ = ["LOSS_REDUCTIONS", "WEIGHTINGS", "check_arguments", "check_setup"]

WEIGHTINGS = ("share", "uniform")
LOSS_REDUCTIONS = ("mean", "sum", "count")


def no_new_batch(rank: int, handed_out: int) -> str:
    drawn = (
        f"none since batch {handed_out}, which was synced or drawn before the model was wrapped"
        if handed_out
        else "it has handed out no batch yet"
    )
    return (
        f"rank {rank}: a training forward without a new batch from the loader the model was "
        f"wrapped with ({drawn}): take one batch at a time from that loader for each step "
        "(not list(loader), a prefetcher or another loader), and run forwards that are not "
        "training steps under torch.no_grad() or model.eval()"
    )


def second_backward(rank: int, why: str) -> str:
    return (
        f"rank {rank}: a second backward through one forward {why}: sum the losses and call "
        "backward once"
    )


def bucket_disagreement(layouts: list[list[int]]) -> str | None:
    for rank, layout in enumerate(layouts):
        if layout != layouts[0]:
            return (
                f"rank {rank} cuts the gradients into {_buckets(layout)} and rank 0 into "
                f"{_buckets(layouts[0])}: pass the same bucket_mb and overlap to "
                "BalancedDataParallel on every rank, each rank's model on one device"
            )
    return None


def shared_autograd_thread(places: list[tuple[str, int, str]]) -> str | None:
    """Two ranks that are threads of one process on one CUDA device, from (host, pid,
    device)."""
    seen: dict[tuple[str, int, str], int] = {}
    for rank, place in enumerate(places):
        if place[-1] != "cpu" and place in seen:
            return (
                f"ranks {seen[place]} and {rank} are threads of one process on {place[-1]}: "
                "autograd runs both backward passes on one thread, where synchronised "
                "BatchNorm's collectives would wait for each other for ever; give each "
                "in-process rank a device of its own, or start processes (mpiexec, torchrun)"
            )
        seen[place] = rank
    return None


def _buckets(layout: list[int]) -> str:
    sizes = ", ".join(map(str, layout[:4])) + (", ..." if len(layout) > 4 else "")
    return f"{len(layout)} bucket{'s' * (len(layout) != 1)} ({sizes} elements)"


def raise_if(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)


# ValueError, not TypeError: agree() reports these on every rank, so none waits alone.
def check_arguments(
    module: nn.Module,
    comm: Communicator,
    loader: BalancedLoader,
    weighting: str,
    loss_reduction: str,
    flags: dict[str, object] | None = None,
) -> None:
    """Refuse a wrong module, loader, weighting, loss reduction or flag (ValueError)."""
    for name, value in (flags or {}).items():
        try:
            flag(name, value)  # "no" is true to Python: refused rather than read
        except TypeError as exc:  # agree() carries ValueErrors to every rank
            raise ValueError(str(exc)) from None
    if not isinstance(module, nn.Module):
        raise ValueError(f"module={module!r:.60} is not an nn.Module; pass the model to wrap")
    if not isinstance(loader, BalancedLoader):
        raise ValueError(
            f"loader={type(loader).__name__} is not a BalancedLoader; build it with "
            "lbtrain.balanced_loader(plan, dataset, rank=comm.rank)"
        )
    plan, rank = loader.plan, loader.batch_sampler.rank
    if plan.world_size != comm.size:
        raise ValueError(
            f"loader's plan is for {plural(plan.world_size, 'rank')} but the job has "
            f"{comm.size}; plan again for {plural(comm.size, 'rank')} (lbtrain.plan_for)"
        )
    if rank != comm.rank:
        raise ValueError(
            f"loader was built for rank {rank}; pass rank=comm.rank to balanced_loader"
        )
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} must be one of {', '.join(WEIGHTINGS)}")
    if loss_reduction not in LOSS_REDUCTIONS:
        raise ValueError(
            f"loss_reduction={loss_reduction!r} must be one of {', '.join(LOSS_REDUCTIONS)}: "
            "'mean' for a loss averaged over the rank's samples, 'sum' for one summed over "
            "them, 'count' for one averaged over units you count (model.set_loss_count(n))"
        )


def require_communicator(comm: object) -> None:
    """TypeError, in one line, unless `comm` is a communicator (checked before any
    collective, which would fail on it as AttributeError)."""
    if not all(hasattr(comm, name) for name in ("rank", "size", "allgather")):
        raise TypeError(
            f"comm={comm!r:.60} is not a communicator; pass lbtrain.world_communicator()"
        )


def check_setup(
    module: nn.Module,
    comm: Communicator,
    loader: BalancedLoader,
    weighting: str,
    loss_reduction: str,
    flags: dict[str, object] | None = None,
) -> None:
    """The wrapper's checks at construction (collective): a communicator, arguments that
    are right on every rank (`flags` by name: each must be a bool), and one sampler setup
    on all of them."""
    require_communicator(comm)  # before the checks below, which meet the ranks through it
    agree(comm, lambda: check_arguments(module, comm, loader, weighting, loss_reduction, flags))
    rows = comm.allgather(fingerprint(loader.batch_sampler))
    agree(comm, lambda: raise_if(disagreement(rows)), name_rank=False)
