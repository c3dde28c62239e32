"""The trainer's parts in one process: config layers, checkpoints, schedules, shares, fit."""

from __future__ import annotations

import contextlib
import io
import math
import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from lbtrain import SingleProcessCommunicator, balanced_loader
from lbtrain.cli.train import build_config, translate
from lbtrain.evaluation import evaluate, predict, share_bounds
from lbtrain.outputs import atomic_write_text
from lbtrain.trainer.checkpoint import (
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from lbtrain.trainer.config import TrainConfig, load_toml, save_toml
from lbtrain.trainer.engine import Engine, TrainingDiverged
from lbtrain.trainer.optim import build_optimizer, build_scheduler
from lbtrain.trainer.progress import Progress
from lbtrain.trainer.signals import StopSignal
from lbtrain.workloads import ConfusionEvaluator, WorkloadOption, WorkloadPlugin, toy_workload


def test_config_round_trips_through_toml(tmp_path):
    config = TrainConfig(epochs=3, lr=0.01, workload_options={"model": "hu", "pca": None})
    path = save_toml(tmp_path / "config.toml", config)
    data = load_toml(path)
    assert data["epochs"] == 3 and data["workload_options"] == {"model": "hu"}
    again = TrainConfig.from_dict(data)
    assert again.epochs == 3 and again.lr == 0.01 and again.workload_options == {"model": "hu"}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"epochs": 0}, "epochs=0 must be >= 1"),
        ({"lr": float("nan")}, "lr=nan must be a finite number"),
        ({"policy": "fast"}, "policy='fast' is unknown"),
        ({"global_batch": 2.5}, "global_batch=2.5 must be a whole number"),
        ({"momentum": 1.0}, "momentum=1.0 must be < 1"),
        ({"profiles": "p.json", "plan": "plan.json"}, "profiles='p.json' and plan='plan.json'"),
        # An unset shell variable ("--plan $PLAN") once passed for leaving the setting out.
        ({"plan": ""}, "plan='' is empty"),
        ({"resume": "  "}, "resume='  ' is empty"),
        ({"profiles": ""}, "profiles='' is empty"),
        ({"tensorboard": "."}, "tensorboard='.' must name a path inside the run folder"),
        ({"trace": "./"}, "trace='./' must name a path inside the run folder"),
    ],
)
def test_config_rejects_bad_values_by_name(change, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**change).validate()


def test_a_plan_refuses_another_policy_or_a_batch_below_min_batch_beside_it():
    from lbtrain.balancer import BalancePlan
    from lbtrain.trainer.initial_plan import _check_plan

    plan = BalancePlan("cost", 8, (8, 0), (2.0, 1.0))
    with pytest.raises(ValueError, match="made by the cost policy.*not policy='equal'"):
        _check_plan(plan, TrainConfig(plan="p.json", global_batch=8, policy="equal"), 2)
    with pytest.raises(ValueError, match="gives rank 1 a batch of 0, below min_batch=1"):
        _check_plan(plan, TrainConfig(plan="p.json", global_batch=8, min_batch=1), 2)
    # What the plan was made with, said again, is no conflict.
    _check_plan(plan, TrainConfig(plan="p.json", global_batch=8, policy="cost"), 2)


def test_a_file_that_is_no_plan_is_named_as_such():
    """A profiles file given as --plan: its missing field once came out as `not a
    BalancePlan dict ('policy'); expected BalancePlan.to_dict()`, the library's words."""
    from lbtrain.trainer.initial_plan import _plan_from

    config = TrainConfig(plan="profiles.json")
    with pytest.raises(ValueError, match=r"'profiles.json' is not a plan.json written by lbtrain"):
        _plan_from({"profiles": []}, config, 1)
    with pytest.raises(ValueError, match=r"policy='fastest' is unknown"):
        _plan_from({"policy": "fastest", "global_batch_size": 8, "batch_sizes": [8],
                    "replicas": [{"throughput": 1.0}]}, config, 1)  # fmt: skip


def test_an_empty_emulation_clears_a_checkpoints_as_its_refusal_says():
    TrainConfig(emulate_slowdown="", emulate_change="").validate()


