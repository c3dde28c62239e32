"""Setups and checks of the bad-input sweep's cases (sweep_cases.py names them in its tables).

A setup prepares a case's fresh folder before the command runs; a check looks at the Run (what
the command did) and returns what is wrong with it, or None.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "profiles_3ranks.json"


@dataclass
class Run:
    """What one case did."""

    d: Path
    before: dict[str, tuple[int, int]]
    rc: int
    out: str
    err: str
    seconds: float
    hang: bool


Check = Callable[[Run], "str | None"]
Setup = Callable[[Path], None]


# ---- setups ------------------------------------------------------------------------------


def write(rel: str, data: str | bytes) -> Setup:
    """A setup writing one file (folders created)."""

    def setup(d: Path) -> None:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data.encode() if isinstance(data, str) else data)

    return setup


def mkdir(rel: str) -> Setup:
    """A setup making an empty folder."""
    return lambda d: (d / rel).mkdir(parents=True)


def profiles(mutate: Callable[[dict[str, Any]], object], rel: str = "p.json") -> Setup:
    """A setup writing the 3-rank fixture after `mutate` (NaN/inf as JSON's NaN/Infinity)."""

    def setup(d: Path) -> None:
        data = json.loads(FIXTURE.read_text())
        mutate(data)
        (d / rel).write_text(json.dumps(data, indent=1))

    return setup


def put(path: str, value: object) -> Callable[[dict[str, Any]], object]:
    """A mutation setting a dotted path (`profiles.0.alpha`); value DROP deletes it."""

    def mutate(data: Any) -> None:
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        for key in parents:
            data = data[key]
        if value is DROP:
            del data[last]
        else:
            data[last] = value

    return mutate


DROP = object()


def many_ranks(d: Path) -> None:
    """300 ranks: a report (about 100 kB) larger than a pipe's buffer."""
    data = json.loads(FIXTURE.read_text())
    data["profiles"] = [dict(data["profiles"][i % 3], rank=i) for i in range(300)]
    data["world_size"] = 300
    (d / "big.json").write_text(json.dumps(data))


def npz(rel: str, **arrays: Any) -> Setup:
    """A setup writing an .npz file (a split file, say)."""

    def setup(d: Path) -> None:
        import numpy as np

        np.savez(d / rel, **{k: np.asarray(v) for k, v in arrays.items()})

    return setup


def one_rank_profiles(d: Path) -> None:
    """Rank 0 of the fixture alone: a valid 1-rank file, but for workload patch-cnn."""
    data = json.loads(FIXTURE.read_text())
    data["profiles"], data["world_size"] = data["profiles"][:1], 1
    (d / "p.json").write_text(json.dumps(data))


def plan_file(d: Path) -> None:
    """A 1-rank plan for global batch 64."""
    from lbtrain.balancer import plan_batches

    (d / "plan.json").write_text(plan_batches([100.0], 64).to_json())


def garbage_mats(d: Path) -> None:
    """Pavia University's two .mat files, both junk."""
    for name in ("PaviaU.mat", "PaviaU_gt.mat"):
        write(f"e/{name}", b"\0junk")(d)


def readonly(d: Path) -> None:
    """A folder nobody but root may write in."""
    (d / "ro").mkdir()
    (d / "ro").chmod(0o500)


# ---- checks ------------------------------------------------------------------------------


def finite(value: Any) -> bool:
    """No NaN or infinity anywhere in a JSON value."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list):
        return all(finite(v) for v in value)
    return True


def json_ok(rel: str | None) -> Check:
    """The JSON file (None: stdout) exists, parses and holds no NaN or infinity."""

    def check(r: Run) -> str | None:
        if r.rc != 0:
            return None
        where = "stdout" if rel is None else rel
        try:
            data = json.loads(r.out if rel is None else (r.d / rel).read_text())
        except (OSError, ValueError) as exc:
            return f"{where}: no valid JSON ({type(exc).__name__})"
        return None if finite(data) else f"{where} holds NaN or infinity (silent wrong result)"

    return check


def exists(pattern: str) -> Check:
    """Something matching `pattern` was written."""
    return lambda r: None if any(r.d.glob(pattern)) else f"{pattern} not written"


def absent(pattern: str) -> Check:
    """Nothing matching `pattern` was written."""
    return lambda r: f"{pattern} written" if any(r.d.glob(pattern)) else None


def only_new(*allowed: str) -> Check:
    """On exit 0, nothing written in the working folder but `allowed` (top level)."""

    def check(r: Run) -> str | None:
        new = {p.name for p in r.d.iterdir()} - {k.split("/")[0] for k in r.before}
        extra = sorted(new - set(allowed))
        return f"wrote {', '.join(extra)} where not named" if r.rc == 0 and extra else None

    return check


def says(text: str) -> Check:
    """stderr (or stdout) mentions `text`."""
    return lambda r: None if text.lower() in (r.err + r.out).lower() else f"does not say {text!r}"


def never(text: str) -> Check:
    """Neither stream holds `text`."""
    return lambda r: f"printed {text!r}" if text in r.err + r.out else None


def status(*codes: int) -> Check:
    """The exit status is one of `codes`."""
    return lambda r: None if r.rc in codes else f"exit {r.rc}, expected {codes}"


def warned(r: Run) -> str | None:
    """On exit 0, a warning was printed."""
    return "exit 0 without a warning" if r.rc == 0 and "warning" not in r.err.lower() else None


def kept(rel: str, text: str) -> Check:
    """The file `rel` (the user's own) still holds `text`."""

    def check(r: Run) -> str | None:
        try:
            same = (r.d / rel).read_text() == text
        except OSError:
            same = False
        return None if same else f"{rel} not kept"

    return check


STOPPED = re.compile(
    r"stopped by a signal (in epoch \d+ after step \d+|after epoch \d+); "
    r"checkpoint \S+; continue with --resume \S+"
)


def stopped(r: Run) -> str | None:
    """A run stopped by a signal prints one line on stdout (where to resume), nothing on stderr."""
    if r.err.strip():
        return "stderr not empty"
    lines = [x.strip() for x in r.out.splitlines() if x.strip()]
    if len(lines) != 1 or not STOPPED.fullmatch(lines[0]):
        return "stdout is not the one `stopped by a signal ... --resume OUT` line"
    return None


def lbtrain_lines(line: str) -> Check:
    """stderr has one `lbtrain:` line, and it is `line`; lines from others (MPI's own Abort
    line) are not counted."""

    def check(r: Run) -> str | None:
        ours = [x.strip() for x in r.err.splitlines() if x.startswith("lbtrain:")]
        return None if ours == [line] else f"{len(ours)} lbtrain: lines, expected one {line!r}"

    return check
