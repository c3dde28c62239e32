"""profile_replica / profile_all on a fake clock: exact figures, untouched model, budgets."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from lbtrain import SingleProcessCommunicator, balanced_loader, plan_batches
from lbtrain.balancer import ReplicaSpeed, SupportsReplicaSpeed
from lbtrain.emulation import Slowdown
from lbtrain.profiling import (
    ProfileConfig,
    ProfileFileError,
    ReplicaProfile,
    load_profiles,
    profile_all,
    profile_replica,
    save_profiles,
)

ALPHA, BETA = 0.004, 0.0005
# A budget the fake clock never reaches: rounds stop at max_repeats.
UNLIMITED = 1e6


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a busy 2-core machine, OpenMP barriers on tiny tensors stall."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FakeClock:
    """A clock that only moves when told to: the model's forward and the emulated sleep."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ClockedModel(nn.Module):
    """A real trainable model whose forward costs ALPHA + BETA * b seconds of fake time."""

    def __init__(self, clock: FakeClock, alpha: float = ALPHA, beta: float = BETA) -> None:
        super().__init__()
        self.clock, self.alpha, self.beta = clock, alpha, beta
        self.net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(self.alpha + self.beta * x.shape[0])
        return self.net(x)


def make_batch(size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, 6, device=device), torch.randint(0, 3, (size,), device=device)


def trained_setup(clock: FakeClock, **model_kwargs):
    """A model and Adam optimizer that already carry state from two real steps."""
    torch.manual_seed(1)
    model = ClockedModel(clock, **model_kwargs)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(5, 6)), torch.randint(0, 3, (5,))).backward()
        optimizer.step()
    return model, optimizer


def run_profile(clock, model, optimizer, config=None, slowdown=None, **kwargs):
    config = config or ProfileConfig(
        batch_sizes=(8, 16, 32, 64), time_budget=UNLIMITED, max_repeats=6
    )
    # cpu_timer=None: on a fake clock, real CPU seconds would not match the fake wall time.
    return profile_replica(
        model,
        optimizer,
        nn.functional.cross_entropy,
        make_batch,
        config=config,
        slowdown=slowdown,
        timer=clock,
        cpu_timer=None,
        available_memory=lambda: 8 * 2**30,
        host="fake-host",
        **kwargs,
    )


def test_fake_clock_recovers_exact_times_throughput_alpha_and_beta():
    clock = FakeClock()
    model, optimizer = trained_setup(clock)
    profile = run_profile(clock, model, optimizer, rank=2, workload="clocked")
    assert profile.batch_sizes == (8, 16, 32, 64)
    assert profile.step_times == pytest.approx([ALPHA + BETA * b for b in (8, 16, 32, 64)])
    assert profile.samples_per_second == pytest.approx(
        [b / (ALPHA + BETA * b) for b in (8, 16, 32, 64)]
    )
    assert profile.alpha == pytest.approx(ALPHA, rel=1e-6)
    assert profile.beta == pytest.approx(BETA, rel=1e-6)
    assert profile.r_squared == pytest.approx(1.0)
    assert profile.fit_relative_error == pytest.approx(0.0, abs=1e-9)
    # No reference batch given: samples/s at the largest rung, off the fitted line.
    assert profile.throughput_batch == 64
    assert profile.throughput == pytest.approx(64 / (ALPHA + BETA * 64))
    assert (profile.rank, profile.host, profile.workload) == (2, "fake-host", "clocked")
    assert (profile.device, profile.device_kind) == ("cpu", "cpu")
    assert profile.threads == torch.get_num_threads()
    assert profile.cap is not None and profile.cap > 64
    assert profile.cap_source == "cpu-ram-estimate"
    assert profile.memory_per_sample > 0
    assert profile.started_at <= profile.finished_at
    assert profile.repeats == 6