def test_profiles_still_take_a_policy_a_smallest_batch_and_a_budget_to_re_time():
    TrainConfig(profiles="p.json", policy="equal", min_batch=2, time_budget=3.0).validate()


def test_unknown_setting_and_bad_toml_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="run.toml: unknown setting.*epoch_count"):
        TrainConfig.from_dict({"epoch_count": 3}, source="run.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("epochs = = 3\n")
    with pytest.raises(ValueError, match="bad.toml.*not valid TOML"):
        load_toml(bad)
    with pytest.raises(ValueError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")


def test_flags_override_the_file_which_overrides_the_checkpoint(tmp_path):
    plugin = WorkloadPlugin(
        build=lambda seed, size: toy_workload(),
        options=(WorkloadOption("size", 3, "a size", type=int),),
    )
    file = tmp_path / "run.toml"
    file.write_text('epochs = 7\nlr = 0.5\nsize = "9"\n[workload_options]\n')
    base = {"epochs": 2, "lr": 0.1, "seed": 4}
    config = build_config({"config": str(file), "lr": 0.25}, plugin, base)
    assert (config.epochs, config.lr, config.seed) == (7, 0.25, 4)
    assert config.workload_options == {"size": 9}  # converted by the option's type


def test_library_names_become_flags_in_messages():
    text = translate("global_batch=2 is smaller than 3 ranks x min_batch=1; out 'x' is a file")
    assert text == "--global-batch 2 is smaller than 3 ranks x --min-batch 1; --out 'x' is a file"


def test_checkpoints_are_atomic_pruned_and_found(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    for step in (5, 10, 15):
        save_checkpoint(folder, _state(step), keep=2)
    assert [p.name for p in list_checkpoints(folder)] == ["step-000000010.pt", "step-000000015.pt"]
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert find_checkpoint(tmp_path / "run") == folder / "step-000000015.pt"
    assert load_checkpoint(folder / "step-000000015.pt")["global_step"] == 15
    torn = folder / "step-000000020.pt"
    torn.write_bytes((folder / "step-000000015.pt").read_bytes()[:100])
    with pytest.raises(ValueError, match="cut short.*resume from the one before it, .*15.pt"):
        load_checkpoint(torn)
    with pytest.raises(ValueError, match="holds no checkpoint"):
        find_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        find_checkpoint(tmp_path / "nowhere")


def test_a_checkpoint_with_flipped_bytes_or_of_another_kind_is_refused(tmp_path):
    folder = tmp_path / "checkpoints"
    state = _state(3)
    state["model"] = {"weight": torch.arange(4096, dtype=torch.float32)}
    first = save_checkpoint(folder, _state(2), keep=2)
    path = save_checkpoint(folder, state, keep=2)
    data = bytearray(path.read_bytes())
    at = bytes(data).index(torch.arange(4096, dtype=torch.float32)[1000:1002].numpy().tobytes())
    data[at : at + 8] = bytes(8)  # two weights zeroed: torch.load alone would take them
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"fails its CRC-32 check; resume from .*{first.name}"):
        load_checkpoint(path)
    foreign = tmp_path / "metrics.json"
    foreign.write_text("{}")
    with pytest.raises(ValueError, match=r"not an archive that torch.save writes\); name a"):
        load_checkpoint(foreign)


def test_a_damaged_checkpoint_is_one_value_error_wherever_the_damage_lies(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoints", _state(1), keep=1)
    data = path.read_bytes()
    damaged = tmp_path / "checkpoints" / "step-000000002.pt"
    for at in range(0, len(data), 5):
        flipped = bytearray(data)
        flipped[at] ^= 0xFF
        damaged.write_bytes(bytes(flipped))
        try:
            state = load_checkpoint(damaged)
        except ValueError as exc:
            assert str(damaged) in str(exc) and "\n" not in str(exc), (at, exc)
        else:  # a byte no check covers (padding, a header field): the weights must be intact
            assert torch.equal(state["model"]["w"], torch.zeros(2)), at


def test_checkpoints_carry_crcs_even_when_torch_is_told_not_to_write_them(tmp_path):
    from torch.utils.serialization import config

    state, weights = _state(1), torch.arange(1000.0, 1016.0)
    state["model"] = {"w": weights}
    before, config.save.compute_crc32 = config.save.compute_crc32, False
    try:
        path = save_checkpoint(tmp_path, state, keep=1)
        foreign = tmp_path / "step-000000002.pt"
        torch.save(_state(2), foreign)  # no CRCs at all: read as torch would read it
    finally:
        config.save.compute_crc32 = before
    assert load_checkpoint(path)["global_step"] == 1
    assert load_checkpoint(foreign)["global_step"] == 2
    data = bytearray(path.read_bytes())
    at = bytes(data).index(weights.numpy().tobytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="fails its CRC-32 check"):
        load_checkpoint(path)


def test_outputs_get_the_usual_permissions_not_mkstemps_private_ones(tmp_path):
    path = atomic_write_text(tmp_path / "summary.json", "{}")
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    target = atomic_write_text(tmp_path / "metrics.json", "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def _state(step: int) -> dict:
    return {
        "model": {"w": torch.zeros(2)},
        "optimizer": {},
        "epoch": 0,
        "step": step,
        "global_step": step,
        "config": {},
        "plan": {},
    }


def test_schedules():
    param = nn.Parameter(torch.zeros(1))
    for name, expected in (("cosine", [1.0, 0.5, 0.0]), ("constant", [1.0] * 3)):
        opt = build_optimizer([param], "sgd", lr=1.0)
        sched = build_scheduler(opt, name, total_steps=4, steps_per_epoch=2)
        rates = []
        for _ in range(3):
            rates.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            opt.step()
            sched.step()
        assert rates == pytest.approx(expected)
    opt = build_optimizer([param], "adam", lr=1.0)
    sched = build_scheduler(opt, "step", 100, steps_per_epoch=2, step_epochs=1, gamma=0.5)
    for _ in range(4):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)


def test_a_resumed_schedule_of_another_length_sets_the_rate_of_its_first_step():
    """A cosine run of 4 steps stopped after 2 (rate 0.5), resumed as one of 8 steps: the next
    step trains at the 8-step schedule's rate for step 2, not the checkpoint's 0.5."""
    from types import SimpleNamespace

    from lbtrain.trainer.resume import follow_schedule

    param = nn.Parameter(torch.zeros(1))
    opt = build_optimizer([param], "sgd", lr=1.0)
    sched = build_scheduler(opt, "cosine", total_steps=4, steps_per_epoch=2)
    for _ in range(2):
        opt.step()
        sched.step()
    saved = opt.state_dict(), sched.state_dict()
    for total, moved in ((4, False), (8, True)):
        opt = build_optimizer([param], "sgd", lr=1.0)
        sched = build_scheduler(opt, "cosine", total_steps=total, steps_per_epoch=2)
        opt.load_state_dict(saved[0])
        sched.load_state_dict(saved[1])
        line = follow_schedule(SimpleNamespace(optimizer=opt, scheduler=sched), total)
        expected = 0.5 * (1 + math.cos(math.pi * 2 / total))
        assert opt.param_groups[0]["lr"] == pytest.approx(expected)
        assert sched.get_last_lr() == pytest.approx([expected])
        assert (line is not None) == moved, line
    assert line == (
        "the learning rate goes on at 0.854 (the checkpoint left it at 0.5): this run's "
        "schedule of 8 steps puts step 2 there, so the run differs from an uninterrupted one"
    )


@pytest.mark.parametrize(
    ("total", "weights", "unit", "expected"),
    [
        (10, [0.5, 0.3, 0.2], 1, [(0, 5), (5, 8), (8, 10)]),
        (12, [0.5, 0.5], 4, [(0, 8), (8, 12)]),
        (3, [0.1, 0.1, 0.8], 1, [(0, 0), (0, 1), (1, 3)]),
    ],
)
def test_shares_cover_every_item_once(total, weights, unit, expected):
    bounds = share_bounds(total, weights, unit)
    assert bounds == expected
    assert sum(stop - start for start, stop in bounds) == total
    assert all(start % unit == 0 for start, _ in bounds)


def test_evaluate_and_predict_in_one_process():
    comm = SingleProcessCommunicator()
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    y = torch.tensor([0, 1, 1])
    data = TensorDataset(x, y)
    metrics = evaluate(model, data, ConfusionEvaluator(2), comm, [1.0], device=torch.device("cpu"))
    assert metrics["accuracy"] == pytest.approx(2 / 3)
    preds = predict(model, data, comm, [1.0], device=torch.device("cpu"), batch_size=2)
    assert preds.tolist() == [0, 1, 0]


def test_evaluate_and_predict_tell_progress_the_items_done():
    """Before the first batch, then after each: 7 items in batches of 3."""
    comm, cpu, model = SingleProcessCommunicator(), torch.device("cpu"), nn.Linear(2, 2)
    data = TensorDataset(torch.randn(7, 2), torch.zeros(7, dtype=torch.long))
    for run in (
        lambda progress: evaluate(model, data, ConfusionEvaluator(2), comm, [1.0], device=cpu,
                                  batch_size=3, progress=progress),
        lambda progress: predict(model, data, comm, [1.0], device=cpu, batch_size=3,
                                 progress=progress),
    ):  # fmt: skip
        heard: list[tuple[int, int]] = []
        run(lambda done, total, heard=heard: heard.append((done, total)))
        assert heard == [(0, 7), (3, 7), (6, 7), (7, 7)]


def test_fit_in_one_process_is_plain_minibatch_training():
    torch.manual_seed(0)
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    data = TensorDataset(x, y)
    model = nn.Linear(4, 3)
    reference = nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    comm = SingleProcessCommunicator()
    loader = balanced_loader([1.0], data, global_batch_size=16, rank=0, seed=3)
    opt = build_optimizer(model.parameters(), "sgd", lr=0.1)
    sched = build_scheduler(opt, "constant", 6, 3)
    engine = Engine(
        model, opt, sched, loader, comm,
        loss_fn=nn.functional.cross_entropy, device=torch.device("cpu"), epochs=2,
    )  # fmt: skip
    result = engine.fit()
    assert (result.epoch, result.step, result.global_step) == (2, 0, 6)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(2):
        perm = torch.randperm(40, generator=torch.Generator().manual_seed(3 + epoch))
        for start in range(0, 40, 16):
            idx = perm[start : start + 16]
            ref_opt.zero_grad()
            nn.functional.cross_entropy(reference(x[idx]), y[idx]).backward()
            ref_opt.step()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    last = result.totals.last
    assert math.isfinite(last["loss"]) and last["samples"] == 40 and last["accuracy"] is None
    # One rank waits for no other: its control step is counted as work, not shown as idle.
    totals = result.totals
    assert totals.wait == 0.0 and totals.compute > 0, totals


def test_a_nan_loss_stops_fit_naming_epoch_and_step():
    data = TensorDataset(torch.randn(8, 2), torch.zeros(8, dtype=torch.long))
    model = nn.Linear(2, 2)
    loader = balanced_loader([1.0], data, global_batch_size=4, rank=0)
    opt = build_optimizer(model.parameters(), "sgd", lr=0.1)
    calls = []

    def loss_fn(outputs, targets):
        calls.append(1)
        loss = nn.functional.cross_entropy(outputs, targets)
        return loss * float("nan") if len(calls) == 3 else loss

    with pytest.raises(TrainingDiverged, match="epoch 2, step 1"):
        Engine(
            model, opt, build_scheduler(opt, "constant", 4, 2), loader,
            SingleProcessCommunicator(), loss_fn=loss_fn, device=torch.device("cpu"), epochs=2,
        ).fit()  # fmt: skip


def test_a_signal_stops_after_the_step_with_its_exit_status():
    import signal

    data = TensorDataset(torch.randn(8, 2), torch.zeros(8, dtype=torch.long))
    model = nn.Linear(2, 2)
    loader = balanced_loader([1.0], data, global_batch_size=2, rank=0)
    opt = build_optimizer(model.parameters(), "sgd", lr=0.1)
    stop = StopSignal()
    with stop.installed(), stop.deferring():  # as while training: a request, not an end
        signal.raise_signal(signal.SIGTERM)
        result = Engine(
            model, opt, build_scheduler(opt, "constant", 8, 4), loader,
            SingleProcessCommunicator(), loss_fn=nn.functional.cross_entropy,
            device=torch.device("cpu"), epochs=2, stop=stop,
        ).fit()  # fmt: skip
    assert (result.stop_code, result.epoch, result.step, result.global_step) == (143, 0, 1, 1)


def test_a_first_ctrl_c_while_training_says_a_second_one_loses_the_checkpoint(capfd):
    import signal

    stop = StopSignal(announce=True)
    with stop.installed(), stop.deferring():
        signal.raise_signal(signal.SIGINT)
        assert stop.code == 130
        first = capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert first == (
        "lbtrain: stopping after this step, with a checkpoint; Ctrl-C again stops at once, "
        "without one\n"
    )
    assert capfd.readouterr().err == ""
    # Other ranks stay quiet (one line for the job), and so does a SIGTERM (a scheduler's).
    for announce, signum in ((False, signal.SIGINT), (True, signal.SIGTERM)):
        with StopSignal(announce=announce).installed() as quiet, quiet.deferring():
            signal.raise_signal(signum)
        assert capfd.readouterr().err == ""


def test_a_ctrl_c_announcement_never_waits_on_a_full_pipe(monkeypatch):
    # `lbtrain train | less`, paused: a write would block the training step until the reader
    # reads on. The line is left out instead.
    import fcntl
    import os
    import signal

    from lbtrain.trainer import signals

    read, write = os.pipe()
    try:
        flags = fcntl.fcntl(write, fcntl.F_GETFL)
        fcntl.fcntl(write, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(write, b"x" * 65536)
        fcntl.fcntl(write, fcntl.F_SETFL, flags)  # blocking again, as a pipe to less is
        monkeypatch.setattr(signals, "_stderr", lambda: (write, False))
        written = []
        monkeypatch.setattr(signals.os, "write", lambda fd, data: written.append(fd))
        with StopSignal(announce=True).installed() as stop, stop.deferring():
            signal.raise_signal(signal.SIGINT)
        assert stop.code == 130 and written == []
    finally:
        os.close(read)
        os.close(write)


def test_a_ctrl_c_announcement_never_writes_to_descriptor_2_when_stderr_was_closed(
    monkeypatch, capfd
):
    # Started with `2>&-`, Python has no sys.stderr, and descriptor 2 may be any file the
    # run opened later (its folder's lock): nothing may be written there.
    import signal

    monkeypatch.setattr("sys.stderr", None)
    with StopSignal(announce=True).installed() as stop, stop.deferring():
        signal.raise_signal(signal.SIGINT)
    assert stop.code == 130 and capfd.readouterr().err == ""


def test_progress_prints_plain_lines_off_a_terminal():
    stream = io.StringIO()
    progress = Progress(True, epochs=2, log_every=2, stream=stream)
    progress.start_epoch(0, 4)
    for step in range(4):
        progress.step(step, 0.5, 100.0)
    progress.end_epoch("epoch 1/2 done")
    lines = stream.getvalue().splitlines()
    assert lines == [
        "epoch 1/2 step 2/4  loss 0.5000  100 samples/s",
        "epoch 1/2 step 4/4  loss 0.5000  100 samples/s",
        "epoch 1/2 done",
    ]
    silent = io.StringIO()
    Progress(False, 1, stream=silent).end_epoch("x")
    assert silent.getvalue() == ""


def test_an_item_bar_shows_on_a_terminal_only_and_goes_when_done():
    from lbtrain.trainer.progress import item_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for enabled, stream in ((True, io.StringIO()), (False, Terminal())):
        with item_bar(enabled, "evaluating", stream=stream) as progress:
            assert progress is None
    terminal = Terminal()
    with item_bar(True, "evaluating", stream=terminal) as progress:
        assert progress is not None
        progress(0, 8)
        progress(5, 8)
        assert "evaluating:" in terminal.getvalue() and "0/8" in terminal.getvalue()
    assert terminal.getvalue().endswith("\r")  # cleared in place: the next line starts there


def test_confusion_evaluator_counts_pairs():
    evaluator = ConfusionEvaluator(3)
    state = evaluator.new_state()
    outputs = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 5.0, 0]])
    evaluator.update(state, outputs, torch.tensor([0, 1, 2]))
    assert state.tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 0]]
    assert evaluator.summarize(state)["accuracy"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no evaluation samples"):
        evaluator.summarize(np.zeros((3, 3), dtype=np.int64))


def test_loaders_leave_the_global_random_stream_alone():
    # Dropout draws from torch's global generator; a loader that drew from it too would make
    # a resumed run (or one that evaluates more often) train with other masks.
    data = TensorDataset(torch.randn(10, 2), torch.zeros(10, dtype=torch.long))
    loader = balanced_loader([1.0, 2.0], data, global_batch_size=4, rank=1)
    model = nn.Linear(2, 2)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    for _ in loader:
        pass
    evaluate(model, data, ConfusionEvaluator(2), SingleProcessCommunicator(), [1.0],
             device=torch.device("cpu"))  # fmt: skip
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("sync", [True, False])
def test_batchnorm_buffers_are_one_state_on_every_rank_after_training(sync):
    """Plain BatchNorm sees only the rank's share, so its running statistics drift apart;
    the wrapper copies the largest share's after each step, so evaluation and checkpoints
    see one state. The comparison can fail: without the copy the ranks differ. Synchronised
    BatchNorm (the default) needs no copy: its statistics are the global batch's."""
    from lbtrain.comm import run_ranks

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 4) * 3 + 1, torch.randint(0, 2, (48,)))

    def train_on(comm, copy: bool):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
        loader = balanced_loader([1.0, 3.0], data, global_batch_size=16, rank=comm.rank)
        opt = build_optimizer(model.parameters(), "sgd", lr=0.1)
        engine = Engine(
            model, opt, build_scheduler(opt, "constant", 6, 3), loader, comm,
            loss_fn=nn.functional.cross_entropy, device=torch.device("cpu"), epochs=2,
        )  # fmt: skip
        if not copy:
            engine.broadcast_buffers = False
        engine.sync_batchnorm = sync
        engine.fit()
        return [b.clone() for b in model.buffers()]

    for copy in (True, False):
        results = run_ranks(2, lambda comm, copy=copy: train_on(comm, copy), timeout=60)
        buffers = [r.value for r in results]
        equal = all(torch.equal(a, b) for a, b in zip(*buffers, strict=True))
        assert equal == (copy or sync)


