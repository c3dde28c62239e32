"""Checkpoints: what one holds and putting it back, and the files, written atomically
(:mod:`lbtrain.outputs`) so that a crash never leaves a torn one.

A checkpoint is an explicit list, nothing by accident: model, optimizer, schedule, each
rank's RNG, the run's position, the plan in force and the profiles it came from, each rank's
running totals and its interrupted epoch, and the state of every callback that has one (the
re-planner's memory, the divergence guard, the evaluations so far). The per-epoch history is
not here: it streams to metrics.jsonl, so a checkpoint's size does not grow with the epochs.

Checkpoints are named by the global step, so the newest is the one with the highest number.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lbtrain.outputs import atomic_write_bytes
from lbtrain.profiling import ReplicaProfile
from lbtrain.trainer.config import TrainConfig
from lbtrain.trainer.records import EpochRecord, Totals
from lbtrain.workloads import Workload

if TYPE_CHECKING:  # the engine imports nothing from here; the type is for hints only
    from lbtrain.trainer.engine import Engine

__all__ = [
    "CHECKPOINT_DIR",
    "FORMAT",
    "checkpoint_state",
    "restore",
    "checkpoint_name",
    "find_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_DIR = "checkpoints"

FORMAT = 2  # checkpoints of format 1 kept the whole epoch history

_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_name(global_step: int) -> str:
    """File name of the checkpoint taken after `global_step` optimizer steps."""
    return f"step-{global_step:09d}.pt"


def list_checkpoints(folder: str | os.PathLike[str]) -> list[Path]:
    """Checkpoints in `folder`, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(folder: str | os.PathLike[str], state: dict[str, Any], keep: int) -> Path:
    """Write `state` as the checkpoint of its global step, then keep only the newest `keep`.

    Args:
        folder: the checkpoints folder (created if missing).
        state: the checkpoint dict; its "global_step" names the file.
        keep: how many checkpoints to keep (>= 1).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with _crc32_on():
        torch.save(state, buffer)
    path = atomic_write_bytes(
        folder / checkpoint_name(int(state["global_step"])), buffer.getvalue()
    )
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


@contextmanager
def _crc32_on() -> Iterator[None]:
    """Have torch.save write the CRC-32s that `load_checkpoint` checks, whatever a user set."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # an older torch, which always computes them
        config = None
    save = getattr(config, "save", None)
    if save is None or not hasattr(save, "compute_crc32"):
        yield
        return
    before, save.compute_crc32 = save.compute_crc32, True
    try:
        yield
    finally:
        save.compute_crc32 = before


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint `--resume` names: a file, a checkpoints folder, or a run folder.

    Raises:
        ValueError: nothing to resume from there, with what was looked for.
    """
    path = Path(path).expanduser()
    if path.is_file():
        return path
    if not path.exists():
        raise ValueError(f"resume {str(path)!r} does not exist; name a checkpoint or a run folder")
    for folder in (path / CHECKPOINT_DIR, path):
        found = list_checkpoints(folder)
        if found:
            return found[-1]
    raise ValueError(
        f"resume {str(path)!r} holds no checkpoint (looked for {CHECKPOINT_DIR}/step-*.pt); "
        "name a checkpoint file or the folder of a run that wrote one"
    )


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint onto the CPU; a damaged or foreign file is a one-line ValueError.

    The archive's CRC-32s are checked first: torch.load does not read them, and a few
    flipped bytes inside a tensor would otherwise resume with wrong weights and exit 0.
    """
    path = Path(path)
    problem = _damage(path)
    if problem is not None:
        raise ValueError(f"resume {str(path)!r} {problem}; {_instead(path)}")
    try:
        # weights_only: a checkpoint is data; unpickling arbitrary objects would run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a foreign file
        raise ValueError(
            f"resume {str(path)!r} is not a readable lbtrain checkpoint ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:120]}); {_instead(path)}"
        ) from None
    required = ("model", "optimizer", "epoch", "step", "global_step", "config", "plan")
    if not isinstance(state, dict) or any(key not in state for key in required):
        raise ValueError(
            f"resume {str(path)!r} is not an lbtrain checkpoint (it lacks "
            f"{', '.join(k for k in required if not isinstance(state, dict) or k not in state)})"
        )
    return state


def _damage(path: Path) -> str | None:
    """Why `path` is not an intact torch.save archive, or None."""
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if magic != b"PK\x03\x04":
        return "is not an lbtrain checkpoint (not an archive that torch.save writes)"
    try:
        with zipfile.ZipFile(path) as archive:
            sized = [info for info in archive.infolist() if info.file_size]
            # Written with torch's compute_crc32 off (not by save_checkpoint): nothing to check.
            if all(info.CRC == 0 for info in sized):
                return None
            bad = archive.testzip()
    except Exception as exc:  # noqa: BLE001 - a damaged archive raises many types
        return f"is damaged, cut short or overwritten ({type(exc).__name__}: {exc})"
    return None if bad is None else f"is damaged: its part {bad!r} fails its CRC-32 check"