def test_reference_batch_sets_where_throughput_is_read():
    clock = FakeClock()
    model, optimizer = trained_setup(clock)
    config = ProfileConfig(
        batch_sizes=(8, 16, 32), time_budget=UNLIMITED, max_repeats=5, reference_batch=100
    )
    profile = run_profile(clock, model, optimizer, config=config)
    assert profile.throughput_batch == 100
    assert profile.throughput == pytest.approx(100 / (ALPHA + BETA * 100))


def test_emulated_slowdown_through_the_fake_clock_is_exactly_threefold():
    clock = FakeClock()
    model, optimizer = trained_setup(clock)
    fast = run_profile(clock, model, optimizer)
    slow = run_profile(clock, model, optimizer, slowdown=Slowdown(3.0, sleep=clock.advance))
    assert slow.slowdown == 3.0
    assert fast.throughput / slow.throughput == pytest.approx(3.0)
    assert slow.alpha == pytest.approx(3 * ALPHA, rel=1e-6)
    assert slow.beta == pytest.approx(3 * BETA, rel=1e-6)


def test_memory_probe_forecasts_the_measured_step_time_of_a_slowed_rank(monkeypatch):
    """The fitted line already holds the emulated sleep: the probe must not multiply again."""
    from lbtrain.profiling import profiler

    handed = {}
    real_memory_cap = profiler._memory_cap

    def recording_memory_cap(*args, **kwargs):
        handed.update(kwargs)
        return real_memory_cap(*args, **kwargs)

    monkeypatch.setattr(profiler, "_memory_cap", recording_memory_cap)
    clock = FakeClock()
    model, optimizer = trained_setup(clock)
    config = ProfileConfig(
        batch_sizes=(8, 16, 32, 64), time_budget=UNLIMITED, max_repeats=6, memory_cap=True
    )
    profile = run_profile(
        clock, model, optimizer, config=config, slowdown=Slowdown(3.0, sleep=clock.advance)
    )
    assert profile.alpha == pytest.approx(3 * ALPHA, rel=1e-6)  # the sleep is in the fit
    predicted_time = handed["predicted_time"]
    for size in (64, 128, 1024, 1 << 16):
        assert predicted_time(size) == pytest.approx(profile.alpha + profile.beta * size)
        # What one step of the slowed rank really takes on the fake clock, not 3x that.
        assert predicted_time(size) == pytest.approx(3 * (ALPHA + BETA * size), rel=1e-6)


def _state(model, optimizer):
    return (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        [m.training for m in model.modules()],
    )


def _assert_same(before, after):
    (model_a, optim_a, grads_a, modes_a), (model_b, optim_b, grads_b, modes_b) = before, after
    assert model_a.keys() == model_b.keys()
    for key in model_a:
        assert torch.equal(model_a[key], model_b[key]), key
    assert optim_a["param_groups"] == optim_b["param_groups"]
    assert optim_a["state"].keys() == optim_b["state"].keys()
    for index, state in optim_a["state"].items():
        for key, value in state.items():
            other = optim_b["state"][index][key]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other
    assert len(grads_a) == len(grads_b)
    for grad_a, grad_b in zip(grads_a, grads_b, strict=True):
        assert (grad_a is None and grad_b is None) or torch.equal(grad_a, grad_b)
    assert modes_a == modes_b


def test_profiling_leaves_model_optimizer_grads_mode_and_rng_as_they_were():
    clock = FakeClock()
    model, optimizer = trained_setup(clock)
    model.eval()  # a mode profiling must switch back
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    params = list(model.parameters())
    before = _state(model, optimizer)
    rng = torch.get_rng_state()
    run_profile(clock, model, optimizer)
    _assert_same(before, _state(model, optimizer))
    assert torch.equal(rng, torch.get_rng_state())
    # Restored in place: references held elsewhere (schedulers, hooks) stay valid.
    assert all(a is b for a, b in zip(params, model.parameters(), strict=True))
    assert optimizer.param_groups[0]["params"][0] is params[0]
    # The check can fail: one real step does change the state.
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(4, 6)), torch.randint(0, 3, (4,))).backward()
    optimizer.step()
    with pytest.raises(AssertionError):
        _assert_same(before, _state(model, optimizer))