def test_an_emulated_rank_stops_its_compute_clock_at_the_epoch_check_without_batchnorm():
    """The epoch check after an epoch's first forward is a collective inside the step with or
    without BatchNorm: an emulated slow rank sleeps its stretch before it and times compute
    again after it (one more stretched piece on that step), so the fast ranks' wait for the
    slowest forward is not stretched as compute. A rank with no sample and no BatchNorm runs
    no forward: it meets the check in launch(), outside any stretched piece."""
    from dataclasses import dataclass, field

    from lbtrain.comm import run_ranks
    from lbtrain.emulation import Slowdown
    from tests.mpi.scripts.wrapper_exactness import _plan

    @dataclass(frozen=True)
    class Pieces(Slowdown):
        stretched: list = field(default_factory=list, compare=False)

        def after_step(self, compute_seconds: float) -> float:
            self.stretched.append(compute_seconds)
            return 0.0  # counted, not slept

    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))

    def train_on(comm, sizes: list[int]) -> int:
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        loader = balanced_loader(_plan(sizes), data, rank=comm.rank)
        opt = build_optimizer(model.parameters(), "sgd", lr=0.1)
        pieces = Pieces(2.0)
        engine = Engine(
            model, opt, build_scheduler(opt, "constant", 2, 1), loader, comm,
            loss_fn=nn.functional.cross_entropy, device=torch.device("cpu"), epochs=1,
            slowdown_at=lambda epoch: pieces,
        )  # fmt: skip
        engine.fit()
        return len(pieces.stretched)

    steps = 2  # 32 samples in global batches of 16
    for sizes, expected in (([4, 12], [2 * steps + 1] * 2), ([0, 16], [steps, 2 * steps + 1])):
        runs = run_ranks(2, lambda comm, v=sizes: train_on(comm, v), timeout=60)
        for result in runs:
            if result.error is not None:
                raise result.error
        # Each step: forward-backward and the optimizer; the epoch's first forward in two.
        assert [result.value for result in runs] == expected, sizes


