"""Checkpoints by time: every `checkpoint_seconds` of training, mid-epoch too, at the same
global step on every rank, at most `CHECKPOINT_SHARE` of the run, and exact to resume from.

The runs take their time from a model clock (`ModelClock`): each step computes for 4 s on
rank 0 (3 s on rank 1), a checkpoint's write as long as a test says, nothing else any time.
Every rank decides by rank 0's training clock, which each step's control allreduce carries
up to the end of the step before (no clock is read for it), and which each epoch's end and
each save share whole: with 12 s between checkpoints, the first after step 4 (the 12 s of
steps 1-3 seen at step 4), then every 4 steps (a due time is seen a step late), whatever
the plan predicts (model 1 s a sample, 10 and 30 samples: 10 s a step, which the first
interval once trusted). Nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lbtrain.comm import run_ranks
from lbtrain.trainer import StepTimer, TrainConfig, train
from lbtrain.trainer import build as build_module
from lbtrain.trainer.callbacks import CHECKPOINT_SHARE, checkpoint_interval
from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint
from lbtrain.trainer.engine import StepTimes
from tests.fixtures.faulty_runs import BATCH, FAULTY, final_model, plan_file, same

STEP = 4.0  # model seconds of a step, on every rank


class ModelClock(StepTimer):
    """A clock only steps (and the test's checkpoint writes) move, `step` s a step."""

    def __init__(self, step: float = STEP) -> None:
        self.clock, self.step = 0.0, step
        self.marks = 0

    def now(self) -> float:
        return self.clock

    def mark(self) -> float:
        # A step's five marks: start, computed (its compute takes STEP), waited, synced, done.
        if self.marks % 5 == 1:
            self.clock += self.step
        self.marks += 1
        return self.clock

    def times(self, marks, samples: int, epoch: int) -> StepTimes:
        return StepTimes(*marks, samples=samples)


def _config(folder: Path, **changes) -> TrainConfig:
    settings = dict(
        workload=FAULTY, global_batch=BATCH, threads=1, min_batch=1, epochs=3, replan="off",
        quiet=True, curves=False, plan=str(plan_file(folder, [1.0, 3.0])),
        out=str(folder / "run"), checkpoint_every=0, checkpoint_seconds=12.0, keep=10,
    )  # fmt: skip
    settings.update(changes)
    return TrainConfig(**settings)


def _train(
    config: TrainConfig, monkeypatch, write_seconds: tuple[float, float] = (0.0, 0.0)
) -> list[list[int]]:
    """Train on 2 ranks; each rank's checkpoint writes take `write_seconds[rank]` on its
    clock. Returns the global steps each rank saved at."""
    # Rank 1's steps take 3 s: a rank that decided by its own clock would save at other
    # steps than rank 0, and the collective save would fail.
    clocks = [ModelClock(), ModelClock(STEP - 1.0)]
    saved: list[list[int]] = [[], []]
    real = build_module.checkpoint_state

    def timed_state(engine, *args, **kwargs):
        rank = engine.comm.rank
        saved[rank].append(engine.state.global_step)
        clocks[rank].clock += write_seconds[rank]
        return real(engine, *args, **kwargs)

    monkeypatch.setattr(build_module, "checkpoint_state", timed_state)
    results = run_ranks(
        2, lambda comm: train(config, comm, timer=clocks[comm.rank]).exit_code, timeout=30
    )
    for result in results:
        if result.error is not None:
            raise result.error
    assert [result.value for result in results] == [0, 0]
    return saved


def _epochs(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "epoch"]


def _files(run: Path) -> list[int]:
    return [int(p.stem.split("-")[1]) for p in list_checkpoints(run / "checkpoints")]


def test_checkpoints_by_time_fall_on_the_same_steps_on_every_rank(tmp_path, monkeypatch):
    saved = _train(_config(tmp_path), monkeypatch)
    # At 12 s (seen at step 4), 28 s (8), 44 s (12); the end. Not at 10 s a step's count.
    assert saved == [[4, 8, 12, 15]] * 2, saved
    assert _files(tmp_path / "run") == [4, 8, 12, 15]
    # Mid-epoch: at the step a resume continues from.
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "step-000000008.pt")
    assert (state["epoch"], state["step"]) == (1, 3)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["checkpoints"], summary["checkpoint_seconds"]) == (4, 0.0)


