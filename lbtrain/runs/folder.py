"""Reading one run folder back: the recipe, the plan, the epochs, the summary, the files.

A run folder is what `lbtrain train` writes (lbtrain/trainer/run_folder.py): config.toml
and plan.json when training starts, one metrics.jsonl line per epoch as it goes, and
summary.json once it finished. A folder with metrics.jsonl but no summary.json is a run
that did not finish (stopped, killed, or still running): it loads, with what there is.
"""

from __future__ import annotations

import fcntl
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtrain.text import device_label, plural
from lbtrain.viz.records import epoch_records, eval_records, read_metrics

__all__ = ["LOCK_FILE", "RUN_MARKERS", "Run", "load_run"]

# Files whose presence makes a folder a run folder (any one of them).
RUN_MARKERS = ("summary.json", "config.toml", "metrics.jsonl")
# Held (flock) by rank 0 of `lbtrain train` while it writes the folder (trainer/run_folder.py).
# The file stays after the run: one removed as a process ends could be locked by a process
# starting and created anew by another, and both would write.
LOCK_FILE = ".lbtrain.lock"


@dataclass(frozen=True)
class Run:
    """What one run folder holds, read back.

    Attributes:
        folder: the folder, as given.
        recipe: config.toml (the run's settings), or None where it is missing.
        plan: plan.json (the plan in force at the end, or at the start for a run that did
            not finish), or None.
        epochs: metrics.jsonl's epoch records, one per epoch (a resumed epoch's later one).
        evaluations: its eval records, one per evaluated epoch.
        start: its last start record (devices, policy, planned epochs), or None.
        starts: every start record, one per session (a resumed session's says where).
        stop: its stop record (a run stopped by a signal), or None.
        ended: whether metrics.jsonl holds the run's end record.
        summary: summary.json, or None for a run that did not finish.
        writer: the pid of the `lbtrain train` writing the folder now, or None.
        files: every file in the folder, as a path relative to it -> size in bytes.
    """

    folder: Path
    recipe: dict[str, Any] | None
    plan: dict[str, Any] | None
    epochs: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    start: dict[str, Any] | None
    starts: list[dict[str, Any]]
    stop: dict[str, Any] | None
    ended: bool
    summary: dict[str, Any] | None
    files: dict[str, int]
    writer: str | None = None

    @property
    def finished(self) -> bool:
        """Whether the run finished: its summary.json was written."""
        return self.summary is not None

    @property
    def name(self) -> str:
        """The folder's own name, as a column of a comparison shows it."""
        return self.folder.name or str(self.folder)

    @property
    def planned_epochs(self) -> int | None:
        """The epochs the run was set to train, or None where no file says."""
        for source in (self.start, self.recipe):
            if source and isinstance(source.get("epochs"), int):
                return int(source["epochs"])
        return None

    @property
    def world_size(self) -> int | None:
        """How many ranks the run had, or None where no file says."""
        for source in (self.summary, self.start):
            if source and isinstance(source.get("world_size"), int):
                return int(source["world_size"])
        if self.plan and isinstance(self.plan.get("batch_sizes"), list):
            return len(self.plan["batch_sizes"])
        return None

    @property
    def policy(self) -> str | None:
        """The balancing policy, or None where no file says."""
        for source in (self.summary, self.start, self.plan, self.recipe):
            if source and isinstance(source.get("policy"), str):
                return str(source["policy"])
        return None

    @property
    def devices(self) -> list[str]:
        """Each rank's device as the run printed it ("cpu", "cpu x4"): as it ended, from
        summary.json, else as the last session started; empty if unknown. (An emulated
        slowdown may change mid-run: the end's is the one the plan in force was made for.)"""
        if self.summary and isinstance(self.summary.get("ranks"), list):
            return [device_label(row) for row in self.summary["ranks"]]
        if self.start and isinstance(self.start.get("devices"), list):
            return [str(device) for device in self.start["devices"]]
        return []

    @property
    def metrics(self) -> dict[str, Any]:
        """The final evaluation's headline metrics (summary.json); none before the run
        finished (an earlier evaluation is in `evaluations`)."""
        if self.summary and isinstance(self.summary.get("metrics"), dict):
            return dict(self.summary["metrics"])
        return {}

    @property
    def replans(self) -> list[dict[str, Any]]:
        """The epoch records after which the plan changed (their ``replan`` says how)."""
        return [record for record in self.epochs if record.get("replan")]

    @property
    def replan_count(self) -> int:
        """How many times the plan changed over the whole run: summary.json's count (a run
        resumed into a new folder carries it over), or metrics.jsonl's where that is more."""
        counted = self.summary.get("replans") if self.summary else None
        # Earlier versions started the summary's count again on a resume on another number
        # of ranks, while metrics.jsonl keeps every re-plan: the larger is the run's.
        return max(counted if isinstance(counted, int) else 0, len(self.replans))

    @property
    def epochs_done(self) -> int:
        """The last epoch's number (a run resumed into a new folder holds only the epochs
        trained there, so its records alone would count short)."""
        return int(self.epochs[-1].get("epoch", len(self.epochs))) if self.epochs else 0

    @property
    def unfinished(self) -> str | None:
        """Why the run did not finish, as a phrase; None when it finished."""
        if self.finished:
            return None
        done = self.epochs_done
        planned = f" of {self.planned_epochs}" if self.planned_epochs else ""
        if self.writer is not None:
            return (
                f"still running: lbtrain train (pid {self.writer}) is writing it, at epoch "
                f"{done}{planned}"
            )
        if self.stop is not None:
            epoch, step = self.stop.get("epoch"), self.stop.get("step")
            reason = str(self.stop.get("reason", "signal"))
            if reason.startswith("diverged"):
                # The engine's stop record: "diverged: training diverged: the loss ..."
                return reason.removeprefix("diverged: ")
            if step:
                return f"stopped by a signal in epoch {epoch}{planned} after step {step}"
            return f"stopped by a signal after epoch {epoch}{planned}"
        if self.ended:  # the end line is written just after summary.json
            return "its metrics.jsonl says it ended, but summary.json is missing"
        if not self.epochs:
            return "no epoch recorded (stopped before training, or still starting)"
        if self.planned_epochs and done >= self.planned_epochs:
            return (
                f"all {self.planned_epochs} epochs trained, but no summary.json: stopped while "
                "evaluating or writing its outputs (or still doing so)"
            )
        return f"no summary.json after epoch {done}{planned} (killed, or still running)"

    @property
    def resumes(self) -> list[str]:
        """Where each later session took the run up, as phrases ("after epoch 3 on 1 rank,
        2 before"); empty for a run trained in one go."""
        phrases, before = [], None
        for start in self.starts:
            ranks = start.get("world_size")
            at = start.get("resumed_at")
            if isinstance(at, dict):
                before = at.get("world_size") or before  # absent before lbtrain wrote it
                epoch, step = at.get("epoch", 0), at.get("step", 0)
                where = (
                    f"in epoch {epoch + 1} after step {step}" if step else f"after epoch {epoch}"
                )
                if isinstance(ranks, int):
                    where += f" on {plural(ranks, 'rank')}"
                    if isinstance(before, int) and before != ranks:
                        where += f", {before} before"
                phrases.append(where)
            before = ranks
        return phrases

    @property
    def diverged(self) -> bool:
        """Whether training stopped because the loss ran away (a resume cannot help)."""
        return self.stop is not None and str(self.stop.get("reason", "")).startswith("diverged")

    @property
    def checkpoints(self) -> list[str]:
        """The checkpoint files in the folder, oldest first."""
        return [n for n in self.files if n.startswith("checkpoints/step-") and n.endswith(".pt")]