def test_a_finished_run_takes_its_own_plan_under_another_name(tmp_path, monkeypatch):
    from lbtrain.trainer.resume import _same_setting

    (tmp_path / "plan.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert _same_setting("./plan.json", "plan.json")
    assert _same_setting(str(tmp_path / "plan.json"), "plan.json")
    assert not _same_setting("other.json", "plan.json")  # missing: not the same
    assert _same_setting(64, 64) and not _same_setting(32, 64)


def test_time_in_the_collectives_inside_a_step_is_wait_not_compute():
    """The fastest rank waits for the slowest inside each BatchNorm collective; counted as
    compute, every rank would look as slow as the slowest and the re-planner could not tell
    them apart. On a clock that ticks 1 s a reading, each collective is 1 s of wait: one
    BatchNorm layer, 2 collectives a step, plus the control allreduce's 1 s, plus the
    wrapper's epoch check at the epoch's first step (after forward, where the fast ranks
    wait for the slowest one's forward; counted as compute, it made a rank's first step of
    each epoch 40-70 ms slower in a 49/15 job, stretched again by an emulated slowdown)."""
    from lbtrain.comm import run_ranks
    from lbtrain.trainer.engine import Callback
    from lbtrain.trainer.timing import StepTimer
    from tests.mpi.scripts.wrapper_exactness import _plan

    class Ticks(StepTimer):
        def __init__(self) -> None:
            self.t = 0.0

        def now(self) -> float:
            self.t += 1.0
            return self.t

    class Keep(Callback):
        def __init__(self) -> None:
            self.records: list = []

        def on_epoch_end(self, engine, record) -> None:
            self.records.append(dict(record.ranks[engine.comm.rank], steps=record.steps))

    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))

    def train_on(comm, sync: bool, sizes: list[int]):
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
        loader = balanced_loader(_plan(sizes), data, rank=comm.rank)
        opt = build_optimizer(model.parameters(), "sgd", lr=0.1)
        keep = Keep()
        engine = Engine(
            model, opt, build_scheduler(opt, "constant", 2, 1), loader, comm,
            loss_fn=nn.functional.cross_entropy, device=torch.device("cpu"), epochs=1,
            sync_batchnorm=sync, callbacks=[keep], timer=Ticks(),
        )  # fmt: skip
        engine.fit()
        return keep.records[0]

    # A zero share (rank 0, no forward without BatchNorm) meets the epoch check in launch().
    for sync, sizes, wait in ((True, [4, 12], 3.0), (False, [4, 12], 1.0),
                              (False, [0, 16], 1.0)):  # fmt: skip
        runs = run_ranks(2, lambda comm, s=sync, v=sizes: train_on(comm, s, v), timeout=60)
        for result in runs:
            if result.error is not None:
                raise result.error
            record = result.value
            assert record["wait"] == wait * record["steps"] + 1.0, (sync, sizes, record)


