"""`lbtrain train` in one process: what a resumed run may and may not change, and plan inputs.

In-process (`lbtrain.cli.entry.main`) with the tiny deterministic workload of
tests/fixtures/faulty.py, so each run takes about a second.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lbtrain import SingleProcessCommunicator
from lbtrain.cli.entry import main
from lbtrain.comm.local import run_ranks
from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint

BASE = [
    "train", "--workload", "tests.fixtures.faulty:plugin", "--global-batch", "40",
    "--threads", "1", "--time-budget", "0.5", "--quiet", "--no-curves",
    # On a GPU machine `auto` would put rank 0 on cuda:0, where a profile "on cuda" is its own.
    "--devices", "cpu",
    # These runs continue from the checkpoints of given epochs (by time, none in so short a run).
    "--checkpoint-every", "1",
]  # fmt: skip


def _train(capsys, *args: str) -> tuple[int, str, str]:
    code = main([*BASE, *args], comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(code: int, err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def two_epochs(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = _train(capsys, "--epochs", "2", "--out", str(out))
    assert code == 0, err
    return out


def test_a_resumed_run_refuses_a_new_learning_rate_or_optimizer(two_epochs, capsys):
    for args, needles in (
        (["--lr", "0.5"], ("--lr 0.001", "--lr 0.5", "leave it out")),
        (["--optimizer", "sgd"], ("--optimizer 'adam'", "'sgd'")),
        (["--seed", "3"], ("--seed 0", "--seed 3")),
    ):
        code, _, err = _train(capsys, "--resume", str(two_epochs), "--epochs", "3", *args)
        _one_error(code, err, *needles)
    # Leaving them out continues the run in its own folder.
    code, _, err = _train(capsys, "--resume", str(two_epochs), "--epochs", "3")
    assert code == 0, err
    assert load_checkpoint(list_checkpoints(two_epochs / "checkpoints")[-1])["epoch"] == 3


def test_resuming_fewer_epochs_than_done_is_refused(two_epochs, capsys):
    code, _, err = _train(capsys, "--resume", str(two_epochs), "--epochs", "1")
    _one_error(code, err, "already at epoch 2", "--epochs 1")


def test_a_mid_epoch_checkpoint_needs_the_epoch_it_stopped_in(two_epochs, capsys):
    # Stopped 3 steps into epoch 2: --epochs 1 once said "all done; evaluating only" and
    # scored a model that had trained 3 steps more than the run said.
    path = list_checkpoints(two_epochs / "checkpoints")[-1]
    checkpoint = load_checkpoint(path)
    checkpoint.update(epoch=1, step=3)
    torch.save(checkpoint, path)
    code, _, err = _train(capsys, "--resume", str(two_epochs), "--epochs", "1")
    _one_error(code, err, "already 3 steps into epoch 2", "--epochs 1", "at least 2")


def test_an_older_checkpoint_cannot_continue_in_a_folder_with_newer_ones(two_epochs, capsys):
    older, newer = list_checkpoints(two_epochs / "checkpoints")
    code, _, err = _train(capsys, "--resume", str(older), "--epochs", "2")
    _one_error(code, err, older.name, newer.name, "--out")


def test_a_finished_run_resumed_into_a_new_folder_gets_its_own_final_checkpoint(
    two_epochs, tmp_path, capsys
):
    fresh = tmp_path / "again"
    code, _, err = _train(capsys, "--resume", str(two_epochs), "--out", str(fresh))
    assert code == 0, err
    (final,) = list_checkpoints(fresh / "checkpoints")
    assert torch.equal(
        load_checkpoint(final)["model"]["0.weight"],
        load_checkpoint(list_checkpoints(two_epochs / "checkpoints")[-1])["model"]["0.weight"],
    )
    assert json.loads((fresh / "metrics.json").read_text())["accuracy"] > 0


def test_profiles_of_another_world_size_are_refused(two_epochs, tmp_path, capsys):
    profiles = json.loads((two_epochs / "profiles.json").read_text())
    profiles["profiles"], profiles["world_size"] = profiles["profiles"] * 3, 3
    for rank, entry in enumerate(profiles["profiles"]):
        entry["rank"] = rank
    path = tmp_path / "three.json"
    path.write_text(json.dumps(profiles))
    code, _, err = _train(capsys, "--profiles", str(path), "--out", str(tmp_path / "p"))
    _one_error(code, err, str(path), "3")
    # The job's own profiles file is fine.
    shutil.copy(two_epochs / "profiles.json", tmp_path / "one.json")
    code, _, err = _train(
        capsys, "--profiles", str(tmp_path / "one.json"), "--epochs", "1", "--out",
        str(tmp_path / "q"),
    )  # fmt: skip
    assert code == 0, err


def test_profiles_of_another_workload_are_refused(two_epochs, tmp_path, capsys):
    profiles = json.loads((two_epochs / "profiles.json").read_text())
    profiles["profiles"][0]["workload"] = "patch-cnn"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(profiles))
    code, _, err = _train(capsys, "--profiles", str(path), "--out", str(tmp_path / "p"))
    _one_error(code, err, f"--profiles '{path}'", "'patch-cnn'", "'faulty'")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("field", "value", "needles"),
    [
        ("slowdown", 4.0, ["rank 0 was profiled at an emulated slowdown of 4", "emulates 1"]),
        ("device_kind", "cuda", ["rank 0 was profiled on", "but runs on cpu"]),
    ],
)
def test_profiles_of_other_ranks_are_refused(two_epochs, tmp_path, capsys, field, value, needles):
    """A rank profiled 4x slow would be planned as one, perhaps to no samples at all, and a
    rank without samples is never measured again."""
    profiles = json.loads((two_epochs / "profiles.json").read_text())
    profiles["profiles"][0][field] = value
    path = tmp_path / "other.json"
    path.write_text(json.dumps(profiles))
    code, _, err = _train(capsys, "--profiles", str(path), "--out", str(tmp_path / "p"))
    _one_error(code, err, f"--profiles '{path}'", *needles)


def test_an_ensemble_checkpoint_from_before_its_batches_option_resumes_with_shared(
    tmp_path, capsys
):
    """Before --ensemble-batches every member read the same batches, and checkpoints did
    not record it: such a checkpoint is named as trained on shared batches, and resumes
    with them."""
    import torch

    from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint

    scene = ["--workload", "hyperspectral", "--dataset", "synthetic", "--no-map",
             "--model", "hu", "--ensemble", "2"]  # fmt: skip
    out = tmp_path / "old"
    code, _, err = _train(capsys, *scene, "--ensemble-batches", "shared", "--epochs", "1",
                          "--out", str(out))  # fmt: skip
    assert code == 0, err
    path = list_checkpoints(out / "checkpoints")[-1]
    old = load_checkpoint(path)
    del old["signature"]["ensemble_batches"]  # as a checkpoint from before the option
    del old["config"]["workload_options"]["ensemble_batches"]
    torch.save(old, path)
    code, _, err = _train(capsys, *scene, "--resume", str(out), "--epochs", "2")
    _one_error(code, err, "ensemble_batches 'shared' (this run: 'own')")
    code, _, err = _train(capsys, *scene, "--resume", str(out), "--epochs", "2",
                          "--ensemble-batches", "shared")  # fmt: skip
    assert code == 0, err


def test_a_global_batch_above_the_training_set_is_refused_before_profiling(
    tmp_path, capsys, monkeypatch
):
    # Every profile is taken there (the trainer, `lbtrain profile`, balance-report, plan_for).
    from lbtrain.profiling import measured_plan

    def must_not_profile(*args, **kwargs):
        raise AssertionError("profiled a batch larger than the training set")

    monkeypatch.setattr(measured_plan, "profile_all", must_not_profile)
    for batch in ("201", str(10**30)):  # the task has 200 training samples
        code, _, err = _train(capsys, "--global-batch", batch, "--out", str(tmp_path / "p"))
        _one_error(code, err, f"--global-batch {batch}", "200 training samples", "at most 200")


def test_a_checkpoint_of_another_model_or_split_is_refused(tmp_path, capsys):
    scene = ["--workload", "hyperspectral", "--dataset", "synthetic", "--no-map",
             "--epochs", "1"]  # fmt: skip
    out = tmp_path / "hs"
    code, _, err = _train(capsys, *scene, "--model", "hu", "--out", str(out))
    assert code == 0, err
    for change, needles in (
        (["--model", "hamida", "--patch-size", "3"], ("model 'hu' (this run: 'hamida')",)),
        (["--model", "hu", "--train-ratio", "0.3"], ("split_digest",)),
        # One model resumed as an ensemble: its weights do not fit the members.
        (
            ["--model", "hu", "--ensemble", "2"],
            ("ensemble 1 (this run: 2)", "ensemble_batches 'shared' (this run: 'own')"),
        ),  # fmt: skip
    ):
        code, _, err = _train(
            capsys, *scene, "--resume", str(out), "--epochs", "2",
            "--out", str(tmp_path / "next"), *change,
        )  # fmt: skip
        _one_error(code, err, "another model or data", *needles)


def test_a_share_outside_the_profiled_batches_is_timed_there_before_training(
    two_epochs, tmp_path, capsys
):
    # Profiles that only measured batches 2 and 4: the plan's 40 lies far outside them.
    profiles = json.loads((two_epochs / "profiles.json").read_text())
    (entry,) = profiles["profiles"]
    entry["batch_sizes"], entry["step_times"] = [2, 4], [1e-3, 2e-3]
    entry["alpha"], entry["beta"] = 0.0, 5e-4  # the fit of those two steps
    path = tmp_path / "short.json"
    path.write_text(json.dumps(profiles))
    out = tmp_path / "r"
    code, _, err = _train(capsys, "--profiles", str(path), "--epochs", "1", "--out", str(out))
    assert code == 0, err
    (used,) = json.loads((out / "profiles.json").read_text())["profiles"]
    assert used["batch_sizes"] == [2, 4, 40]
    assert used["step_times"][:2] == [1e-3, 2e-3] and used["step_times"][2] > 0
    # The message names the rank, the batch and the measured range.
    code, stdout, err = _train_loud(capsys, "--profiles", str(path), "--epochs", "1", "--out",
                                  str(tmp_path / "loud"))  # fmt: skip
    assert code == 0, err
    assert "timing rank 0 at batch 40 (measured 2..4), then planning again" in stdout


def _train_loud(capsys, *args: str) -> tuple[int, str, str]:
    code = main([*(a for a in BASE if a != "--quiet"), *args], comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    return code, out, err


def test_a_mid_epoch_checkpoint_resumes_on_another_world_and_one_past_the_epoch_is_refused(
    tmp_path, capsys
):
    """200 samples in global batches of 198 leave a tail of 2, a step of its own on every
    world: a checkpoint after the first step of epoch 2, saved on one rank, resumes on two
    (one of which gets no sample at the tail) and ends the epoch. Batches of 199 leave one
    sample, which joins the step before on every world: a checkpoint after a first step
    there (as an older lbtrain saved one rank's tail step) is refused with one line."""
    for batch, steps in ((198, 2), (199, 1)):
        out = tmp_path / f"run-{batch}"
        code, _, err = _train(capsys, "--global-batch", str(batch), "--epochs", "2", "--out",
                              str(out))  # fmt: skip
        assert code == 0, err
        path = list_checkpoints(out / "checkpoints")[-1]
        checkpoint = load_checkpoint(path)
        assert checkpoint["global_step"] == 2 * steps
        checkpoint.update(epoch=1, step=1, global_step=steps + 1)  # one step into epoch 2
        torch.save(checkpoint, path)
        args = [*BASE, "--global-batch", str(batch), "--epochs", "2", "--resume", str(out)]
        results = run_ranks(2, lambda comm, args=args: main(args, comm=comm), timeout=60)
        if steps == 2:
            assert [r.value for r in results] == [0, 0], [r.error for r in results]
            final = load_checkpoint(list_checkpoints(out / "checkpoints")[-1])
            assert (final["epoch"], final["global_step"]) == (2, 4)
            continue
        assert [r.value for r in results] == [2, 2], [r.error for r in results]
        _one_error(
            2, capsys.readouterr().err, "stopped after 1 step of epoch 2, which now has only 1",
            "resume from a checkpoint taken at the end of an epoch",
        )  # fmt: skip


@pytest.mark.parametrize("schedule", ["step", "cosine"])
def test_a_resume_with_another_batch_follows_the_schedule_by_epochs_not_steps(
    tmp_path, capsys, schedule
):
    # Resumed after epoch 1 of 5 steps with batches of half the size (10 steps an epoch): the
    # schedule once went on from step 5 of the new one, so the step schedule decayed mid
    # epoch 3 and the cosine ended short of zero. By epochs, every epoch's rate is the one a
    # fresh run with the new batch gives it.
    flags = ["--epochs", "4", "--lr-schedule", schedule, "--lr-step-epochs", "2"]
    first, fresh = tmp_path / "first", tmp_path / "fresh"
    # By epochs only: step-5 must still be there after 4 epochs, however slow the machine.
    code, _, err = _train(
        capsys, *flags, "--keep", "4", "--checkpoint-seconds", "0", "--out", str(first)
    )
    assert code == 0, err
    code, _, err = _train(capsys, *flags, "--global-batch", "20", "--out", str(fresh))
    assert code == 0, err
    after_one = first / "checkpoints" / "step-000000005.pt"
    code, _, err = _train(
        capsys, "--resume", str(after_one), "--global-batch", "20", "--out", str(tmp_path / "r")
    )
    assert code == 0, err

    def rates(run):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return {e["epoch"]: e["lr"] for e in map(json.loads, lines) if e["type"] == "epoch"}

    resumed, expected = rates(tmp_path / "r"), rates(fresh)
    assert sorted(resumed) == [2, 3, 4]
    for epoch, lr in resumed.items():
        assert lr == pytest.approx(expected[epoch], rel=1e-9), (epoch, resumed, expected)
    final = load_checkpoint(list_checkpoints(tmp_path / "r" / "checkpoints")[-1])
    assert final["scheduler"]["last_epoch"] == 40  # the schedule's end, no step past it


def test_no_quiet_undoes_a_quiet_run_on_resume(two_epochs, capsys):
    # --quiet is one of the settings a resume inherits; once there was no way back.
    code, out, err = _train(capsys, "--resume", str(two_epochs), "--epochs", "3")
    assert code == 0 and "resumed from" not in out, err
    code, out, err = _train(capsys, "--resume", str(two_epochs), "--epochs", "4", "--no-quiet")
    assert code == 0 and "resumed from" in out, err
