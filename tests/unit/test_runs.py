"""Looking at runs (issue 21): `lbtrain show`, `lbtrain compare`, and the line that ends a run.

The run folders are real and made in-process, once for the module: a hyperspectral run on
the synthetic scene (OA, AA and kappa, like the demo's folder), and two runs of the
tiny faulty workload, one finished and one stopped by a signal in its second epoch. Every
check reads the expected figures from the folder's own files.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import signal
import tomllib
from pathlib import Path

import pytest

from lbtrain import SingleProcessCommunicator, plan_batches
from lbtrain.cli.entry import main
from lbtrain.runs import load_run
from lbtrain.runs.folder import LOCK_FILE
from lbtrain.text import format_metric, wall_time_parts
from lbtrain.trainer import Callback, TrainConfig, train
from tests.fixtures.faulty_runs import BATCH, FAULTY, plan_file

SCENE_EPOCHS = 3


class StopAt(Callback):
    """Ask for a stop, as a SIGINT would, after 1-based `step` of 0-based `epoch`."""

    def __init__(self, epoch: int, step: int) -> None:
        self.at = (epoch, step)

    def on_step_end(self, engine, control, times) -> None:
        if (engine.state.epoch, engine.state.step) == self.at:
            engine.stop.request(signal.SIGINT)


def _faulty_run(folder: Path, *callbacks: Callback) -> int:
    config = TrainConfig(
        workload=FAULTY, global_batch=BATCH, threads=1, epochs=4, quiet=True, devices="cpu",
        plan=str(plan_file(folder.parent, [1.0])), out=str(folder),
    )  # fmt: skip
    return train(config, SingleProcessCommunicator(), callbacks=callbacks).exit_code


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Run folders by name ("scene", "finished", "stopped"), and the scene run's stdout."""
    root = tmp_path_factory.mktemp("runs")
    plan = root / "plan-64.json"
    plan.write_text(plan_batches([1.0], 64, "proportional").to_json())  # no profiling: faster
    scene = root / "scene"
    argv = [
        "train", "--workload", "hyperspectral", "--dataset", "synthetic", "--model", "hu",
        "--global-batch", "64", "--threads", "1", "--epochs", str(SCENE_EPOCHS),
        "--eval-every", "2", "--plan", str(plan), "--out", str(scene), "--devices", "cpu",
    ]  # fmt: skip
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        # Pictures are most of these runs' time (matplotlib) and no check here looks at one:
        # the map's predictions are made (and timed), an empty file stands for its picture.
        patch.setattr("lbtrain.trainer.job.draw_curves", lambda out, title: [])
        patch.setattr("hyperspectral.artifacts.save_map", lambda path, *a, **k: path.touch())
        with contextlib.redirect_stdout(printed):
            assert main(argv, comm=SingleProcessCommunicator()) == 0
        assert _faulty_run(root / "finished") == 0
        assert _faulty_run(root / "stopped", StopAt(1, 3)) == 130
    (root / "scene.out").write_text(printed.getvalue())
    return {"scene": scene, "finished": root / "finished", "stopped": root / "stopped"}


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv), comm=SingleProcessCommunicator())
    out, err = capsys.readouterr()
    return code, out, err


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _records(folder: Path, kind: str) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["type"] == kind]


def _section(text: str, title: str) -> list[str]:
    """The lines of the section of `lbtrain show` output whose heading starts with `title`."""
    (block,) = [b for b in text.split("\n\n") if b.startswith(title)]
    return block.splitlines()


def test_the_wall_time_says_what_evaluating_and_predicting_took(runs):
    """Evaluations and the map's predictions can take longer than training: the run says
    it is predicting before it starts, and the summary's wall time splits out both."""
    printed = (runs["scene"].parent / "scene.out").read_text().splitlines()
    summary = _json(runs["scene"] / "summary.json")
    pixels = 48 * 48  # the synthetic scene's
    announced = [line for line in printed if line.startswith("predicting ")]
    assert announced == [
        f"predicting every pixel of the scene for the map (--no-map skips it): {pixels:,} "
        "items on 1 rank"
    ]
    assert printed.index(announced[0]) > max(i for i, line in enumerate(printed) if "eval:" in line)
    assert summary["eval_seconds"] > 0 and summary["predict_seconds"] > 0
    assert summary["eval_seconds"] + summary["predict_seconds"] < summary["wall_seconds"]
    (wall,) = [line for line in printed if line.startswith("  wall time ")]
    assert f"training {summary['train_seconds']:.1f} s{wall_time_parts(summary)})" in wall