def test_evaluations_are_timed_and_a_checkpoint_keeps_all_but_the_final_ones_seconds():
    """The run's summary says how long evaluating took in all sessions; a checkpoint at the
    fit's end leaves out the final evaluation (a resume evaluates again), figures and time."""
    from types import SimpleNamespace

    from lbtrain.trainer.callbacks import EvaluateCallback

    ticks = iter(range(0, 100, 2))  # each reading 2 s after the one before
    engine = SimpleNamespace(
        state=SimpleNamespace(finished=False, stop_code=0, epochs=2), log=lambda record: None
    )
    callback = EvaluateCallback(lambda e: {"oa": 0.5}, every=1, headline=("oa",),
                                say=lambda line: None, clock=lambda: next(ticks))  # fmt: skip
    callback.load_state_dict({"evaluations": [], "seconds": 10.0})  # an earlier session's
    callback.on_epoch_end(engine, SimpleNamespace(epoch=0))
    assert callback.seconds == 12.0
    callback.on_fit_end(engine)
    assert callback.seconds == 14.0
    assert callback.state_dict() == {"evaluations": [{"epoch": 1, "oa": 0.5}], "seconds": 12.0}
    older = EvaluateCallback(lambda e: {}, 1, (), lambda line: None)
    older.load_state_dict({"evaluations": []})  # a checkpoint from before the figure
    assert older.seconds == 0.0