def test_fresh_optimizer_stays_fresh():
    clock = FakeClock()
    model = ClockedModel(clock)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = _state(model, optimizer)
    run_profile(clock, model, optimizer)
    assert not optimizer.state
    _assert_same(before, _state(model, optimizer))


@pytest.mark.parametrize("budget", [0.5, 2.0, 8.0])
def test_time_budget_is_respected_on_the_fake_clock(budget):
    clock = FakeClock()
    model, optimizer = trained_setup(clock, alpha=0.001, beta=0.001)
    config = ProfileConfig(min_batch=16, max_batch=1024, time_budget=budget)
    start = clock.now
    profile = run_profile(clock, model, optimizer, config=config)
    assert clock.now - start <= budget
    assert len(profile.batch_sizes) >= 2
    # A 1024 batch alone costs over a second: the ladder is cut where the budget says.
    assert profile.batch_sizes[-1] < 1024
    assert profile.alpha == pytest.approx(0.001, rel=1e-6)
    assert profile.beta == pytest.approx(0.001, rel=1e-6)


def test_longer_budget_climbs_higher():
    tops = []
    for budget in (0.5, 8.0):
        clock = FakeClock()
        model, optimizer = trained_setup(clock, alpha=0.001, beta=0.001)
        config = ProfileConfig(min_batch=16, max_batch=1024, time_budget=budget)
        tops.append(run_profile(clock, model, optimizer, config=config).batch_sizes[-1])
    assert tops[0] < tops[1]


def test_default_ladder_doubles_and_ends_at_max_batch():
    assert ProfileConfig().ladder() == (16, 32, 64, 128, 256, 512, 1024)
    assert ProfileConfig(min_batch=10, max_batch=50).ladder() == (10, 20, 40, 50)
    assert ProfileConfig(batch_sizes=(3, 9)).ladder() == (3, 9)
    # Around a reference batch: r/8 .. 2r, clamped, with no two rungs closer than 1.5x.
    assert ProfileConfig(min_batch=4, max_batch=42, reference_batch=21).ladder() == (4, 10, 21, 42)
    assert ProfileConfig(min_batch=16, max_batch=682, reference_batch=341).ladder() == (
        42, 85, 170, 341, 682,
    )  # fmt: skip


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_sizes": (32, 16)},
        {"batch_sizes": (0, 4)},
        {"min_batch": 0},
        {"min_batch": 64, "max_batch": 32},
        {"repeats": 0},
        {"time_budget": 0.0},
        {"time_budget": float("nan")},
        {"warmup": -1},
        {"warmup": 101},  # untimed and outside the budget: 10^9 profiled for ever
        {"reference_batch": 0},
        {"reference_batch": 100_000_000},  # every rung clamped to max_batch: one batch
    ],
)
def test_profile_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        ProfileConfig(**kwargs)


def test_a_reference_below_the_smallest_batch_still_profiles():
    """balance-report sets the reference to B/P by itself: a small global batch clamps the
    ladder to --min-batch, as before (only a reference far above --max-batch is refused)."""
    assert ProfileConfig(reference_batch=8).ladder() == (16,)
    assert ProfileConfig(reference_batch=10**8, batch_sizes=(16,)).ladder() == (16,)


def test_profile_all_single_process_gives_one_record_with_common_reference():
    clock = FakeClock()
    model, optimizer = trained_setup(clock)
    profiles = profile_all(
        SingleProcessCommunicator(),
        model,
        optimizer,
        nn.functional.cross_entropy,
        make_batch,
        config=ProfileConfig(batch_sizes=(8, 16, 32), time_budget=UNLIMITED, max_repeats=5),
        timer=clock,
        cpu_timer=None,
    )
    assert len(profiles) == 1
    (profile,) = profiles
    assert profile.rank == 0
    assert profile.reference_batch == 32
    assert profile.alpha == pytest.approx(ALPHA, rel=1e-6)
    # The sync is timed on the same clock; a fake one does not move during it.
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    assert (profile.sync_time, profile.sync_bytes, profile.sync_ranks) == (0.0, params, 1)


