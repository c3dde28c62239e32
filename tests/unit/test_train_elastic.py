"""resume=auto: one command starts a run and continues it after a restart on another world.

A stop mid-epoch on 2 ranks stands for a lost node (the checkpoint at the stop loses no
steps here); the same settings started again on 3 ranks find the run's newest checkpoint by
themselves, re-plan for the new world, say so, and end on the weights of a run that was
never stopped (float32: to 1e-5, since the new plan splits the same global batches
otherwise). A folder holding another recipe is refused in one line. In-process ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lbtrain.collective import CollectiveError
from lbtrain.comm import run_ranks
from lbtrain.trainer import Callback, TrainConfig, train
from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint
from lbtrain.viz.trace import check_trace, load_trace
from tests.fixtures.faulty_runs import BATCH, FAULTY, final_model, same
from tests.unit.test_train_resume_exact import StopAt

EPOCHS = 4


def _config(out: Path, **changes) -> TrainConfig:
    settings = dict(
        workload=FAULTY, global_batch=BATCH, threads=1, min_batch=1, epochs=EPOCHS,
        lr_schedule="step", lr_step_epochs=1, lr_gamma=0.5, replan="off", quiet=True,
        curves=False, time_budget=0.2, devices="cpu", out=str(out), resume="auto",
        checkpoint_every=1,  # a restart continues from the last epoch's checkpoint
    )  # fmt: skip
    settings.update(changes)
    return TrainConfig(**settings)


def _train(config: TrainConfig, *stops: Callback, ranks: int) -> list[int]:
    results = run_ranks(
        ranks,
        lambda comm: train(config, comm, callbacks=stops if comm.rank else ()).exit_code,
        timeout=120,
    )
    for result in results:
        if result.error is not None:
            raise result.error
    return [result.value for result in results]


def _records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def test_a_restart_on_another_world_continues_by_itself_and_ends_on_the_same_weights(tmp_path):
    whole = tmp_path / "whole"
    assert _train(_config(whole), ranks=2) == [0, 0]  # auto into a new folder: a fresh run
    assert _records(whole, "world") == []

    run = tmp_path / "elastic"
    assert _train(_config(run, emulate_slowdown="1,2"), StopAt(1, 2), ranks=2) == [143, 143]
    saved = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    stopped = saved["global_step"]
    assert stopped == 5 + 3  # the request after step 2, seen at the next step's control
    # The same recipe, one rank more: a device 4x slow, new to the run.
    assert _train(_config(run, emulate_slowdown="1,2,4", trace="trace.json"), ranks=3) == [0] * 3
    # Only the new device was profiled: the others kept their points (the sync, which
    # depends on the world, was timed again).
    profiles = json.loads((run / "profiles.json").read_text(encoding="utf-8"))["profiles"]
    points = [set(zip(p["batch_sizes"], p["step_times"], strict=True)) for p in profiles]
    before = [set(zip(p["batch_sizes"], p["step_times"], strict=True)) for p in saved["profiles"]]
    # (re-timing may add a point where a share falls outside the measured batches)
    assert points[0] >= before[0] and points[1] >= before[1]
    assert not points[2] & (before[0] | before[1])
    assert [p["sync_ranks"] for p in profiles] == [3, 3, 3]

    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["worlds"] == [
        {"ranks": 2, "from_step": 0},
        {"ranks": 3, "from_step": stopped},
    ]
    (change,) = _records(run, "world")
    assert (change["from"], change["to"], change["global_step"]) == (2, 3, stopped)
    assert len(change["old_batch_sizes"]) == 2 and len(change["batch_sizes"]) == 3
    assert sum(change["batch_sizes"]) == BATCH
    # The trace of the session on the new world begins with a line across every track.
    trace = load_trace(run / "trace.json")
    check_trace(trace)
    marks = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert [(m["name"], m["ts"], m["args"]["global_step"]) for m in marks] == [
        ("world 2 -> 3 ranks", 0.0, stopped)
    ]
    assert [e["epoch"] for e in _records(run, "epoch")] == list(range(1, EPOCHS + 1))
    ours, theirs = final_model(run), final_model(whole)
    assert all(torch.allclose(ours[k], theirs[k], rtol=0, atol=1e-5) for k in ours)
    # The check can fail: the weights after the stop are not yet the end's.
    early = load_checkpoint(list_checkpoints(whole / "checkpoints")[0])["model"]
    assert not all(torch.allclose(early[k], theirs[k], rtol=0, atol=1e-5) for k in early)


def test_a_run_that_ended_before_its_first_checkpoint_starts_over_in_its_folder(tmp_path):
    first = tmp_path / "first"
    assert _train(_config(first, epochs=1), ranks=1) == [0]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_bytes((first / "config.toml").read_bytes())
    (run / "metrics.jsonl").write_text('{"type": "start", "time": 0}\n', encoding="utf-8")
    (run / "notes.txt").write_text("mine\n", encoding="utf-8")
    # Its recipe is first's, with epochs=1: the same settings start over.
    assert _train(_config(run, epochs=1), ranks=1) == [0]
    assert len(_records(run, "start")) == 1 and (run / "summary.json").is_file()
    assert (run / "notes.txt").read_text(encoding="utf-8") == "mine\n"  # not a run's file


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_folder_holding_another_recipe_is_refused_in_one_line(tmp_path, checkpointed):
    run = tmp_path / "run"
    assert _train(_config(run, epochs=1), ranks=1) == [0]
    if not checkpointed:
        for path in list_checkpoints(run / "checkpoints"):
            path.unlink()
    with pytest.raises(CollectiveError) as caught:
        _train(_config(run, epochs=1, lr=0.5), ranks=1)
    message = str(caught.value)
    where = "checkpoint" if checkpointed else "config.toml"
    assert f"holds another run (its {where}" in message and "lr=0.001 (here: 0.5)" in message
    assert f"resume={str(run)!r}" in message and "\n" not in message


def test_auto_needs_the_folder_it_continues():
    with pytest.raises(ValueError, match="resume='auto' continues the run in the folder that out"):
        TrainConfig(resume="auto").validate()


def test_a_resume_that_fails_while_it_is_built_leaves_the_run_folder_as_it_was(tmp_path):
    """The run folder opens once the engine stands: a checkpoint whose weights do not load
    fails before a finished run's summary.json or metrics.jsonl are touched."""
    run = tmp_path / "run"
    assert _train(_config(run, epochs=1), ranks=1) == [0]
    path = list_checkpoints(run / "checkpoints")[-1]
    checkpoint = load_checkpoint(path)
    name = next(iter(checkpoint["model"]))
    checkpoint["model"][name] = torch.zeros(1)  # a shape the model does not have
    torch.save(checkpoint, path)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(RuntimeError, match="size mismatch"):  # resumed for a second epoch
        _train(_config(run, epochs=2, resume=str(run)), ranks=1)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def _damage(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a copy cut short


def test_auto_goes_on_past_a_damaged_newest_checkpoint_and_refuses_when_none_reads(tmp_path):
    whole = tmp_path / "whole"
    assert _train(_config(whole), ranks=1) == [0]
    run = tmp_path / "run"
    assert _train(_config(run), ranks=1) == [0]
    older, newest = list_checkpoints(run / "checkpoints")  # epochs 3 and 4, the end
    _damage(newest)
    # Another recipe in the folder is refused, and a refused command changes nothing there:
    # the damaged checkpoint is moved aside only once a run starts.
    files = sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(CollectiveError, match="holds another run"):
        _train(_config(run, epochs=EPOCHS + 1), ranks=1)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == files
    with pytest.warns(UserWarning, match=f"checkpoint '{newest}' cannot be read; continuing"):
        assert _train(_config(run), ranks=1) == [0]
    # From epoch 3's checkpoint: epoch 4 again, on the same batches.
    assert newest.with_name(newest.name + ".damaged").exists()
    assert [r["resumed_at"]["epoch"] for r in _records(run, "start") if r["resumed_at"]] == [3]
    assert same(final_model(run), final_model(whole))
    for path in list_checkpoints(run / "checkpoints"):
        _damage(path)
    with pytest.raises(CollectiveError, match="is damaged, cut short or overwritten"):
        _train(_config(run), ranks=1)
