"""`lbtrain train` on several in-process ranks: agreement, faults, resume, settings.

The ranks are threads over `lbtrain.comm.LocalWorld` running the real command line
(tests/ranks.py), so everything that only needs "several ranks agree" is checked in
milliseconds: a bad setting stops every rank with one line, a NaN on one rank stops all at
the same step, a resumed run ends exactly where one uninterrupted run ends. What only real
processes show (an abort, kill -9, signals, the launcher's output) is in
tests/mpi/test_train_faults.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lbtrain.trainer.checkpoint import list_checkpoints, load_checkpoint
from lbtrain.trainer.config import load_toml
from tests.fixtures.faulty_runs import (
    BATCH,
    FAULTY,
    SCHEDULE,
    faulty,
    final_model,
    plan_file,
    same,
)
from tests.fixtures.run_files import entries
from tests.ranks import lbtrain_ranks


def _one_error_line(job) -> str:
    errors = job.error_lines()
    assert len(errors) == 1, job.output()  # every rank stopped; one reported
    assert "Traceback" not in job.stderr, job.output()
    return errors[0]


# ---------------------------------------------------------------------------------------
# Bad input: exit 2 on every rank, one error line (not one per rank), before any real work


def _bad_out(tmp_path: Path) -> str:
    (tmp_path / "file.txt").write_text("not a folder\n")
    return str(tmp_path / "file.txt" / "run")


def _full_out(tmp_path: Path) -> str:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine\n")
    return str(tmp_path / "full")


def _held_out(tmp_path: Path) -> str:
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "config.toml").write_text('workload = "hyperspectral"\n')
    return str(tmp_path / "held")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--global-batch", "1"], "--global-batch 1 is smaller than the 2 ranks (the balance"),
        (["--model", "nope"], "--model"),
        (["--dataset", "nope"], "--dataset"),
        (["--patch-size", "4"], "--patch-size 4"),
        (["--patch-size", "301"], "--patch-size 301"),
        (["--train-ratio", "1.5"], "--train-ratio 1.5"),
        (["--epochs", "0"], "--epochs"),
        (["--resume", "{tmp}/missing"], "does not exist"),
        (["--out", _bad_out], "cannot be written"),
        (["--out", _held_out], "already holds a run"),
        (["--out", _full_out], "is not empty (it holds notes.txt)"),
        # /proc takes no new folders, even from root.
        (["--out", "/proc/lbtrain-no-such-run"], "--out '/proc/lbtrain-no-such-run' cannot"),
        (["--dataset", "indian_pines", "--data-dir", "{tmp}/typo"], "typo' does not exist"),
        (["--model", "hu", "--patch-size", "5"], "--model hu reads only the centre"),
    ],
    ids=[
        "batch-below-world", "model", "dataset", "even-patch", "patch-too-large",
        "train-ratio", "epochs-0", "missing-resume", "out-unwritable", "out-holds-run",
        "out-not-empty", "out-uncreatable", "data-dir-typo", "hu-patch",
    ],
)  # fmt: skip
def test_a_bad_setting_is_one_error_line_and_exit_2_on_every_rank(tmp_path, args, needle):
    args = [a(tmp_path) if callable(a) else a.replace("{tmp}", str(tmp_path)) for a in args]
    defaults = ["--dataset", "synthetic", "--time-budget", "1", "--epochs", "1", "--threads", "1"]
    if "--out" not in args:
        defaults += ["--out", str(tmp_path / "run")]
    job = lbtrain_ranks(2, "train", *defaults, *args, timeout=60)
    assert job.codes == [2, 2] and not job.aborted, job.output()
    error = _one_error_line(job)
    assert error.startswith(("lbtrain: error:", "lbtrain train: error:")), error
    assert needle in error, (needle, error)
    assert not job.stdout.strip(), job.output()


# ---------------------------------------------------------------------------------------
# --config


def test_a_config_file_supplies_settings_and_a_flag_overrides_one(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        f'workload = "{FAULTY}"\nepochs = 1\nglobal_batch = {BATCH}\nlr = 0.01\n'
        'lr_schedule = "constant"\nthreads = 1\n'
        "[workload_options]\nfault_step = 2\nstep_sleep = 0.0\n"
    )
    out = tmp_path / "run"
    job = lbtrain_ranks(
        2, "train", "--config", str(config), "--lr", "0.005", "--fault-step", "4",
        "--plan", str(plan_file(tmp_path, [1.0, 3.0])), "--quiet", "--out", str(out),
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    written = load_toml(out / "config.toml")
    assert written["workload"] == FAULTY and written["epochs"] == 1
    assert written["global_batch"] == BATCH and written["lr_schedule"] == "constant"
    assert written["lr"] == 0.005  # the flag beats the file
    assert written["workload_options"]["fault_step"] == 4
    assert written["workload_options"]["step_sleep"] == 0.0


def test_an_unknown_key_in_the_config_file_is_one_error_line_and_exit_2(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f'workload = "{FAULTY}"\nepochs = 1\nbogus_setting = 3\n')
    job = lbtrain_ranks(2, "train", "--config", str(config), "--out", str(tmp_path / "run"))
    assert job.codes == [2, 2], job.output()
    error = _one_error_line(job)
    assert error.startswith("lbtrain: error:") and "bogus_setting" in error, error
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------
# A rank fails


def test_a_nan_loss_on_one_rank_stops_every_rank_and_keeps_the_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    job = lbtrain_ranks(
        3,
        *faulty("--fault", "nan", "--fault-rank", "2", "--fault-step", "7"),
        "--plan", str(plan_file(tmp_path, [1.0, 1.0, 1.0])), "--epochs", "4",
        "--checkpoint-every", "1", "--checkpoint-seconds", "0", "--out", str(out),
    )  # fmt: skip
    assert job.codes == [1, 1, 1] and not job.aborted, job.output()
    error = _one_error_line(job)
    assert error.startswith("lbtrain: error: ")
    assert "epoch 2, step 2" in error and "non-finite" in error, error
    saved = list_checkpoints(out / "checkpoints")
    assert [path.name for path in saved] == ["step-000000005.pt"], saved
    state = load_checkpoint(saved[0])
    assert (state["epoch"], state["step"], state["global_step"]) == (1, 0, 5)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert not (out / "metrics.json").exists()


def test_an_exception_on_one_rank_ends_every_rank_with_its_message(tmp_path):
    # In-process the job's end is an abort of the world (tests/mpi has the real processes).
    out = tmp_path / "run"
    job = lbtrain_ranks(
        3,
        *faulty("--fault", "raise", "--fault-rank", "1", "--fault-step", "3"),
        "--plan", str(plan_file(tmp_path, [1.0, 1.0, 1.0])), "--epochs", "3",
        "--out", str(out),
    )  # fmt: skip
    assert job.aborted and job.code == 1, job.output()
    assert job.stderr.count("injected fault on rank 1 at step 3") == 1, job.output()
    assert not (out / "metrics.json").exists()


# ---------------------------------------------------------------------------------------
# Resuming gives the run that was never stopped (same world size, fixed plan, no dropout)


@pytest.fixture(scope="module")
def one_go(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final model of 4 epochs on 2 ranks with batches 10 and 30, in one go."""
    folder = tmp_path_factory.mktemp("one-go")
    job = lbtrain_ranks(
        2, *faulty(*SCHEDULE), "--plan", str(plan_file(folder, [1.0, 3.0])),
        "--epochs", "4", "--quiet", "--out", str(folder / "run"),
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    saved = list_checkpoints(folder / "run" / "checkpoints")
    assert load_checkpoint(saved[-1])["global_step"] == 20
    return final_model(folder / "run")


def test_resume_after_epoch_2_ends_exactly_where_one_go_does(tmp_path, one_go):
    out = tmp_path / "run"
    plan = plan_file(tmp_path, [1.0, 3.0])
    job = lbtrain_ranks(
        2, *faulty(*SCHEDULE), "--plan", str(plan), "--epochs", "2", "--quiet",
        "--out", str(out),
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    after_two = load_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    assert after_two["global_step"] == 10
    job = lbtrain_ranks(2, "train", "--resume", str(out), "--epochs", "4", "--quiet")
    assert job.codes == [0, 0], job.output()
    assert (out / "metrics.json").exists()
    resumed = list_checkpoints(out / "checkpoints")[-1]
    assert load_checkpoint(resumed)["global_step"] == 20
    assert same(final_model(out), one_go)
    # The summary's wall time holds both sessions, as its training time does.
    summary = json.loads((out / "summary.json").read_text())
    assert summary["wall_seconds"] >= summary["train_seconds"] + summary["profile_seconds"]
    assert after_two["wall_seconds"] > 0 and after_two["profile_seconds"] > 0

    # The comparison can fail: the same resume without the optimizer's state (Adam's
    # moments) ends elsewhere.
    after_two["optimizer"]["state"] = {}
    # And the earlier sessions' seconds, which the checkpoint carries, are added in.
    after_two["wall_seconds"], after_two["profile_seconds"] = 1000.0, 100.0
    forgetful = tmp_path / "forgetful.pt"
    torch.save(after_two, forgetful)
    job = lbtrain_ranks(
        2, "train", "--resume", str(forgetful), "--epochs", "4", "--quiet",
        "--out", str(tmp_path / "forgetful"),
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    assert not same(final_model(tmp_path / "forgetful"), one_go)
    summary = json.loads((tmp_path / "forgetful" / "summary.json").read_text())
    assert summary["wall_seconds"] > 1000 and summary["profile_seconds"] > 100


def test_more_epochs_on_a_cosine_run_move_its_rate_and_say_so(tmp_path):
    """The cosine schedule spans the run: resuming with more epochs lifts the rate off the
    zero it ended at, and the line says where it goes on from."""
    out = tmp_path / "run"
    first = lbtrain_ranks(2, *faulty("--epochs", "2", "--lr-schedule", "cosine",
                                     "--out", str(out)))  # fmt: skip
    assert first.codes == [0, 0], first.output()
    more = lbtrain_ranks(2, "train", "--resume", str(out), "--epochs", "4")
    assert more.codes == [0, 0], more.output()
    assert "the learning rate goes on at 0.0005 (the checkpoint left it at 0)" in more.stdout
    assert "this run's schedule of 20 steps puts step 10 there" in more.stdout
    # Each epoch's rate is its first step's: epoch 3 trains at the 4-epoch schedule's rate
    # for step 10, not at the 0 the 2-epoch run ended on.
    rates = [e["lr"] for e in entries(out) if e["type"] == "epoch"]
    assert rates[:3] == pytest.approx([1e-3, 5e-4, 5e-4]), rates


def test_a_resumed_run_with_dropout_draws_the_masks_one_go_draws(tmp_path):
    """Each rank's RNG is restored on resume, so dropout masks continue where they were.

    One rank (threads share torch's global generator, so several in-process ranks would
    interleave their draws); the same run without the saved RNG ends elsewhere.
    """
    from tests.fixtures.exact_runs import COMMON, max_difference, trained

    args = [a for a in COMMON if a not in ("--dropout", "0", "--epochs", "2")]
    args += ["--dropout", "0.5", "--plan", str(plan_file(tmp_path, [1.0]))]
    # The schedule of a 1-epoch run would differ from a 2-epoch one; re-planning is timing.
    args += ["--lr-schedule", "constant", "--replan", "off"]
    # Checkpoints by epoch only: the resume must leave the one read below in the folder (the
    # plan's made-up speeds predict 40 s a step, and so a checkpoint by time at once).
    args += ["--checkpoint-seconds", "0"]
    job = lbtrain_ranks(1, *args, "--epochs", "2", "--out", str(tmp_path / "go"))
    assert job.codes == [0], job.output()
    job = lbtrain_ranks(1, *args, "--epochs", "1", "--out", str(tmp_path / "part"))
    assert job.codes == [0], job.output()
    saved = list_checkpoints(tmp_path / "part" / "checkpoints")[-1]
    job = lbtrain_ranks(1, "train", "--resume", str(tmp_path / "part"), "--epochs", "2",
                        "--quiet")  # fmt: skip
    assert job.codes == [0], job.output()
    one_go = trained(tmp_path / "go")[0]
    assert max_difference(trained(tmp_path / "part")[0], one_go) == 0.0

    # The comparison can fail: the same resume without the saved RNG state ends elsewhere.
    checkpoint = load_checkpoint(saved)
    checkpoint["ranks"] = []
    torch.save(checkpoint, tmp_path / "no-rng.pt")
    job = lbtrain_ranks(1, "train", "--resume", str(tmp_path / "no-rng.pt"), "--epochs", "2",
                        "--quiet", "--out", str(tmp_path / "no-rng"))  # fmt: skip
    assert job.codes == [0], job.output()
    assert max_difference(trained(tmp_path / "no-rng")[0], one_go) > 1e-6


# ---------------------------------------------------------------------------------------
# The divergence guard: a run whose loss ran away stops on every rank with one line


def test_a_diverging_run_stops_every_rank_with_one_line_and_exit_1(tmp_path):
    from tests.fixtures.run_files import entries

    args = [*faulty("--plan", str(plan_file(tmp_path, [1.0, 1.0]))), "--epochs", "3"]
    job = lbtrain_ranks(2, *args, "--lr", "1e9", "--out", str(tmp_path / "run"))
    assert job.codes == [1, 1], job.output()
    line = _one_error_line(job)
    assert "training diverged at epoch 1" in line and "--no-divergence" in line, line
    stop = entries(tmp_path / "run")[-1]
    assert stop["type"] == "stop" and stop["code"] == 1 and "diverged" in stop["reason"], stop
    # `lbtrain show` says why it stopped, and that a resume (same --lr) cannot help.
    shown = lbtrain_ranks(1, "show", str(tmp_path / "run"))
    assert shown.codes == [0], shown.output()
    head = shown.stdout.splitlines()[:3]
    assert head[1].startswith("  training diverged at epoch 1"), head
    assert "lower --lr" in head[2] and "--resume" not in shown.stdout, head
    # The test can fail: with the guard off the same run exits 0 with its useless model.
    job = lbtrain_ranks(2, *args, "--lr", "1e9", "--no-divergence", "--out", str(tmp_path / "off"))
    assert job.codes == [0, 0], job.output()
    # And a run that learns is left alone.
    job = lbtrain_ranks(2, *args, "--out", str(tmp_path / "fine"))
    assert job.codes == [0, 0], job.output()


# ---------------------------------------------------------------------------------------
# What a run shows: metrics.jsonl as it goes, curves.png, a trace, TensorBoard scalars


def test_a_run_streams_metrics_and_draws_curves_a_trace_and_tensorboard(tmp_path):
    from lbtrain.viz import check_trace, load_trace

    out = tmp_path / "run"
    job = lbtrain_ranks(
        2, *faulty("--plan", str(plan_file(tmp_path, [1.0, 3.0]))), "--epochs", "3",
        "--eval-every", "2", "--trace", "trace.json", "--tensorboard", "tb", "--curves",
        "--out", str(out),
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    kinds = [entry["type"] for entry in entries(out)]
    assert kinds == ["start", "epoch", "epoch", "eval", "epoch", "eval", "end"], kinds
    epoch = entries(out)[1]
    assert epoch["batch_sizes"] == [10, 30] and len(epoch["ranks"]) == 2
    assert 0 <= epoch["accuracy"] <= 1 and epoch["lr"] > 0
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = load_trace(out / "trace.json")
    check_trace(trace)
    tracks = {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert tracks == {0, 1}
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert names == {"compute", "wait", "sync", "optimizer"}
    assert list((out / "tb").glob("events.out.tfevents.*"))


def test_curves_off_leaves_the_picture_out_and_keeps_the_figures(tmp_path):
    out = tmp_path / "run"
    # `--curves off`: the old spelling of --no-curves, still read for one release.
    job = lbtrain_ranks(
        1, *faulty("--plan", str(plan_file(tmp_path, [1.0]))), "--epochs", "1", "--curves", "off",
        "--out", str(out),
    )  # fmt: skip
    assert job.codes == [0], job.output()
    assert not (out / "curves.png").exists()
    assert [e["type"] for e in entries(out)] == ["start", "epoch", "eval", "end"]
    assert load_toml(out / "config.toml")["curves"] is False  # a boolean, from the old "off"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--trace", "/abs/trace.json"], "--trace '/abs/trace.json' must name a path inside"),
        (["--trace", "trace.txt"], "--trace 'trace.txt' must end in .json"),
        (["--tensorboard", "../tb"], "--tensorboard '../tb' must name a path inside"),
        (["--divergence", "maybe"], "--divergence"),
        (["--curves", "maybe"], "--curves"),
        # A run file's name: the trace replaced profiles.json (or summary.json replaced the
        # trace), and a TensorBoard folder named so failed after training.
        (["--trace", "profiles.json"], "--trace 'profiles.json' names profiles.json, which"),
        (["--tensorboard", "./summary.json"], "--tensorboard './summary.json' names summary"),
        (["--tensorboard", "tb", "--trace", "tb/t.json"], "--trace 'tb/t.json' and --tensor"),
    ],
    ids=[
        "trace-absolute",
        "trace-suffix",
        "tensorboard-outside",
        "divergence",
        "curves",
        "trace-a-run-file",
        "tensorboard-a-run-file",
        "trace-in-tensorboard",
    ],
)
def test_bad_view_settings_are_one_line_before_any_work(tmp_path, args, needle):
    job = lbtrain_ranks(2, *faulty("--epochs", "1", "--out", str(tmp_path / "run")), *args)
    assert job.codes == [2, 2], job.output()
    assert needle in _one_error_line(job)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------
# Resume: a setting that would be ignored is applied (re-plan) or refused, never dropped


def test_resume_applies_a_new_policy_and_refuses_a_budget_it_would_not_use(tmp_path):
    from tests.fixtures.run_files import epoch_records

    out = tmp_path / "run"
    first = lbtrain_ranks(
        2, "train", "--workload", FAULTY, "--global-batch", "40", "--threads", "1",
        "--epochs", "1", "--time-budget", "0.3", "--policy", "cost", "--out", str(out),
    )  # fmt: skip
    assert first.codes == [0, 0], first.output()
    refused = lbtrain_ranks(2, "train", "--resume", str(out), "--epochs", "2",
                            "--time-budget", "5")  # fmt: skip
    assert refused.codes == [2, 2], refused.output()
    line = _one_error_line(refused)
    assert "--time-budget 5 would not apply" in line and "leave it out" in line, line
    applied = lbtrain_ranks(2, "train", "--resume", str(out), "--epochs", "2",
                            "--policy", "equal")  # fmt: skip
    assert applied.codes == [0, 0], applied.output()
    assert "policy changed from 'cost' to 'equal': planning again" in applied.stdout
    assert epoch_records(out)[-1]["batch_sizes"] == [20, 20]
    assert load_toml(out / "config.toml")["policy"] == "equal"  # what ran
    # Every epoch done: a new batch would train nothing, and config.toml must not say it did.
    finished = lbtrain_ranks(2, "train", "--resume", str(out), "--global-batch", "20")
    assert finished.codes == [2, 2], finished.output()
    line = _one_error_line(finished)
    assert "has all 2 epochs done, so --global-batch 20 would train nothing" in line, line
    assert "raise epochs above 2" in line, line
    assert load_toml(out / "config.toml")["global_batch"] == 40


def test_a_resume_on_other_ranks_names_the_checkpoints_emulation_and_the_way_on(tmp_path):
    out = tmp_path / "run"
    first = lbtrain_ranks(
        2, *faulty("--epochs", "1", "--emulate-slowdown", "1,3",
                   "--plan", str(plan_file(tmp_path, [1.0, 3.0])), "--out", str(out)),
    )  # fmt: skip
    assert first.codes == [0, 0], first.output()
    # The user typed no --emulate-slowdown here: the line says whose it is, and the ways on.
    refused = lbtrain_ranks(3, "train", "--resume", str(out), "--epochs", "2")
    assert refused.codes == [2, 2, 2], refused.output()
    line = _one_error_line(refused)
    assert line.startswith("lbtrain: error: --emulate-slowdown 1,3 comes from the checkpoint"), line
    assert "with 3 factors, or --emulate-slowdown '' to train without it" in line, line
    # The way on, as the line gives it (a copy: the run below continues the original).
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    dropped = lbtrain_ranks(3, "train", "--resume", str(copy), "--epochs", "2",
                            "--emulate-slowdown", "")  # fmt: skip
    assert dropped.codes == [0, 0, 0], dropped.output()
    # Only the slowdown changes, on as many ranks: the reason to plan again shows it.
    same = lbtrain_ranks(2, "train", "--resume", str(out), "--epochs", "2",
                         "--emulate-slowdown", "1")  # fmt: skip
    assert same.codes == [0, 0], same.output()
    assert "ran on 2 ranks (cpu, cpu x3), this job on 2 (cpu, cpu): planning again" in (
        same.stdout
    ), same.stdout


def test_the_summary_labels_each_rank_with_its_slowdown_as_the_run_ended(tmp_path):
    """--emulate-change swaps which rank is slow: the summary, read at the end, must not
    call the rank that is full speed now "x3"."""
    out = tmp_path / "run"
    job = lbtrain_ranks(
        2, *faulty("--epochs", "2", "--emulate-slowdown", "1,3", "--emulate-change", "2:3,1",
                   "--replan", "off", "--plan", str(plan_file(tmp_path, [1.0, 1.0])),
                   "--out", str(out)),
    )  # fmt: skip
    assert job.codes == [0, 0], job.output()
    ranks = json.loads((out / "summary.json").read_text())["ranks"]
    assert [row["slowdown"] for row in ranks] == [3.0, 1.0], ranks
    # `show` and `compare` label the ranks as the run ended, in every table.
    from lbtrain.runs import load_run

    assert load_run(out).devices == ["cpu x3", "cpu"]


def short_on_rank_1(seed: int = 0):
    """The faulty workload, one training sample short on rank 1: a node whose copy of the
    data differs."""
    import dataclasses
    import threading

    from torch.utils.data import Subset

    from tests.fixtures.faulty import build

    workload = build(seed)
    if threading.current_thread().name == "rank-1":  # tests/ranks.py's thread for rank 1
        kept = Subset(workload.train_set, range(len(workload.train_set) - 1))
        workload = dataclasses.replace(workload, train_set=kept)
    return workload


def test_ranks_that_built_other_data_are_refused_before_training(tmp_path):
    job = lbtrain_ranks(
        2, "train", "--workload", f"{__name__}:short_on_rank_1", "--global-batch", "40",
        "--threads", "1", "--epochs", "1", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert job.codes == [2, 2], job.output()
    line = _one_error_line(job)
    assert "rank 1 built other data than rank 0: training samples 199 (rank 0: 200)" in line
    assert "check the data files, the workload's options and the seed on every node" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_signatures_are_compared_by_value_and_a_differing_one_is_named():
    import math

    import numpy as np

    from lbtrain.trainer.data_check import check_same_data, same_value

    # What ranks legitimately build alike: NaN, a float summed in another order, arrays.
    assert same_value(math.nan, math.nan) and same_value(0.1 + 0.2, 0.3)
    assert same_value(np.arange(3), np.arange(3)) and same_value(torch.ones(2), torch.ones(2))
    assert same_value({"a": [1, (2.0, math.nan)]}, {"a": [1, (2.0, math.nan)]})
    assert not same_value(np.arange(3), np.arange(4)) and not same_value(1.0, 1.001)
    assert not same_value("ab", "ac") and not same_value([1, 2], [1, 2, 3])
    rank0 = {"training samples": 200, "split_digest": "aa", "mean": math.nan}
    check_same_data([rank0, dict(rank0), {**rank0, "mean": math.nan}])
    with pytest.raises(ValueError) as info:
        check_same_data([rank0, rank0, {**rank0, "split_digest": "bb"}])
    assert str(info.value).startswith(
        "rank 2 built other data than rank 0: split_digest 'bb' (rank 0: 'aa'); every rank"
    )
