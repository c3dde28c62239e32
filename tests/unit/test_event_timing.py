"""CUDA-event timing, exercised on the CPU through `HostEvent` (issue 20).

On a GPU rank with no emulated slowdown the engine records an event at each of a step's
marks instead of synchronising the device, and reads the events at the epoch's end. These
tests run that path with the CPU stand-in: no synchronisation inside the steps, nothing read
before the epoch ends, the records and the trace filled from the events, and the same
model as the host-clock run. The CUDA calls themselves are proven only on a GPU
(scripts/gpu_acceptance.sh).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from lbtrain.comm import run_ranks
from lbtrain.trainer import Callback, TrainConfig, train
from lbtrain.trainer import engine as engine_module
from lbtrain.trainer.timing import EventTimer, HostEvent, PendingTimes, StepTimer
from tests.fixtures.faulty_runs import BATCH, FAULTY, final_model, plan_file, same


class CountingEvent(HostEvent):
    """A HostEvent that counts the waits on it."""

    waits = 0

    def synchronize(self) -> None:
        CountingEvent.waits += 1


class SeenDuringEpoch(Callback):
    """Notes, at each step, whether the step's times were already read: after every other
    callback (the trace's included), so none of them may read them early."""

    order = 99

    def __init__(self) -> None:
        self.read_early = 0
        self.steps = 0

    def on_step_end(self, engine, control, times) -> None:
        self.steps += 1
        self.read_early += isinstance(times, PendingTimes) and times._times is not None


def _config(folder: Path) -> TrainConfig:
    return TrainConfig(
        workload=FAULTY, global_batch=BATCH, threads=1, min_batch=1, epochs=2, replan="off",
        devices="cpu",
        quiet=True, curves=False, plan=str(plan_file(folder, [1.0, 3.0])),
        out=str(folder / "run"), trace="trace.json",
    )  # fmt: skip


def _train(config: TrainConfig, timer_for, callbacks_for=lambda rank: ()) -> None:
    results = run_ranks(
        2,
        lambda comm: (
            train(
                config, comm, timer=timer_for(comm.rank), callbacks=callbacks_for(comm.rank)
            ).exit_code
        ),
        timeout=120,
    )
    for result in results:
        if result.error is not None:
            raise result.error
    assert [r.value for r in results] == [0, 0]


def test_event_marks_leave_the_device_alone_and_fill_records_and_trace(tmp_path, monkeypatch):
    syncs = []
    real = engine_module.synchronize
    monkeypatch.setattr(engine_module, "synchronize", lambda d: (syncs.append(d), real(d)))
    seen = [SeenDuringEpoch(), SeenDuringEpoch()]
    CountingEvent.waits = 0
    events = tmp_path / "events"
    _train(
        _config(events),
        lambda rank: EventTimer(torch.device("cpu"), event=CountingEvent),
        lambda rank: (seen[rank],),
    )
    assert syncs == []  # no synchronisation around any step
    assert all(s.steps == 10 and s.read_early == 0 for s in seen)  # 2 epochs of 5 steps
    # One wait at each epoch's start (aligning the clocks), then one per step, read at the
    # epoch's end.
    assert CountingEvent.waits == 2 * (2 + 10)
    lines = (events / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    epochs = [e for e in map(json.loads, lines) if e["type"] == "epoch"]
    for epoch in epochs:
        assert all(rank["compute"] > 0 and rank["wait"] >= 0 for rank in epoch["ranks"]), epoch
    trace = json.loads((events / "run" / "trace.json").read_text(encoding="utf-8"))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {0, 1}
    assert len(spans) == 2 * 10 * 4  # every step of both ranks, four phases each

    # The host clock, synchronising as before: the same model, bit for bit.
    host = tmp_path / "host"
    syncs.clear()
    _train(_config(host), lambda rank: None)
    assert len(syncs) == 2 * 10 * 4  # before and after the compute and the update
    assert same(final_model(events / "run"), final_model(host / "run"))


def test_event_times_are_read_on_the_hosts_clock():
    class Clock(EventTimer):
        host = 100.0

        def now(self) -> float:
            return self.host

    class Fake(HostEvent):
        device = 10.0

        def record(self, stream=None) -> None:
            self.at = Fake.device

    timer = Clock(torch.device("cpu"), event=Fake)
    timer.start()  # the device at 10 s is the host at 100 s
    marks = []
    for device_time in (10.5, 10.75, 11.0, 11.0, 11.5):
        Fake.device = device_time
        marks.append(timer.mark())
    pending = timer.times(marks, samples=8, epoch=0)
    times = pending.resolve()
    assert (times.start, times.computed, times.done) == (100.5, 100.75, 101.5)
    assert times.compute == pytest.approx(0.25 + 0.5)
    assert (times.wait, times.comm, times.samples) == (0.25, 0.0, 8)
    assert pending.resolve() is times  # read once, kept
    # A callback that reads a phase gets it, as from StepTimes (reading it may wait).
    assert (pending.compute, pending.done) == (times.compute, times.done)
    with pytest.raises(AttributeError):
        pending.nothing  # noqa: B018


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_rank_times_its_steps_with_cuda_events(tmp_path):
    timers = []

    class Keep(Callback):
        def on_fit_start(self, engine) -> None:
            timers.append(engine.timer)

    config = _config(tmp_path)
    config = dataclasses.replace(config, devices="cuda:0,cpu")
    _train(config, lambda rank: None, lambda rank: (Keep(),))
    assert [type(t) for t in sorted(timers, key=lambda t: type(t).__name__)] == [
        EventTimer, StepTimer]  # fmt: skip
    lines = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    epochs = [e for e in map(json.loads, lines) if e["type"] == "epoch"]
    assert all(r["compute"] > 0 for e in epochs for r in e["ranks"])


class Pending(CountingEvent):
    """An event whose work never reports done until waited on."""

    def query(self) -> bool:
        return False


@pytest.mark.parametrize(("event", "early"), [(CountingEvent, True), (Pending, False)])
def test_a_long_epoch_counts_the_steps_done_without_waiting(tmp_path, monkeypatch, event, early):
    monkeypatch.setattr(engine_module, "SETTLE_EVERY", 2)
    seen = [SeenDuringEpoch(), SeenDuringEpoch()]
    _train(
        _config(tmp_path),
        lambda rank: EventTimer(torch.device("cpu"), event=event),
        lambda rank: (seen[rank],),
    )
    # Steps done are read as the epoch goes; a step not done is left for the epoch's end.
    assert all((s.read_early > 0) == early for s in seen), [s.read_early for s in seen]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    epochs = [e for e in map(json.loads, lines) if e["type"] == "epoch"]
    assert len(epochs) == 2 and all(r["compute"] > 0 for e in epochs for r in e["ranks"])