def test_settings_that_differ_between_ranks_are_named_with_both_values():
    """A node that read another config file (or an MPMD launch) once trained with other
    settings than rank 0's, or failed in an unpacking error; the workload's options may
    differ (a data folder per node): the workloads' signatures are compared instead."""
    from lbtrain.trainer.setup import _check_same_settings

    same = TrainConfig(epochs=2, workload_options={"data_dir": "/a"}).recipe()
    _check_same_settings(
        [same, TrainConfig(epochs=2, workload_options={"data_dir": "/b"}).recipe()]
    )
    with pytest.raises(ValueError, match=r"optimizer='adam' on rank 0, optimizer='sgd' on rank 2"):
        _check_same_settings([same, same, TrainConfig(epochs=2, optimizer="sgd").recipe()])
    with pytest.raises(ValueError, match=r"epochs=2 on rank 0, epochs=3 on rank 1"):
        _check_same_settings([same, TrainConfig(epochs=3).recipe()])


@pytest.mark.parametrize("option", ["--plan", "--profiles"])
def test_a_plan_or_profiles_file_is_read_before_the_data(option, tmp_path, monkeypatch, capsys):
    """A scene may take minutes to download or read: a missing file fails first."""
    from lbtrain import SingleProcessCommunicator
    from lbtrain.cli.entry import main
    from lbtrain.trainer import setup

    def too_early(*args, **kwargs):
        raise AssertionError("built the workload before reading the file")

    monkeypatch.setattr(setup, "_build_workload", too_early)
    missing = str(tmp_path / "missing.json")
    argv = ["train", "--dataset", "synthetic", option, missing, "--out", str(tmp_path / "r")]
    assert main(argv, comm=SingleProcessCommunicator()) == 2
    assert "missing.json" in capsys.readouterr().err