def load_run(folder: str | os.PathLike[str]) -> Run:
    """Read the run folder `folder`.

    Raises:
        ValueError: one line naming the path and the fix: the folder does not exist, is not
            a folder, is not a run folder, or one of its files cannot be read or parsed.
    """
    path = Path(folder)
    _check_folder(path)
    records = _records(path / "metrics.jsonl")
    starts = [r for r in records if r["type"] == "start"]
    stops = [r for r in records if r["type"] == "stop"]
    return Run(
        folder=path,
        recipe=_recipe(path / "config.toml"),
        plan=_checked(path / "plan.json", "plan", _PLAN_FIELDS),
        epochs=epoch_records(records),
        evaluations=eval_records(records),
        start=starts[-1] if starts else None,
        starts=starts,
        # A resumed run that went on after a stop is no longer stopped.
        stop=stops[-1] if stops and records[-1]["type"] == "stop" else None,
        ended=bool(records) and records[-1]["type"] == "end",
        summary=_checked(path / "summary.json", "run summary", _SUMMARY_FIELDS, _SUMMARY_CORE),
        files=_files(path),
        writer=_writer(path),
    )


def _check_folder(path: Path) -> None:
    shown = repr(str(path))
    try:
        if not path.exists():
            raise ValueError(
                f"run folder {shown} does not exist; name a folder `lbtrain train` wrote, "
                "e.g. runs/<date-time>"
            )
        if not path.is_dir():
            raise ValueError(
                f"{shown} is a file, not a run folder; name the folder it is in, "
                f"{str(path.parent)!r}"
            )
        if any((path / marker).is_file() for marker in RUN_MARKERS):
            return
        inside = sorted(
            child.name
            for child in path.iterdir()
            if child.is_dir() and any((child / m).is_file() for m in RUN_MARKERS)
        )
    except OSError as exc:
        raise ValueError(f"run folder {shown} cannot be read ({exc.strerror})") from None
    if inside:
        more = f" and {len(inside) - 3} more" if len(inside) > 3 else ""
        raise ValueError(
            f"{shown} is not a run folder but holds runs ({', '.join(inside[:3])}{more}); "
            f"name one of them, e.g. {str(path / inside[-1])!r}"
        )
    raise ValueError(
        f"{shown} is not a run folder (it has none of {', '.join(RUN_MARKERS)}); name a folder "
        "`lbtrain train` wrote, e.g. runs/<date-time>"
    )


