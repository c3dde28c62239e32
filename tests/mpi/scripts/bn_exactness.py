"""A model with BatchNorm, through `BalancedDataParallel`, must train as one process does.

Run through exactness.py as `wrapper/bn/CASE` (or wrapper_exactness.py as `bn/CASE`), e.g.
     mpiexec -n 3 python -m mpi4py tests/mpi/scripts/exactness.py wrapper/bn/5,11,48
CASE is SHARES[:MODEL][@ddp|@DEVICES], e.g. 5,11,48:convnet, 20,0,44:resnet@ddp or
5,11,48@cuda:0,cpu,cpu; MODEL is "convnet" (a small net with BatchNorm3d, BatchNorm2d and
BatchNorm1d, the default) or "resnet" (examples/resnet_cifar.py's ResNetCifar, one block per
stage, on 8x8 images). The ranks' BatchNorm layers are synchronised (the wrapper's
default); a second model with `sync_batchnorm=False` trains alongside and must visibly miss,
which shows the comparison can fail. The running statistics must be the same on every rank
and one process's. `@ddp`: the synchronised model is stock DDP over `convert_sync_batchnorm`,
with the weighted hook and the weight in the loss (`WeightedHookState(loader,
prescaled=True)`). `@DEVICES` places each rank's trained models (the reference stays on the
CPU): BatchNorm's collectives then carry CUDA buffers, staged through the host on MPI and
gloo.
`mismatch`: rank 1 builds the model without its BatchNorm1d; every rank must refuse, naming
the layer. `skip`: the last rank skips one forward; every rank must stop with a line.
"""

from __future__ import annotations

import threading

import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import BalancedDataParallel, balanced_loader
from lbtrain.comm import Communicator
from lbtrain.data import epoch_schedule
from tests.mpi.scripts.wrapper_exactness import _plan

EPOCHS = 2
_SEEDING = threading.Lock()  # ranks that are threads share torch's global generator


