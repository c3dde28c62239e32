"""Device and thread assignment, with the CUDA device count monkeypatched."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from lbtrain import MPICommunicator, SingleProcessCommunicator, devices
from lbtrain.devices import (
    NodeLayout,
    assign_devices,
    default_threads,
    node_layout_from_hosts,
    parse_devices,
    resolve_device,
    synchronize,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_parse_auto_single_and_per_rank_lists():
    assert parse_devices("auto", 3) == ["auto"] * 3
    assert parse_devices("CPU", 2) == ["cpu", "cpu"]
    assert parse_devices("cpu, cpu,cuda:0,cuda:1", 4) == ["cpu", "cpu", "cuda:0", "cuda:1"]
    assert parse_devices("cuda", 2) == ["cuda", "cuda"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("tpu", "unknown device 'tpu'"),
        ("cpu,gpu", "unknown device 'gpu'"),
        ("cuda:x", "unknown device 'cuda:x'"),
        ("cpu,cpu,cpu", "lists 3 devices but the job has 2 ranks"),
    ],
)
def test_parse_errors_name_the_option_and_the_fix(text, needle):
    with pytest.raises(ValueError) as info:
        parse_devices(text, 2)
    message = str(info.value)
    assert needle in message and "--devices" in message and "\n" not in message


def test_node_layout_from_hosts_counts_ranks_per_host():
    hosts = ["a", "b", "a", "a", "b"]
    assert node_layout_from_hosts(hosts, 3) == NodeLayout("a", local_rank=2, local_size=3)
    assert node_layout_from_hosts(hosts, 4) == NodeLayout("b", local_rank=1, local_size=2)
    with pytest.raises(ValueError, match=r"Invalid rank 5"):
        node_layout_from_hosts(hosts, 5)


def test_auto_puts_ranks_on_gpus_while_the_node_has_them_then_cpu():
    # Three ranks on a node with two GPUs: two GPU ranks and one CPU rank.
    layouts = [NodeLayout("n", local_rank=i, local_size=3) for i in range(3)]
    assert [resolve_device("auto", lay, cuda_count=2) for lay in layouts] == [
        "cuda:0",
        "cuda:1",
        "cpu",
    ]
    assert resolve_device("auto", layouts[0], cuda_count=0) == "cpu"
    assert resolve_device("cuda", layouts[1], cuda_count=2) == "cuda:1"
    assert resolve_device("cuda:1", layouts[0], cuda_count=2) == "cuda:1"
    assert resolve_device("cpu", layouts[0], cuda_count=2) == "cpu"


def test_cuda_index_beyond_the_node_names_the_count_and_the_fix():
    layout = NodeLayout("node7", local_rank=0, local_size=1)
    with pytest.raises(ValueError) as info:
        resolve_device("cuda:3", layout, cuda_count=2)
    message = str(info.value)
    assert "cuda:3" in message and "node7" in message and "2 CUDA device(s)" in message
    assert "--devices auto" in message


def test_cuda_asked_but_absent():
    layout = NodeLayout("node7", local_rank=0, local_size=1)
    for entry in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=r"CUDA is not available"):
            resolve_device(entry, layout, cuda_count=0)


class _Gathered:
    """A communicator whose allgather returns this rank's value beside given others'."""

    def __init__(self, others: list) -> None:
        self.others = others

    def allgather(self, value):
        return [value, *self.others]


@pytest.mark.parametrize(
    ("mine", "others", "threads"),
    [
        ({0, 1, 2, 3}, [("n1", [4, 5, 6, 7])], 4),  # bound to its own cores: all of them
        ({0, 1, 2, 3}, [("n1", [0, 1, 2, 3])], 2),  # one set for both ranks: halved
        ({0, 1, 2, 3}, [("n2", [0, 1, 2, 3])], 4),  # the same cores, but on another node
        ({0}, [("n1", [0]), ("n1", [0])], 1),  # oversubscribed: still one thread
    ],
)
def test_default_threads_divide_only_among_ranks_sharing_cores(monkeypatch, mine, others,
                                                                threads):  # fmt: skip
    monkeypatch.setattr(devices, "_cpu_set", lambda: frozenset(mine))
    layout = NodeLayout("n1", 0, 1 + sum(host == "n1" for host, _ in others))
    assert devices.node_threads(_Gathered(others), layout) == threads


def test_omp_num_threads_is_not_the_default(monkeypatch):
    """torchrun sets OMP_NUM_THREADS=1 for any job of more than one rank per node: read, it
    would give every CPU rank one thread."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert devices.rank_threads(_Gathered([]), NodeLayout("n1", 0, 2), cores=16) == 8