def _text(path: Path) -> str | None:
    """The file's text, None where it does not exist."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise _damaged(path, "not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"{str(path)!r} cannot be read ({exc.strerror}); check the file") from None


def _damaged(path: Path, problem: str) -> ValueError:
    # These files are written atomically, so a bad one was changed by hand or by a copy that
    # broke: restoring it is the fix, and the others still show without it.
    return ValueError(
        f"{str(path)!r} is damaged ({problem}); restore it from a copy, or move it away to "
        "see the rest of the run"
    )


def _json(path: Path, what: str) -> dict[str, Any] | None:
    text = _text(path)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _damaged(path, f"not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(value, dict):
        raise _damaged(path, f"not a {what}: a JSON object was expected")
    return value


_NUMBER = (int, float)
# The fields a reader uses, and what each must be where present (null counts as absent).
# What every summary lbtrain writes holds, whatever the run.
_SUMMARY_CORE = ("world_size", "wall_seconds", "epochs_run", "steps")
_SUMMARY_FIELDS: dict[str, tuple[type, ...]] = {
    "metrics": (dict,),
    "ranks": (list,),
    "versions": (dict,),
    "world_size": (int,),
    "policy": (str,),
    "epochs_run": (int,),
    "steps": (int,),
    "replans": (int,),
    **dict.fromkeys(
        (
            "wall_seconds",
            "profile_seconds",
            "train_seconds",
            "eval_seconds",
            "predict_seconds",
            "checkpoint_seconds",
            "samples_per_second",
            "measured_step_seconds",
            "predicted_step_seconds",
            "prediction_error_median",
            "forecast_error_median",
            "forecast_step_seconds",
        ),
        _NUMBER,
    ),
}
_PLAN_FIELDS: dict[str, tuple[type, ...]] = {
    "batch_sizes": (list,),
    "weights": (list,),
    "predicted_step_times": (list,),
    "policy": (str,),
    "global_batch_size": (int,),
    "predicted_step_time": _NUMBER,
}


def _checked(
    path: Path, what: str, fields: dict[str, tuple[type, ...]], core: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """The JSON object at `path`, its fields checked against `fields` (a hand edit, say);
    the `core` ones must be there (a file without them would read as a finished run of 0
    epochs)."""
    value = _json(path, what)
    if value is None:
        return None
    missing = [key for key in core if value.get(key) is None]
    if missing:
        raise _damaged(path, f"it lacks {', '.join(repr(k) for k in missing)}")
    for key, kinds in fields.items():
        field = value.get(key)
        if field is not None and (isinstance(field, bool) or not isinstance(field, kinds)):
            wanted = "a number" if float in kinds else _KIND_NAMES[kinds[0]]
            raise _damaged(path, f"its {key!r} is {field!r:.40}, not {wanted}")
    # (The metrics' values are whatever the workload's evaluator gives: any JSON.)
    if not all(isinstance(row, dict) for row in value.get("ranks") or []):
        raise _damaged(path, "its 'ranks' holds an entry that is not a JSON object")
    return value


_KIND_NAMES = {
    dict: "a JSON object",
    list: "a list",
    int: "a whole number",
    str: "a string",
}


# The switches a config.toml wrote as "on"/"off" before they were booleans (TrainConfig's
# settings made with on_off=True; a test keeps the two the same). Read as booleans, so that
# `lbtrain compare` finds an old run's overlap = "on" the same as a new run's overlap = true.
ON_OFF_SETTINGS = ("flush_denormals", "overlap", "sync_batchnorm", "divergence", "curves")


def _recipe(path: Path) -> dict[str, Any] | None:
    recipe = _toml(path)
    for name in ON_OFF_SETTINGS if recipe else ():
        if recipe.get(name) in ("on", "off"):
            recipe[name] = recipe[name] == "on"
    return recipe


def _toml(path: Path) -> dict[str, Any] | None:
    text = _text(path)
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _damaged(path, f"not TOML: {exc}") from None


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():  # a run refused or stopped before its first epoch began
        return []
    try:
        return read_metrics(path)
    except UnicodeDecodeError:
        raise _damaged(path, "not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"{str(path)!r} cannot be read ({exc.strerror}); check the file") from None
    except ValueError as exc:  # names the file and the line
        raise ValueError(
            f"{exc}; the file is damaged: restore it from a copy, or delete that line"
        ) from None


def _writer(path: Path) -> str | None:
    """The pid in the folder's lock while a process holds it (a run writing there now)."""
    try:
        handle = (path / LOCK_FILE).open(encoding="utf-8")
    except OSError:  # no lock file: no run has written here since there were locks
        return None
    with handle:
        try:
            # A shared lock, let go at once: a train starting in this instant tries again
            # (trainer/run_folder.py), so it is not refused for it.
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        except OSError:  # a file system without locks cannot tell
            return None
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _files(path: Path) -> dict[str, int]:
    files = {}
    for entry in sorted(path.rglob("*")):
        if entry.is_file() and entry.name != LOCK_FILE:
            files[entry.relative_to(path).as_posix()] = entry.stat().st_size
    return files