def _instead(path: Path) -> str:
    """What to resume from instead: the checkpoint before `path`, into a new folder (the
    damaged one stays the run's newest)."""
    if not _NAME.match(path.name):
        return f"name a {CHECKPOINT_DIR}/step-*.pt file or the folder of a run"
    earlier = [p for p in list_checkpoints(path.parent) if p.name < path.name]
    if earlier:
        return (
            f"resume from the one before it, {str(earlier[-1])!r}, with out=NEW_FOLDER (or "
            "after deleting the damaged one)"
        )
    return "name another checkpoint, or start the run again"


def _upgraded(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The callbacks' states, those of older lbtrain as the callbacks read them now: the
    re-planner's memory was saved without the plan it holds for, the checkpoint's."""
    saved = dict(checkpoint.get("callbacks") or {})
    memory = saved.get("replanner")
    if isinstance(memory, dict) and "memory" not in memory:
        saved["replanner"] = {"memory": memory, "plan": checkpoint.get("plan")}
    return saved


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def checkpoint_state(
    engine: Engine,
    profiles: list[ReplicaProfile] | None,
    config: TrainConfig,
    workload: Workload,
    devices: list[dict[str, Any]],
    worlds: list[dict[str, int]] | None = None,
) -> dict[str, Any]:
    """Everything needed to continue exactly; collective (it gathers every rank's RNG
    state, totals and interrupted epoch)."""
    state, comm = engine.state, engine.comm
    record = state.record.to_dict() if state.record is not None and state.step else None
    ranks = comm.allgather(
        {"rng": _rng_state(engine.device), "totals": state.totals.state_dict(), "record": record}
    )
    return {
        "format": FORMAT,
        "model": {k: v.detach().cpu() for k, v in engine.model.state_dict().items()},
        "optimizer": engine.optimizer.state_dict(),
        "scheduler": engine.scheduler.state_dict(),
        "epoch": state.epoch,
        "step": state.step,
        "global_step": state.global_step,
        "ranks": ranks,
        "callbacks": {c.key: c.state_dict() for c in engine.callbacks if c.key},
        "plan": engine.loader.plan.to_dict(),
        "profiles": [p.to_dict() for p in profiles] if profiles else None,
        "config": config.to_dict(),
        "signature": dict(workload.signature),
        "devices": devices,
        "worlds": worlds or [{"ranks": comm.size, "from_step": 0}],
    }


def restore(checkpoint: dict[str, Any], engine: Engine) -> None:
    """Load a checkpoint into the engine: weights, optimizer, schedule, position; on the
    same world size also each rank's RNG stream, totals and interrupted epoch, on another
    the job's totals and interrupted epoch (its loss, samples, steps and seconds; each
    rank's time split starts afresh); and each callback's state, which the callback judges
    (the re-planner's memory holds only for the plan it was measured under)."""
    engine.model.load_state_dict(checkpoint["model"])
    engine.optimizer.load_state_dict(checkpoint["optimizer"])
    engine.scheduler.load_state_dict(checkpoint["scheduler"])
    state, comm = engine.state, engine.comm
    state.epoch, state.step = int(checkpoint["epoch"]), int(checkpoint["step"])
    state.global_step = int(checkpoint["global_step"])
    ranks = checkpoint.get("ranks") or []
    if len(ranks) == comm.size:  # same world: each rank continues its own streams
        mine = ranks[comm.rank]
        torch.set_rng_state(mine["rng"]["cpu"])
        if engine.device.type == "cuda" and "cuda" in mine["rng"]:
            torch.cuda.set_rng_state(mine["rng"]["cuda"], engine.device)
        state.totals = Totals.from_state(mine["totals"])
        if mine.get("record") is not None:
            record = dict(mine["record"])
            # Saved before busy steps were counted: every step of this world had samples.
            record.setdefault("own_steps", record["steps"] - record.get("carried_steps", 0))
            state.record = EpochRecord(**record)
    elif ranks:  # another world: the job's figures go on, each rank's time split starts here
        state.totals = Totals.from_state(ranks[0]["totals"]).job_wide()
        if ranks[0].get("record") is not None:
            state.record = EpochRecord(**ranks[0]["record"]).job_wide(
                batch_sizes=list(engine.loader.plan.batch_sizes),
                slowdown=engine.slowdown_at(state.epoch).factor,
            )
    saved = _upgraded(checkpoint)
    for callback in engine.callbacks:
        if callback.key in saved and saved[callback.key] is not None:
            callback.load_state_dict(saved[callback.key])