class ConvNet(nn.Module):
    """BatchNorm3d, 2d and 1d in one small net, on (N, 1, 4, 6, 6) inputs."""

    def __init__(self, with_bn1d: bool = True) -> None:
        super().__init__()
        self.conv3d = nn.Sequential(nn.Conv3d(1, 3, 3), nn.BatchNorm3d(3), nn.ReLU())
        self.conv2d = nn.Sequential(nn.Conv2d(6, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        norm = nn.BatchNorm1d(8) if with_bn1d else nn.Identity()
        self.head = nn.Sequential(nn.Linear(16, 8), norm, nn.ReLU(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv3d(x)
        x = self.conv2d(x.flatten(1, 2))
        return self.head(x.flatten(1))


def make_model(name: str, **options) -> nn.Module:
    with _SEEDING:
        torch.manual_seed(0)
        if name == "resnet":
            from examples.resnet_cifar import ResNetCifar

            return ResNetCifar(n=1, classes=4).double()
        return ConvNet(**options).double()


def make_data(name: str, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(7)
    shape = (3, 8, 8) if name == "resnet" else (1, 4, 6, 6)
    # Off-centre and scaled, so that normalising matters.
    inputs = torch.randn(count, *shape, dtype=torch.float64, generator=generator) * 2 + 0.5
    return inputs, torch.randint(0, 4, (count,), generator=generator)


def _ddp(comm: Communicator, model: nn.Module, loader) -> nn.Module:
    """Stock DDP over a synchronised model, the hook summing a loss that carries the weight."""
    from torch.nn.parallel import DistributedDataParallel

    from lbtrain import WeightedHookState, convert_sync_batchnorm, weighted_allreduce_hook
    from tests.mpi.scripts.wrapper_exactness import process_group

    process_group(comm)
    ddp = DistributedDataParallel(convert_sync_batchnorm(model, comm), bucket_cap_mb=0.01)
    ddp.register_comm_hook(WeightedHookState(loader, prescaled=True), weighted_allreduce_hook)
    return ddp


def check(
    comm: Communicator,
    sizes: list[int],
    name: str = "convnet",
    ddp: bool = False,
    devices: list[str] | None = None,
) -> str:
    """Train synchronised, per-rank and reference models; assert; a line saying so.

    `ddp`: the synchronised model is stock DDP with `weighted_allreduce_hook` (needs real
    processes: torchrun, or mpiexec with a gloo group beside MPI). `devices`: each rank's.
    """
    device = torch.device(devices[comm.rank] if devices else "cpu")
    count = 2 * sum(sizes) + 9  # two full global batches and a short tail
    inputs, targets = make_data(name, count)
    plan = _plan(sizes)
    loader = balanced_loader(plan, TensorDataset(inputs, targets), rank=comm.rank, seed=3)
    models = [make_model(name) for _ in range(3)]
    models[0].to(device)
    models[1].to(device)
    if ddp:
        exact = _ddp(comm, models[0], loader)
    else:
        exact = BalancedDataParallel(models[0], comm, loader, bucket_mb=0.01)
    per_rank = BalancedDataParallel(models[1], comm, loader, sync_batchnorm=False)
    reference = models[2]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            for model, optimizer in zip((exact, per_rank), optimizers, strict=False):
                optimizer.zero_grad()
                if ddp and model is exact:
                    (loss_fn(model(x), y) * loader.weight).backward()
                elif len(x) > 1 or model is exact:  # plain BatchNorm needs 2 samples
                    loss_fn(model(x), y).backward()
                else:
                    model.finish()
                optimizer.step()
        perm = loader.batch_sampler.permutation()
        for start, stop, _ in epoch_schedule(count, plan):
            optimizers[2].zero_grad()
            batch = perm[start:stop]
            loss_fn(reference(inputs[batch]), targets[batch]).backward()
            optimizers[2].step()

    def state(model: nn.Module) -> torch.Tensor:
        values = model.state_dict().values()
        return torch.cat([t.detach().cpu().double().reshape(-1) for t in values])

    exact_diff = (state(models[0]) - state(reference)).abs().max().item()
    per_rank_diff = (state(models[1]) - state(reference)).abs().max().item()
    states = comm.allgather(state(models[0]).tolist())
    assert exact_diff < 1e-10, f"rank {comm.rank}: synchronised BatchNorm differs by {exact_diff}"
    assert per_rank_diff > 1e-4, f"rank {comm.rank}: per-rank BatchNorm matched ({per_rank_diff})"
    # Bit for bit on one kind of device; a CPU's and a GPU's kernels may round apart.
    spread = (torch.tensor(states) - torch.tensor(states[0])).abs().max().item()
    mixed = len({d.split(":")[0] for d in devices or ["cpu"]}) > 1
    assert spread <= (1e-12 if mixed else 0.0), (
        f"the ranks' parameters or statistics differ by {spread}"
    )
    return (
        f"batchnorm exactness ok: ranks={comm.size} batch_sizes={sizes} model={name}"
        f"{' (stock DDP, weighted hook)' if ddp else ''} "
        f"devices={','.join(devices) if devices else 'cpu'} "
        f"max|diff|={exact_diff:.2e} per-rank BatchNorm max|diff|={per_rank_diff:.2e}"
    )


def mismatch(comm: Communicator) -> str:
    """Rank 1's model lacks a BatchNorm1d: every rank must refuse, naming the layer."""
    model = make_model("convnet", with_bn1d=comm.rank != 1)
    loader = balanced_loader(
        _plan([4] * comm.size), TensorDataset(torch.zeros(8, 1)), rank=comm.rank
    )
    try:
        BalancedDataParallel(model, comm, loader)
    except ValueError as exc:
        return str(exc)
    raise AssertionError("models whose BatchNorm layers differ were accepted")


def skip(comm: Communicator) -> str:
    """The last rank skips its forward of the second batch; every rank must raise."""
    inputs, targets = make_data("convnet", 40)
    loader = balanced_loader(_plan([4] * comm.size), TensorDataset(inputs, targets),
                             rank=comm.rank)  # fmt: skip
    model = BalancedDataParallel(make_model("convnet"), comm, loader)
    try:
        for step, (x, y) in enumerate(loader):
            if step == 1 and comm.rank == comm.size - 1:
                continue
            nn.functional.cross_entropy(model(x), y).backward()
    except RuntimeError as exc:
        return str(exc)
    raise AssertionError("a skipped forward went unnoticed")


def _everywhere(comm: Communicator, what: str, message: str) -> str:
    """A line saying every rank refused with `message` (less its rank prefix)."""
    said = comm.allgather(message.split(": ", 1)[-1] if message.startswith("rank ") else message)
    assert all(s == said[0] for s in said), f"the ranks said different things: {said}"
    return f"batchnorm {what} refused on every rank: {said[0]}"


def run_case(comm: Communicator, case: str) -> str:
    """One case of the command line (module docstring); a line saying how it went."""
    if case == "mismatch":
        return _everywhere(comm, "mismatch", mismatch(comm))
    if case == "skip":
        return _everywhere(comm, "skip", skip(comm))
    case, _, how = case.partition("@")
    sizes, _, name = case.partition(":")
    devices = how.split(",") if how and how != "ddp" else None
    return check(comm, [int(s) for s in sizes.split(",")], name or "convnet", how == "ddp", devices)