def test_checkpoints_by_epochs_go_on_beside_those_by_time_and_reset_their_count(
    tmp_path, monkeypatch
):
    saved = _train(_config(tmp_path, checkpoint_every=1), monkeypatch)
    # By time at 4; the epoch's at 5 resets the count: 9, not 8; the epoch's at 10; ...
    assert saved == [[4, 5, 9, 10, 14, 15]] * 2, saved
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "step-000000010.pt")["step"] == 0


def test_an_interval_longer_than_an_epoch_runs_across_epochs(tmp_path, monkeypatch):
    # 60 s: 15 steps, the third epoch's end (the prediction, 10 s a step, would say 6).
    saved = _train(_config(tmp_path, epochs=4, checkpoint_seconds=60.0), monkeypatch)
    assert saved == [[15, 20]] * 2, saved


def test_keep_holds_for_checkpoints_by_time(tmp_path, monkeypatch):
    saved = _train(_config(tmp_path, keep=2), monkeypatch)
    assert saved[0] == [4, 8, 12, 15]
    assert _files(tmp_path / "run") == [12, 15]


def test_zero_seconds_checkpoints_by_epochs_only(tmp_path, monkeypatch):
    saved = _train(_config(tmp_path, checkpoint_every=1, checkpoint_seconds=0.0), monkeypatch)
    assert saved == [[5, 10, 15]] * 2
    assert _files(tmp_path / "run") == [5, 10, 15]


def test_a_long_write_lengthens_the_interval_by_rank_0s_measure(tmp_path, monkeypatch):
    # Rank 0's write takes 1 s: 2% of 50 s, so after the first write (after step 4, 16 s)
    # the next comes 50 s later, at 66 s, seen at step 18 (68 s), not at step 8. Rank 1's
    # (0.5 s, 25 s) is not what every rank decides by: each by its own would save at other
    # steps.
    saved = _train(_config(tmp_path, epochs=4), monkeypatch, write_seconds=(1.0, 0.5))
    assert saved == [[4, 18, 20]] * 2, saved
    # The epochs' own time leaves the writes out (one fell in the first).
    assert [e["seconds"] for e in _epochs(tmp_path / "run")] == pytest.approx([5 * STEP] * 4)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["checkpoints"] == 3
    assert summary["checkpoint_seconds"] == pytest.approx(3.0)


def test_a_run_resumed_from_a_checkpoint_by_time_ends_as_the_one_never_stopped(
    tmp_path, monkeypatch
):
    untimed = tmp_path / "untimed"
    _train(_config(untimed, checkpoint_every=1, checkpoint_seconds=0.0), monkeypatch)
    timed = tmp_path / "timed"
    _train(_config(timed), monkeypatch)
    # Writing mid-epoch changes nothing of the training.
    assert same(final_model(timed / "run"), final_model(untimed / "run"))
    resumed = tmp_path / "resumed"
    mid_epoch = timed / "run" / "checkpoints" / "step-000000008.pt"
    config = _config(resumed, resume=str(mid_epoch), plan=None, out=str(resumed / "run"))
    _train(config, monkeypatch)
    # The clock carries on from the checkpoint's 32 s (8 steps): the next is due at 44 s,
    # seen at step 12, as in the run never stopped; the end.
    assert _files(resumed / "run") == [12, 15]
    assert same(final_model(resumed / "run"), final_model(untimed / "run"))
    summary = json.loads((resumed / "run" / "summary.json").read_text())
    assert summary["checkpoints"] == 4  # 4 and 8 before the resume, then 12 and 15


def test_the_interval_is_the_seconds_unless_the_write_needs_it_longer():
    assert checkpoint_interval(60.0, 0.0) == 60.0
    # A 3 s write is 2% of 150 s.
    assert checkpoint_interval(60.0, 3.0) == pytest.approx(3.0 / CHECKPOINT_SHARE) == 150.0
    assert checkpoint_interval(60.0, 0.5) == 60.0  # a short write: the setting holds
    assert checkpoint_interval(0.0, 3.0) == 0.0  # off