def test_default_threads_divides_cores_among_ranks_on_the_node():
    assert default_threads(16, 4) == 4
    assert default_threads(2, 3) == 1  # three ranks on two cores: one thread each
    assert default_threads(2, 1) == 2
    assert default_threads(1, 0) == 1


def test_assign_devices_with_cuda_count_monkeypatched(monkeypatch):
    comm = SingleProcessCommunicator()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assignment = assign_devices(comm, "auto", cores=8)
    assert (assignment.device, assignment.threads, assignment.local_size) == ("cuda:0", 8, 1)
    assert assign_devices(comm, "cuda:1", threads=3).device == "cuda:1"
    with pytest.raises(ValueError, match=r"cuda:3 .* 2 CUDA device"):
        assign_devices(comm, "cuda:3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert assign_devices(comm, "auto").device == "cpu"
    with pytest.raises(ValueError, match=r"CUDA is not available"):
        assign_devices(comm, "cuda")


def test_threads_far_beyond_the_cores_are_one_warning_per_node(recwarn):
    """3 ranks of 1,000 threads on 2 cores ran 14 times slower, and said nothing."""
    from lbtrain.comm import run_ranks

    def place(comm, threads):
        return assign_devices(comm, "cpu", threads=threads, cores=2).threads

    assert all(r.value == 1000 for r in run_ranks(3, lambda comm: place(comm, 1000)))
    shown = [str(w.message) for w in recwarn if "oversubscribed" in str(w.message)]
    assert len(shown) == 1 and "is 3,000 threads on 2 cores" in shown[0], shown
    assert "leave --threads out for 1 a rank" in shown[0]
    recwarn.clear()
    run_ranks(2, lambda comm: place(comm, 2))  # 4 threads on 2 cores: no warning
    assert not [w for w in recwarn if "oversubscribed" in str(w.message)]


def test_assign_devices_rejects_bad_thread_counts():
    with pytest.raises(ValueError, match=r"--threads"):
        assign_devices(SingleProcessCommunicator(), "cpu", threads=0)


def test_cpu_assignment_applies_threads():
    threads = torch.get_num_threads()
    try:
        assignment = assign_devices(SingleProcessCommunicator(), "cpu", threads=1)
        assignment.apply()
        assert torch.get_num_threads() == 1
        assert assignment.to_dict()["device"] == "cpu"
    finally:
        torch.set_num_threads(threads)
    synchronize("cpu")  # a no-op, but must accept CPU devices


@needs_cuda
def test_gpu_assignment_sets_the_current_device_and_synchronizes():
    count = torch.cuda.device_count()
    assignment = assign_devices(SingleProcessCommunicator(), f"cuda:{count - 1}", threads=1)
    assignment.apply()
    assert torch.cuda.current_device() == count - 1
    x = torch.ones(1024, device=assignment.torch_device)
    x.mul_(2)
    synchronize(assignment.torch_device)
    assert float(x.sum()) == 2048.0


@needs_cuda
def test_profiling_on_a_gpu_finds_a_cap_and_leaves_the_model_alone():
    from lbtrain.profiling import ProfileConfig, profile_replica
    from lbtrain.workloads import toy_workload

    workload = toy_workload()
    model = workload.build_model().cuda()
    optimizer = workload.build_optimizer(model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile = profile_replica(
        model,
        optimizer,
        workload.loss_fn,
        workload.make_batch,
        config=ProfileConfig(batch_sizes=(32, 64, 128), time_budget=5.0, probe_limit=1 << 12),
    )
    assert profile.device_kind == "cuda" and profile.device.startswith("cuda:")
    assert profile.cap_source.startswith("cuda-")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class FakeMPI:
    """Stands in for mpi4py.MPI: the names MPICommunicator passes to its collectives."""

    IN_PLACE = object()
    SUM = object()


@pytest.fixture
def fake_mpi(monkeypatch):
    """`from mpi4py import MPI` gives FakeMPI: no MPI library is started in the test process."""
    module = types.ModuleType("mpi4py")
    module.MPI = FakeMPI
    monkeypatch.setitem(sys.modules, "mpi4py", module)


class TwoRanks:
    """Enough of an mpi4py communicator for rank 0 of two, changing buffers as MPI would.

    Allreduce doubles the buffer in place, the sum over two ranks that hold the same values;
    Bcast from rank 1 writes `peer` (rank 1's values) into it, and from rank 0 keeps what
    was sent. Every buffer handed over is kept, to check it is the staging buffer.
    """

    def __init__(self, peer: np.ndarray | None = None) -> None:
        self.peer = peer
        self.buffers: list[np.ndarray] = []
        self.sent: list[np.ndarray] = []

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 2

    def bcast(self, obj, root=0):
        return obj

    def Allreduce(self, sendbuf, recvbuf, op=None) -> None:  # noqa: N802
        assert sendbuf is FakeMPI.IN_PLACE and op is FakeMPI.SUM
        self.buffers.append(recvbuf)
        recvbuf *= 2

    def Bcast(self, buf, root=0) -> None:  # noqa: N802
        self.buffers.append(buf)
        if root == self.Get_rank():
            self.sent.append(buf.copy())
        else:
            buf[...] = self.peer


class StandInCudaTensor:
    """What MPICommunicator's staging path uses of a CUDA tensor, on a CPU-only machine.

    It reports a CUDA device; its "device memory" is a CPU tensor that only the copies to and
    from the staging buffer (`view(-1)`) reach, so a result that is not copied back stays out.
    """

    device = torch.device("cuda", 0)

    def __init__(self, memory: torch.Tensor) -> None:
        self.memory = memory
        self.dtype = memory.dtype

    def is_contiguous(self) -> bool:
        return self.memory.is_contiguous()

    def numel(self) -> int:
        return self.memory.numel()

    def view(self, *shape: int) -> torch.Tensor:
        return self.memory.view(*shape)


class RealCuda:
    """CUDA tensors on a real device."""

    def __init__(self, monkeypatch) -> None:
        pass

    def tensor(self, values: torch.Tensor) -> torch.Tensor:
        return values.to("cuda")

    def read(self, tensor: torch.Tensor) -> torch.Tensor:
        assert tensor.device.type == "cuda"
        return tensor.cpu()

    def check_pinned(self, host: torch.Tensor) -> None:
        assert host.is_pinned()


class StandInCuda:
    """StandInCudaTensor, with torch.empty told to ignore pin_memory (a CPU-only torch cannot
    pin) and to record that pinned memory was asked for. New buffers are filled with NaN, so
    values not copied into the staging buffer cannot pass for the right ones."""

    def __init__(self, monkeypatch) -> None:
        self.pinned: list[bool] = []
        empty = torch.empty

        def unpinned_empty(*args, pin_memory=False, **kwargs):
            self.pinned.append(pin_memory)
            return empty(*args, **kwargs).fill_(float("nan"))

        monkeypatch.setattr(torch, "empty", unpinned_empty)

    def tensor(self, values: torch.Tensor) -> StandInCudaTensor:
        return StandInCudaTensor(values.clone())

    def read(self, tensor: StandInCudaTensor) -> torch.Tensor:
        return tensor.memory

    def check_pinned(self, host: torch.Tensor) -> None:
        assert self.pinned == [True]


@pytest.fixture(params=[pytest.param(RealCuda, marks=needs_cuda, id="cuda"), StandInCuda])
def cuda_kind(request, monkeypatch):
    return request.param(monkeypatch)


def test_allreduce_stages_cuda_tensors_through_pinned_host_memory(cuda_kind, fake_mpi):
    fake = TwoRanks()
    comm = MPICommunicator(fake)
    values = torch.arange(6, dtype=torch.float32)
    tensor = cuda_kind.tensor(values)
    comm.allreduce_sum_(tensor)
    # The sum, made in the host buffer that MPI saw, is copied back into the caller's tensor.
    assert torch.equal(cuda_kind.read(tensor), 2 * values)
    (host,) = comm._staging.values()
    cuda_kind.check_pinned(host)
    assert np.shares_memory(fake.buffers[-1], host.numpy())
    comm.allreduce_sum_(tensor)  # the result goes in again, through the same buffer
    assert torch.equal(cuda_kind.read(tensor), 4 * values)
    (again,) = comm._staging.values()
    assert again is host
    assert np.shares_memory(fake.buffers[-1], host.numpy())


def test_broadcast_stages_cuda_tensors_through_pinned_host_memory(cuda_kind, fake_mpi):
    fake = TwoRanks(peer=np.full(6, 7.0, dtype=np.float32))
    comm = MPICommunicator(fake)
    values = torch.arange(6, dtype=torch.float32)
    tensor = cuda_kind.tensor(values)
    comm.broadcast_(tensor, root=0)  # this rank is the root: its values go out and stay
    assert np.array_equal(fake.sent[-1], values.numpy())
    assert torch.equal(cuda_kind.read(tensor), values)
    comm.broadcast_(tensor, root=1)  # the root's values arrive in the caller's tensor
    assert torch.equal(cuda_kind.read(tensor), torch.full((6,), 7.0))
    (host,) = comm._staging.values()
    cuda_kind.check_pinned(host)
    assert all(np.shares_memory(buffer, host.numpy()) for buffer in fake.buffers)


class DeferredRequest:
    """An mpi4py request whose sum lands only at Wait (or a Test after `ready`)."""

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer, self.ready, self.done = buffer, False, False

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        if self.ready and not self.done:
            self.Wait()
        return self.done

    def Wait(self) -> None:  # noqa: N802
        if not self.done:
            self.buffer *= 2
            self.done = True


class TwoRanksNonBlocking(TwoRanks):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[DeferredRequest] = []

    def Iallreduce(self, sendbuf, recvbuf, op=None) -> DeferredRequest:  # noqa: N802
        assert sendbuf is FakeMPI.IN_PLACE and op is FakeMPI.SUM
        self.requests.append(DeferredRequest(recvbuf))
        return self.requests[-1]


def test_iallreduce_sums_in_place_by_the_wait_and_keeps_the_buffer(fake_mpi):
    fake = TwoRanksNonBlocking()
    comm = MPICommunicator(fake)
    tensor = torch.arange(5, dtype=torch.float32)
    request = comm.iallreduce_sum_(tensor)
    assert np.shares_memory(fake.requests[0].buffer, tensor.numpy())
    assert not request.test()
    fake.requests[0].ready = True
    assert request.test()
    request.wait()  # once complete, waiting again changes nothing
    assert torch.equal(tensor, 2 * torch.arange(5, dtype=torch.float32))


def test_iallreduce_of_cuda_memory_needs_a_cuda_aware_library(fake_mpi, monkeypatch):
    monkeypatch.setenv("LBTRAIN_CUDA_AWARE", "0")
    comm = MPICommunicator(TwoRanksNonBlocking())
    assert comm.cuda_aware is False
    with pytest.raises(ValueError, match="not CUDA-aware"):
        comm.iallreduce_sum_(StandInCudaTensor(torch.zeros(3)))
    monkeypatch.setenv("LBTRAIN_CUDA_AWARE", "1")
    assert MPICommunicator(TwoRanksNonBlocking()).cuda_aware is True