def _profile(rank: int = 0, **changes) -> ReplicaProfile:
    fields = dict(
        rank=rank,
        host="h",
        device="cpu",
        device_kind="cpu",
        device_name="CPU",
        threads=1,
        workload="w",
        batch_sizes=(10, 20),
        step_times=(0.02, 0.03),
        alpha=0.01,
        beta=0.001,
        r_squared=1.0,
        cap=500,
        cap_source="cpu-ram-estimate",
        memory_per_sample=100.0,
        slowdown=1.0,
        repeats=5,
        started_at="2025-01-01T00:00:00.000+00:00",
        finished_at="2025-01-01T00:00:02.500+00:00",
        reference_batch=None,
        fit_relative_error=0.0,
    )
    fields.update(changes)
    return ReplicaProfile(**fields)


def test_profile_json_round_trip(tmp_path):
    profile = _profile(reference_batch=40)
    assert ReplicaProfile.from_json(profile.to_json()) == profile
    changes = dict(alpha=0.0, step_times=(0.01, 0.02), cap=None, r_squared=None)
    profiles = [_profile(0), _profile(1, **changes)]
    path = save_profiles(tmp_path / "sub" / "p.json", profiles)
    assert load_profiles(path) == profiles
    assert load_profiles(path, world_size=2) == profiles
    data = json.loads(path.read_text())
    assert data["world_size"] == 2 and data["format"] == "lbtrain-profiles"
    assert data["profiles"][0]["samples_per_second"] == pytest.approx([500.0, 20 / 0.03])
    assert profile.duration == pytest.approx(2.5)


def test_older_files_without_optional_fields_still_load():
    data = _profile().to_dict()
    del data["reference_batch"], data["fit_relative_error"]
    del data["sync_time"], data["sync_bytes"], data["sync_ranks"]
    profile = ReplicaProfile.from_dict(data)
    assert profile.reference_batch is None and profile.throughput_batch == 20
    assert (profile.sync_time, profile.sync_bytes, profile.sync_ranks) == (None, None, None)


def test_sync_fields_round_trip_through_json_and_the_profiles_file(tmp_path):
    profiles = [_profile(rank, sync_time=0.0125, sync_bytes=4096, sync_ranks=2) for rank in (0, 1)]
    assert ReplicaProfile.from_json(profiles[0].to_json()) == profiles[0]
    path = save_profiles(tmp_path / "p.json", profiles)
    loaded = load_profiles(path, world_size=2)
    assert loaded == profiles
    assert (loaded[1].sync_time, loaded[1].sync_bytes, loaded[1].sync_ranks) == (0.0125, 4096, 2)
    data = json.loads(path.read_text())
    assert data["profiles"][0]["sync_ranks"] == 2
    # A whole number of seconds in hand-written JSON is read as a float.
    assert _profile(sync_time=0, sync_bytes=0, sync_ranks=1).sync_time == 0.0


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"sync_time": -0.1, "sync_bytes": 8, "sync_ranks": 2}, "sync_time"),
        ({"sync_time": float("nan"), "sync_bytes": 8, "sync_ranks": 2}, "sync_time"),
        ({"sync_time": float("inf"), "sync_bytes": 8, "sync_ranks": 2}, "sync_time"),
        ({"sync_time": True, "sync_bytes": 8, "sync_ranks": 2}, "sync_time"),
        ({"sync_time": "1", "sync_bytes": 8, "sync_ranks": 2}, "sync_time"),
        ({"sync_time": 0.1, "sync_bytes": -1, "sync_ranks": 2}, "sync_bytes"),
        ({"sync_time": 0.1, "sync_bytes": 8.5, "sync_ranks": 2}, "sync_bytes"),
        ({"sync_time": 0.1, "sync_bytes": 8, "sync_ranks": 0}, "sync_ranks"),
        ({"sync_time": 0.1, "sync_bytes": 8, "sync_ranks": False}, "sync_ranks"),
        ({"sync_time": 0.1}, "all be given"),
        ({"sync_bytes": 8, "sync_ranks": 2}, "all be given"),
    ],
)
def test_invalid_sync_fields_are_rejected_in_one_line(changes, needle):
    with pytest.raises(ValueError, match=needle) as info:
        _profile(**changes)
    assert "\n" not in str(info.value)