def test_the_end_of_a_run_prints_its_folder_and_how_to_look_at_it(runs):
    printed = (runs["scene"].parent / "scene.out").read_text()
    assert "outputs:" not in printed  # the list of files is gone, `show` lists them
    (line,) = [line for line in printed.splitlines() if "run folder:" in line]
    match = re.fullmatch(r"  run folder: (\S+)  \(see: lbtrain show (\S+)\)", line)
    assert match and match[1] == match[2] == str(runs["scene"]), line
    folder = Path(match[1])
    for name in ("summary.json", "metrics.jsonl", "config.toml", "plan.json", "metrics.txt"):
        assert (folder / name).is_file(), name
    assert list((folder / "checkpoints").glob("step-*.pt"))


def test_show_prints_the_recipe_plan_epochs_final_metrics_and_files(runs, capsys):
    folder = runs["scene"]
    code, out, err = _cli(capsys, "show", str(folder))
    assert code == 0 and not err, err
    summary = _json(folder / "summary.json")
    assert out.startswith(f"run {folder}: finished ({SCENE_EPOCHS} epochs, 1 rank, policy ")
    recipe = " ".join(_section(out, "recipe (config.toml)"))
    assert "workload=hyperspectral" in recipe and "dataset=synthetic" in recipe
    assert f"epochs={SCENE_EPOCHS}" in recipe and "model=hu" in recipe
    plan = _json(folder / "plan.json")
    (rank0,) = [line.split() for line in _section(out, "plan (plan.json") if line[:3] == "  0"]
    assert rank0[:3] == ["0", "cpu", str(plan["batch_sizes"][0])]

    rows = {line.split()[0]: line for line in _section(out, "epochs (metrics.jsonl)")[3:]}
    evaluations = {e["epoch"]: e["metrics"] for e in _records(folder, "eval")}
    assert sorted(evaluations) == [2, 3]  # --eval-every 2, and the final evaluation
    for record in _records(folder, "epoch"):
        row = rows[str(record["epoch"])]
        assert f"{record['loss']:.4f}" in row and f"{100 * record['accuracy']:.2f} %" in row
        assert f"{record['samples'] / record['seconds']:,.0f}" in row
        for name, value in evaluations.get(record["epoch"], {}).items():
            assert format_metric(name, value) in row, (name, row)
    assert rows["1"].count("%") == 1  # the train accuracy alone: epoch 1 was not evaluated

    final = _section(out, "final (summary.json)")
    metrics = summary["metrics"]
    assert final[1] == (
        f"  OA {100 * metrics['oa']:.2f} %   AA {100 * metrics['aa']:.2f} %   "
        f"kappa {metrics['kappa']:.4f}"
    )
    assert f"wall time {summary['wall_seconds']:.1f} s" in final[2]
    files = " ".join(_section(out, "files ("))
    for path in folder.rglob("*"):
        if path.is_file() and path.name != LOCK_FILE:
            assert path.relative_to(folder).as_posix() in files
    # The lock a run holds while it writes is no output of it.
    assert (folder / LOCK_FILE).is_file() and LOCK_FILE not in files


def test_show_an_interrupted_run_says_how_far_it_got_and_how_to_continue(runs, capsys):
    folder = runs["stopped"]
    assert not (folder / "summary.json").exists()
    code, out, err = _cli(capsys, "show", str(folder))
    assert code == 0 and not err, err
    (stop,) = _records(folder, "stop")
    epochs = _records(folder, "epoch")
    head = out.splitlines()[:3]
    assert head[0] == f"run {folder}: did not finish ({len(epochs)} of 4 epochs, 1 rank, " + (
        "policy proportional)"
    )
    assert (
        head[1] == f"  stopped by a signal in epoch {stop['epoch']} of 4 after step {stop['step']}"
    )
    assert head[2].startswith(f"  continue it with: lbtrain train --resume {folder}")
    rows = _section(out, "epochs (metrics.jsonl)")[3:]
    assert [row.split()[:2] for row in rows] == [
        [str(e["epoch"]), f"{e['loss']:.4f}"] for e in epochs
    ]
    assert "final: no summary.json (the run did not finish)" in out


