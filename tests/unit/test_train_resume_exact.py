"""Resume with `--replan auto` is bit for bit: the re-planner's memory is in the checkpoint.

Re-planning decides from measured times, so the runs here take their times from a model
(`ModelTimer`): rank 1 turns 4x slower from epoch 2 on, and the plan must follow. A run
stopped by SIGTERM, mid-epoch or at an epoch's end, and resumed, must end on the very
weights and take the very plans per epoch of the run that was never stopped.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from lbtrain.comm import run_ranks
from lbtrain.runs import load_run
from lbtrain.trainer import Callback, StepTimer, TrainConfig, train
from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint
from lbtrain.trainer.engine import StepTimes
from tests.fixtures.faulty_runs import BATCH, FAULTY, final_model, plan_file, same

EPOCHS = 7


@dataclass(frozen=True)
class ModelTimes(StepTimes):
    """A step's modelled times, whole: the engine moves the wait it timed inside the step
    (the epoch check, on the real clock) from compute to wait, and under load that moved
    the re-planner's figures (a plan of 24/16 against 23/17 in one run of a busy suite)."""

    @property
    def compute(self) -> float:
        return (self.computed - self.start) + (self.done - self.synced)

    @property
    def wait(self) -> float:
        return self.waited - self.computed


class ModelTimer(StepTimer):
    """Times that follow a model: rank r's step costs b x cost[r] s, from epoch 2 on rank 1
    4x more; the sync 1 ms. What the re-planner decides from them never varies."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def times(self, marks, samples: int, epoch: int) -> StepTimes:
        cost = [1.0, 1 / 3][self.rank] * (4.0 if self.rank == 1 and epoch >= 2 else 1.0)
        compute = 1e-3 * samples * cost
        return ModelTimes(0.0, compute, compute, compute + 1e-3, compute + 1e-3, samples)


class StopAt(Callback):
    """Rank 1 asks for a stop, as a SIGTERM would, after (epoch, step) (0-based, 1-based)."""

    def __init__(self, epoch: int, step: int) -> None:
        self.at = (epoch, step)

    def on_step_end(self, engine, control, times) -> None:
        if engine.comm.rank == 1 and (engine.state.epoch, engine.state.step) == self.at:
            engine.stop.request(signal.SIGTERM)


def _config(folder: Path, **changes) -> TrainConfig:
    settings = dict(
        workload=FAULTY, global_batch=BATCH, threads=1, min_batch=1, epochs=EPOCHS,
        lr_schedule="step", lr_step_epochs=1, lr_gamma=0.5, replan="auto", quiet=True,
        curves=False, plan=str(plan_file(folder, [1.0, 3.0])), out=str(folder / "run"),
    )  # fmt: skip
    settings.update(changes)
    return TrainConfig(**settings)


def _train(config: TrainConfig, *stops: Callback, ranks: int = 2) -> list[int]:
    results = run_ranks(
        ranks,
        lambda comm: (
            train(
                config, comm, timer=ModelTimer(comm.rank), callbacks=stops if comm.rank else ()
            ).exit_code
        ),
        timeout=120,
    )
    for result in results:
        if result.error is not None:
            raise result.error
    return [result.value for result in results]


def _epochs(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "epoch"]


def _plans(run: Path) -> list[list[int]]:
    return [e["batch_sizes"] for e in _epochs(run)]


def _replans_counted(run: Path) -> None:
    """summary.json counts the re-plans the epoch records show, before a stop too."""
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    shown = sum(1 for e in _epochs(run) if e["replan"])
    assert shown and summary["replans"] == shown, (summary["replans"], shown)


def _resume(folder: Path) -> list[int]:
    run = folder / "run"
    return _train(_config(folder, resume=str(run), plan=None, out=None))


def test_sigterm_mid_epoch_and_at_an_epoch_end_resume_bit_for_bit(tmp_path):
    whole = tmp_path / "whole"
    assert _train(_config(whole)) == [0, 0]
    plans = _plans(whole / "run")
    assert plans[0] == plans[2] and plans[-1] != plans[0], plans  # the plan followed rank 1
    assert plans[-1][0] > plans[-1][1], plans
    _replans_counted(whole / "run")

    for name, epoch, step in (("mid-epoch", 3, 2), ("epoch-end", 3, 4)):
        folder = tmp_path / name
        assert _train(_config(folder), StopAt(epoch, step)) == [143, 143]
        saved = load_checkpoint(list_checkpoints(folder / "run" / "checkpoints")[-1])
        assert (saved["epoch"], saved["step"]) == ((3, 3) if step < 4 else (4, 0))
        assert _resume(folder) == [0, 0]
        assert _plans(folder / "run") == plans, name
        _replans_counted(folder / "run")
        assert same(final_model(folder / "run"), final_model(whole / "run")), name


def test_the_comparison_can_fail_a_resume_that_forgets_the_replanner_plans_otherwise(tmp_path):
    whole = tmp_path / "whole"
    assert _train(_config(whole)) == [0, 0]
    folder = tmp_path / "forgetful"
    assert _train(_config(folder), StopAt(2, 5)) == [143, 143]
    path = list_checkpoints(folder / "run" / "checkpoints")[-1]
    checkpoint = load_checkpoint(path)
    checkpoint["callbacks"].pop("replanner")
    torch.save(checkpoint, path)
    assert _resume(folder) == [0, 0]
    assert _plans(folder / "run") != _plans(whole / "run")


def test_a_mid_epoch_resume_on_one_rank_goes_on_with_the_interrupted_epochs_figures(tmp_path):
    """On another world size each rank's own streams cannot carry over, but the job's can:
    the interrupted epoch's record holds all its steps, and the summary every epoch."""
    whole = tmp_path / "whole"
    assert _train(_config(whole, replan="off")) == [0, 0]
    moved = tmp_path / "moved"
    assert _train(_config(moved, replan="off"), StopAt(3, 2)) == [143, 143]
    resumed = _config(moved, resume=str(moved / "run"), plan=None, out=None, replan="off")
    assert _train(resumed, ranks=1) == [0]
    one_go, two_sessions = _epochs(whole / "run"), _epochs(moved / "run")
    assert [e["steps"] for e in two_sessions] == [e["steps"] for e in one_go] == [5] * EPOCHS
    assert [e["samples"] for e in two_sessions] == [e["samples"] for e in one_go]
    # The update is exact whatever the world, so the losses agree to float rounding.
    assert [e["loss"] for e in two_sessions] == pytest.approx([e["loss"] for e in one_go])
    summary = json.loads((moved / "run" / "summary.json").read_text(encoding="utf-8"))
    assert (summary["epochs_run"], summary["steps"]) == (EPOCHS, 5 * EPOCHS), summary
    # The time split is this world's: one rank, its own seconds only.
    assert len(summary["ranks"]) == 1 and summary["ranks"][0]["compute_seconds"] > 0
    assert load_run(moved / "run").resumes == ["in epoch 4 after step 3 on 1 rank, 2 before"]


def test_a_re_plan_after_the_last_epoch_says_which_epochs_it_is_for(tmp_path, capsys):
    # Rank 1 slows from epoch 3 (0-based 2); two agreeing epochs decide, after the 4th.
    assert _train(_config(tmp_path, epochs=4, quiet=False)) == [0, 0]
    lines = [line for line in capsys.readouterr().out.splitlines() if "after epoch" in line]
    assert len(lines) == 1 and lines[0].startswith("  after epoch 4: re-planned"), lines
    assert lines[0].endswith("(the last epoch: the plan for epochs a resume adds)"), lines