def test_a_file_with_a_bad_sync_field_names_the_field_and_the_fix(tmp_path):
    path = save_profiles(tmp_path / "p.json", [_profile(sync_time=0.1, sync_bytes=8, sync_ranks=1)])
    data = json.loads(path.read_text())
    data["profiles"][0]["sync_ranks"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match=r"sync_ranks=0.*lbtrain profile"):
        load_profiles(path)


def test_profile_records_feed_plan_batches_and_balanced_loader_directly():
    fast = _profile(0, alpha=0.0, beta=0.001, cap=None)
    slow = _profile(1, alpha=0.0, beta=0.003, cap=None)
    assert isinstance(fast, SupportsReplicaSpeed)
    speed = fast.replica_speed()
    assert isinstance(speed, ReplicaSpeed)
    assert (speed.throughput, speed.alpha, speed.beta, speed.cap) == (
        pytest.approx(1000.0),
        0.0,
        0.001,
        None,
    )
    plan = plan_batches([fast, slow], 40, "proportional")
    assert plan.batch_sizes == (30, 10)
    assert plan_batches([fast, slow], 40, "cost").batch_sizes == (30, 10)
    capped = _profile(1, alpha=0.0, beta=0.0001, cap=7)
    assert plan_batches([fast, capped], 40, "proportional").batch_sizes == (33, 7)
    dataset = torch.utils.data.TensorDataset(torch.arange(80))
    shares = [
        [
            len(batch)
            for (batch,) in balanced_loader([fast, slow], dataset, global_batch_size=40, rank=rank)
        ]
        for rank in (0, 1)
    ]
    assert shares == [[30, 30], [10, 10]]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ('{"format": "other"}', "not an lbtrain profiles file"),
        ('{"format": "lbtrain-profiles", "version": 1, "profiles": []}', "holds no profiles"),
        (
            '{"format": "lbtrain-profiles", "version": 1, "world_size": 1, '
            '"profiles": [{"rank": 0}]}',
            "lacks",
        ),
    ],
)
def test_bad_profile_files_give_one_line_errors_naming_file_and_fix(tmp_path, content, needle):
    path = tmp_path / "profiles.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ProfileFileError) as info:
        load_profiles(path)
    message = str(info.value)
    assert needle in message and str(path) in message
    assert "lbtrain profile" in message and "\n" not in message


def test_world_size_mismatch_names_both_sizes_and_the_fix(tmp_path):
    path = save_profiles(tmp_path / "p.json", [_profile(0), _profile(1)])
    with pytest.raises(ProfileFileError, match=r"recorded with 2 ranks but this run has 3"):
        load_profiles(path, world_size=3)


def test_invalid_record_values_are_rejected():
    with pytest.raises(ValueError):
        _profile(step_times=(0.02, -1.0))
    with pytest.raises(ValueError):
        _profile(batch_sizes=(10,))
    with pytest.raises(ValueError):
        _profile(beta=0.0)
    with pytest.raises(ValueError):
        _profile(reference_batch=0)


def test_a_rung_too_big_for_memory_is_one_line_naming_the_batch():
    """`--batch-sizes 16,1000000000` once ended in torch's allocator message, in bytes."""
    from lbtrain.profiling.profiler import _fitting

    def no_room(size: int) -> float:
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 256000000000 bytes"
        )

    for asked, fix in ((True, "profile smaller --batch-sizes"), (False, "lower the global batch")):
        with pytest.raises(ValueError) as info:
            _fitting(no_room, asked)(1_000_000_000)
        message = str(info.value)
        assert message.startswith("profiling: a training step at batch 1,000,000,000 does not")
        assert fix in message and "\n" not in message

    def broken(size: int) -> float:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="mat1 and mat2"):  # not a memory error: as it was
        _fitting(broken, True)(8)