def test_a_resumed_run_keeps_its_checkpoints_plan_though_the_plan_file_is_gone(tmp_path):
    """--resume auto with --plan: where nothing changed the checkpoint's plan serves, so a
    plan file deleted since (a node's /tmp) must not stop the restart before make_plan."""
    from lbtrain import SingleProcessCommunicator
    from lbtrain.trainer.initial_plan import check_plan_files

    comm, gone = SingleProcessCommunicator(), str(tmp_path / "gone.json")
    check_plan_files(comm, TrainConfig(plan=gone, resume="auto", out=str(tmp_path / "run")))
    with pytest.raises(Exception, match="gone.json' does not exist"):
        check_plan_files(comm, TrainConfig(plan=gone))


def test_progress_counts_batches_whatever_the_collate_makes_of_the_targets():
    comm, cpu, model = SingleProcessCommunicator(), torch.device("cpu"), nn.Linear(2, 2)
    data = TensorDataset(torch.randn(5, 2), torch.zeros(5, dtype=torch.long))
    heard: list[tuple[int, int]] = []

    def no_targets(items):  # a predict_set's targets are ignored: a collate may drop them
        return torch.stack([x for x, _ in items]), None

    predict(model, data, comm, [1.0], device=cpu, batch_size=2, collate_fn=no_targets,
            progress=lambda done, total: heard.append((done, total)))  # fmt: skip
    assert heard == [(0, 5), (2, 5), (4, 5), (5, 5)]


def test_a_plan_made_for_another_model_is_refused_like_its_profiles():
    """plan.json records the model it was made for: its speeds are that model's, so a
    --plan of another one once predicted 1.3 ms a step where 19 ms were measured."""
    import json

    from lbtrain.balancer import BalancePlan, plan_batches
    from lbtrain.trainer.initial_plan import _check_made_for, plan_record

    plan = plan_batches([1.0, 2.0], 12, "proportional")
    record = json.loads(plan_record(plan, toy_workload(features=8)))
    assert BalancePlan.from_dict(record) == plan  # the plan's reader skips the record
    _check_made_for(record, toy_workload(features=8), "plan.json")
    with pytest.raises(ValueError, match=r"made for the toy workload's .* with samples 8, but "
                                         r"this run trains .* with samples 16;"):  # fmt: skip
        _check_made_for(record, toy_workload(features=16), "plan.json")
    _check_made_for(plan.to_dict(), toy_workload(features=16), "old.json")  # no record: as before