def test_a_run_stopped_while_writing_its_outputs_is_not_finished(runs, tmp_path):
    # summary.json and the end line come after the map and the curves: a run stopped while
    # drawing them once read as finished, with files missing.
    folder = tmp_path / "drawing"
    shutil.copytree(runs["finished"], folder)
    (folder / "summary.json").unlink()
    lines = (folder / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["type"] == "end"
    (folder / "metrics.jsonl").write_text("".join(lines[:-1]))
    run = load_run(folder)
    assert not run.finished
    assert run.unfinished.startswith(f"all {run.planned_epochs} epochs trained, but no summary")


def test_a_run_killed_without_a_word_reads_as_unfinished(runs, tmp_path):
    killed = tmp_path / "killed"
    shutil.copytree(runs["stopped"], killed)
    lines = (killed / "metrics.jsonl").read_text().splitlines(keepends=True)
    (killed / "metrics.jsonl").write_text("".join(lines[:-1]) + '{"type": "epo')  # torn line
    run = load_run(killed)
    assert not run.finished and run.stop is None and len(run.epochs) == 1
    assert run.unfinished == "no summary.json after epoch 1 of 4 (killed, or still running)"


def test_a_run_resumed_into_a_new_folder_counts_its_epochs_by_number(runs, tmp_path, capsys):
    """A resume with a new --out writes only the epochs trained there: the header counts to
    the last epoch's number, as the summary does, not the records."""
    later = tmp_path / "later"
    shutil.copytree(runs["scene"], later)
    lines = (later / "metrics.jsonl").read_text().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line).get("epoch") == SCENE_EPOCHS
            or json.loads(line).get("type") != "epoch"]  # fmt: skip
    (later / "metrics.jsonl").write_text("".join(kept))
    code, out, err = _cli(capsys, "show", str(later))
    assert code == 0 and not err, err
    assert out.splitlines()[0].startswith(f"run {later}: finished ({SCENE_EPOCHS} epochs, 1 rank")


def test_show_says_where_a_run_was_resumed(runs, tmp_path, capsys):
    stopped = tmp_path / "stopped"
    shutil.copytree(runs["stopped"], stopped)
    assert "resumed" not in _cli(capsys, "show", str(stopped))[1]
    assert _cli(capsys, "train", "--resume", str(stopped), "--quiet")[0] == 0
    code, out, err = _cli(capsys, "show", str(stopped))
    assert code == 0 and not err, err
    assert out.splitlines()[1] == "  resumed in epoch 2 after step 4 on 1 rank", out
    # Into a new folder, the one start record still says how many ranks it came from.
    later = tmp_path / "later"
    # The stop's own checkpoint, mid-epoch (no epoch's by default: by time and at the end).
    checkpoint = sorted((stopped / "checkpoints").glob("step-*.pt"))[0]
    assert _cli(capsys, "train", "--resume", str(checkpoint), "--quiet", "--epochs", "5",
                "--out", str(later))[0] == 0  # fmt: skip
    assert load_run(later).resumes == ["in epoch 2 after step 4 on 1 rank"]
    starts = [r for r in map(json.loads, (later / "metrics.jsonl").read_text().splitlines())
              if r["type"] == "start"]  # fmt: skip
    assert starts[0]["resumed_at"]["world_size"] == 1


def test_show_on_a_folder_a_run_is_writing_says_so_and_offers_no_resume(runs, tmp_path, capsys):
    import os

    from lbtrain.trainer.run_folder import hold_run_folder, release_run_folder

    live = tmp_path / "live"
    shutil.copytree(runs["stopped"], live)
    lock = hold_run_folder(live, str(live))  # as rank 0 of a resumed run holds it
    try:
        code, out, err = _cli(capsys, "show", str(live))
    finally:
        release_run_folder(lock)
    assert code == 0 and not err, err
    assert f"still running: lbtrain train (pid {os.getpid()}) is writing it" in out, out
    assert "--resume" not in out, out
    # Once the lock is let go, the folder is a stopped run again, with its resume.
    assert "continue it with: lbtrain train --resume" in _cli(capsys, "show", str(live))[1]


def test_a_finished_run_resumed_for_more_epochs_is_unfinished_until_it_ends_again(
    runs, tmp_path, capsys
):
    # Its summary.json said "finished (4 epochs)" after a stop in epoch 5.
    more = tmp_path / "more"
    shutil.copytree(runs["finished"], more)
    config = TrainConfig(
        workload=FAULTY, resume=str(more), epochs=6, global_batch=BATCH, threads=1, quiet=True
    )
    assert train(config, SingleProcessCommunicator(), callbacks=[StopAt(4, 2)]).exit_code == 130
    assert not (more / "summary.json").exists()
    run = load_run(more)
    assert not run.finished and run.unfinished.startswith("stopped by a signal in epoch 5 of 6")


def test_show_counts_the_re_plans_of_the_whole_run_as_its_summary_does(runs, tmp_path, capsys):
    # A run resumed into a new folder holds only the epochs trained there, and so only
    # their re-plans; `show` once said "0 re-plans" beside a summary that counted 3.
    later = tmp_path / "later"
    shutil.copytree(runs["scene"], later)
    summary = _json(later / "summary.json")
    (later / "summary.json").write_text(json.dumps({**summary, "replans": 3}))
    code, out, err = _cli(capsys, "show", str(later))
    assert code == 0 and not err, err
    assert ", 3 re-plans" in out, out


def _expected_row(folder: Path, metrics: list[str]) -> list[str]:
    summary = _json(folder / "summary.json")
    return [
        folder.name, summary["policy"], "1", "cpu", f"{summary['wall_seconds']:.1f}",
        f"{summary['samples_per_second']:,.0f}",
        *(format_metric(m, summary["metrics"][m]) if m in summary["metrics"] else "-"
          for m in metrics),
    ]  # fmt: skip


def _settings(folder: Path, keys: list[str]) -> list[str]:
    """The run's config.toml values of `keys` as compare prints them; '-' for an option of
    another workload (the faulty run has no dataset or model)."""
    recipe = tomllib.loads((folder / "config.toml").read_text())
    flat = {**recipe, **recipe.pop("workload_options", {})}
    return [str(flat.get(key, "-")).lower() for key in keys]


# The first six settings that differ between the scene run and the faulty one: the scene's
# workload options first, then config.toml's settings in its order.
SCENE_VS_FAULTY = ["dataset", "model", "workload", "epochs", "global_batch", "plan"]


def test_compare_prints_one_aligned_row_per_run(runs, capsys):
    code, out, err = _cli(capsys, "compare", str(runs["scene"]), str(runs["finished"]))
    assert code == 0 and not err, err
    lines = out.splitlines()
    assert (
        lines[0].split()
        == (
            f"run {' '.join(SCENE_VS_FAULTY)} policy ranks devices wall time (s) samples/s OA AA "
            "kappa accuracy"
        ).split()
    )
    assert set(lines[1]) == {"-", " "} and len(lines) == 6
    metrics = ["oa", "aa", "kappa", "accuracy"]
    for line, name in zip(lines[2:4], ("scene", "finished"), strict=True):
        row = _expected_row(runs[name], metrics)
        row[1:1] = _settings(runs[name], SCENE_VS_FAULTY)
        assert line.split() == " ".join(row).split()
    # Settings past the sixth are named, not shown.
    assert re.fullmatch(r"note: 1 more setting differs: eval_every \(lbtrain show RUN .*", lines[5])
    # Aligned: every column starts where its heading does.
    starts = [m.start() for m in re.finditer(r"(?<=  )\S", lines[1])]
    for line in lines[2:4]:
        assert all(line[i - 1] == " " for i in starts), line


def test_compare_markdown_is_a_table_with_a_row_per_run(runs, capsys):
    code, out, err = _cli(
        capsys, "compare", str(runs["scene"]), str(runs["finished"]), "--format", "markdown"
    )
    assert code == 0 and not err, err
    lines = out.strip().splitlines()

    def cells(line: str) -> list[str]:
        assert line.startswith("| ") and line.endswith(" |"), line
        return line[2:-2].split(" | ")

    header = cells(lines[0])
    assert header == [
        "run", *SCENE_VS_FAULTY, "policy", "ranks", "devices", "wall time (s)", "samples/s",
        "OA", "AA", "kappa", "accuracy",
    ]  # fmt: skip
    assert lines[1] == "|" + "---|" * len(header)
    assert len(lines) == 6 and lines[5].startswith("- ") and "more setting" in lines[5]
    metrics = ["oa", "aa", "kappa", "accuracy"]
    for line, name in zip(lines[2:4], ("scene", "finished"), strict=True):
        row = _expected_row(runs[name], metrics)
        row[1:1] = _settings(runs[name], SCENE_VS_FAULTY)
        assert cells(line) == row


def test_compare_shows_the_settings_that_differ_as_columns(runs, tmp_path, capsys):
    # Two runs of one recipe: no setting column. Change two settings of a copy: those two.
    code, out, err = _cli(capsys, "compare", str(runs["finished"]), str(runs["stopped"]))
    assert code == 0 and out.split()[:2] == ["run", "policy"], out
    other = tmp_path / "other"
    shutil.copytree(runs["finished"], other)
    recipe = (other / "config.toml").read_text()
    recipe = recipe.replace("seed = 0", "seed = 7").replace("lr = 0.001", "lr = 0.01")
    (other / "config.toml").write_text(recipe)
    code, out, err = _cli(capsys, "compare", str(runs["finished"]), str(other))
    assert code == 0 and not err, err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["run", "lr", "seed", "policy"], out
    assert lines[2].split()[:3] == ["finished", "0.001", "0"], out
    assert lines[3].split()[:3] == ["other", "0.01", "7"], out
    assert len(lines) == 4, out  # nothing more differs, so no note
    # A workload option one run sets is "default" in a run of the same workload that left
    # it out; the options come first; a run without config.toml is "-" in every column.
    (other / "config.toml").write_text(recipe + "step_sleep = 0.0\n")
    bare = tmp_path / "bare"
    shutil.copytree(runs["finished"], bare)
    (bare / "config.toml").unlink()
    code, out, err = _cli(capsys, "compare", str(runs["finished"]), str(other), str(bare))
    assert code == 0 and not err, err
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["run", "step_sleep", "lr", "seed", "policy"], out
    assert lines[2].split()[:4] == ["finished", "default", "0.001", "0"], out
    assert lines[3].split()[:4] == ["other", "0.0", "0.01", "7"], out
    assert lines[4].split()[:4] == ["bare", "-", "-", "-"], out
    # An option named like a trainer setting keeps its own column, whichever file holds it.
    (other / "config.toml").write_text(recipe + "seed = 5\n")
    code, out, err = _cli(capsys, "compare", str(runs["finished"]), str(other))
    assert out.split()[:5] == ["run", "workload.seed", "lr", "seed", "policy"], out
    assert out.splitlines()[3].split()[:4] == ["other", "5", "0.01", "7"], out


def test_compare_shows_an_unfinished_run_with_dashes_and_a_note(runs, capsys):
    code, out, err = _cli(capsys, "compare", str(runs["finished"]), str(runs["stopped"]))
    assert code == 0 and not err, err
    lines = out.splitlines()
    assert lines[3].split() == ["stopped", "proportional", "1", "cpu", "-", "-", "-"]
    (stop,) = _records(runs["stopped"], "stop")
    assert lines[-1] == (
        f"note: stopped did not finish: stopped by a signal in epoch {stop['epoch']} of 4 after "
        f"step {stop['step']}; '-' where its summary.json would say"
    )


def _not_a_run(tmp_path: Path) -> str:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine\n")
    return str(tmp_path / "notes")


def _damaged(tmp_path: Path, runs: dict[str, Path]) -> str:
    folder = tmp_path / "damaged"
    shutil.copytree(runs["finished"], folder)
    (folder / "summary.json").write_text('{"policy": "cost",')
    return str(folder)


def _damaged_line(tmp_path: Path, runs: dict[str, Path]) -> str:
    folder = tmp_path / "damaged"
    shutil.copytree(runs["finished"], folder)
    lines = (folder / "metrics.jsonl").read_text().splitlines(keepends=True)
    (folder / "metrics.jsonl").write_text("".join([lines[0], "{oops\n", *lines[1:]]))
    return str(folder)


def _edited(file: str, edit) -> object:
    """A maker of a copy of the finished run whose `file` went through `edit` (a hand edit)."""

    def make(tmp_path: Path, runs: dict[str, Path]) -> str:
        folder = tmp_path / "edited"
        shutil.copytree(runs["finished"], folder)
        path = folder / file
        if file.endswith(".jsonl"):
            path.write_text(path.read_text() + edit + "\n")
        else:
            path.write_text(json.dumps(edit(json.loads(path.read_text()))))
        return str(folder)

    return make


@pytest.mark.parametrize(
    ("verb", "make", "needles"),
    [
        # Once each a traceback (or a wrong figure printed with exit 0):
        ("show", _edited("summary.json", lambda d: {**d, "ranks": 5}), ("'ranks' is 5",)),
        ("show", _edited("plan.json", lambda d: {**d, "policy": 3}), ("'policy' is 3",)),
        ("show", _edited("metrics.jsonl", '{"type": "epoch", "epoch": "x"}'), ("epoch is 'x'",)),
        ("compare", _edited("summary.json", lambda d: {**d, "metrics": [1]}), ("'metrics' is",)),
        ("show", lambda tmp, runs: str(tmp / "nope"), ("does not exist", "runs/<date-time>")),
        ("show", lambda tmp, runs: _not_a_run(tmp), ("is not a run folder", "summary.json")),
        ("show", _damaged, ("summary.json' is damaged", "restore it")),
        ("show", _damaged_line, ("metrics.jsonl:2: not a JSON line", "delete that line")),
        ("compare", lambda tmp, runs: str(tmp / "nope"), ("does not exist",)),
        ("show", lambda tmp, runs: str(runs["scene"].parent), ("holds runs", "scene")),
        # Read as a finished run of 0 epochs, exit 0:
        ("show", _edited("summary.json", lambda d: {"a": None}), ("lacks 'world_size'",)),
    ],
    ids=[
        *("ranks-not-a-list", "policy-not-a-string", "epoch-not-a-count", "metrics-not-an-object"),
        *("missing", "not-a-run", "damaged-json", "damaged-jsonl", "compare-missing"),
        *("runs-parent", "summary-without-its-fields"),
    ],
)
def test_bad_run_folders_are_one_line_naming_the_path(runs, tmp_path, capsys, verb, make, needles):
    given = make(tmp_path, runs)
    argv = [verb, given] if verb == "show" else [verb, str(runs["finished"]), given]
    code, out, err = _cli(capsys, *argv)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and not out, err
    assert lines[0].startswith("lbtrain: error: ") and given in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("verb", ["show", "compare"])
def test_help_explains_the_verb_with_an_example(verb, capsys):
    with pytest.raises(SystemExit) as info:
        main([verb, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert f"lbtrain {verb} runs/20261125-122914" in text and "RUN" in text


def test_a_workloads_headline_metrics_of_any_json_kind_show(runs, tmp_path, capsys):
    # A plugin's evaluator may give lists or strings; such a run is not damaged.
    metrics = {"accuracy": 0.9, "per_class": [0.5, 1.0], "worst": "class 3"}
    folder = _edited("summary.json", lambda d: {**d, "metrics": metrics})(tmp_path, runs)
    for verb in (["show", folder], ["compare", str(runs["finished"]), folder]):
        code, out, err = _cli(capsys, *verb)
        assert code == 0 and not err, err
