"""Cases of the bad-input sweep (scripts/sweep_bad_input.py runs them).

The Case type and what each expect code allows; the parsers that turn the tables of
sweep_cases_train, sweep_cases_report and sweep_cases_lib into cases, with the setups and
checks of sweep_cases_checks they name. all_cases() lists every case, in order.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep_cases_checks import (
    DROP,
    FIXTURE,
    Check,
    Setup,
    absent,
    exists,
    garbage_mats,
    json_ok,
    kept,
    lbtrain_lines,
    many_ranks,
    mkdir,
    never,
    npz,
    one_rank_profiles,
    only_new,
    plan_file,
    profiles,
    put,
    readonly,
    says,
    status,
    stopped,
    warned,
    write,
)
from sweep_cases_lib import LIB, LIB_END, LIB_PRELUDE
from sweep_cases_report import EDITS, PIPES, PROFILE, RAW, REPORT, REPORT_NOW
from sweep_cases_train import HS, MPI, TRAIN

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"
TIMEOUT = 120.0
DEADLINE = 9.0  # a refusal "before the work": imports only; profiling takes --time-budget 10
MPI_DEADLINE = 14.0
SUBST = {
    "@LB": f"{BIN}/lbtrain",
    "@PY": f"{BIN}/python",
    "@MPI": f"{BIN}/mpiexec",
    "@FX": str(FIXTURE),
}
SUBST["@LONG"] = "@D/" + "x" * 300  # one name past NAME_MAX (ENAMETOOLONG)
SHOWN = {"@LB": "lbtrain", "@PY": "python", "@MPI": "mpiexec", "@FX": "FIXTURE"}
SHOWN |= {"@LONG": "$TMP/x{300}", "@D": "$TMP"}
LAUNCHER_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_SIZE")
CATEGORIES = {
    "W": "wrong results with exit 0",
    "X": "values never cross-checked",
    "L": "failures after the expensive part",
    "H": "hangs",
    "R": "raw errors",
    "O": "outputs mixed or unnamed",
    "S": "signals and pipes",
    "T": "library types",
}
# expect code: (text, allowed outcomes, allowed exit statuses or None, refusal must be early)
EXPECT: dict[str, tuple[str, set[str], tuple[int, ...] | None, bool]] = {
    "early": ("refused before work (exit 2)", {"OK-REFUSED"}, (2,), True),
    "refuse": ("refused, one line (exit 2)", {"OK-REFUSED"}, (2,), False),
    "fail1": ("fails with one line", {"OK-REFUSED"}, None, False),
    "ok": ("exit 0 and correct", {"EXIT0"}, (0,), False),
    "clean": ("exit 0 or one-line refusal", {"EXIT0", "OK-REFUSED"}, None, False),
    "warn": ("refused, or exit 0 with a warning", {"EXIT0", "OK-REFUSED"}, None, False),
    "int": ("exit 130, one line", {"OK-REFUSED"}, (130,), False),
    # Ctrl-C under mpiexec: one `lbtrain:` line; MPI's own Abort line may follow it
    "int-mpi": ("exit 130, one lbtrain: line", {"OK-REFUSED", "MULTILINE"}, (130,), False),
    # a stopped run: its one line (where to resume) is on stdout, stderr stays empty
    "stop": ("exit 130, one stdout line", {"QUIET"}, (130,), False),
    "pipe": ("quiet exit 0 or 141", {"EXIT0", "QUIET"}, (0, 141), False),
}
REFUSALS = ("early", "refuse", "fail1")


@dataclass
class Case:
    """One bad (or baseline) input and what the issue expects of it."""

    id: str
    cat: str
    cmd: list[str]
    expect: str
    checks: tuple[Check, ...] = ()
    setup: Setup | None = None
    sigint: float | None = None
    skip: str | None = None
    text: str | None = None  # what to show instead of the command

    @property
    def shown(self) -> str:
        """The command as a user would type it ($TMP: the case's folder)."""
        words = []
        for arg in [self.text] if self.text else self.cmd:
            for key, text in SHOWN.items():
                arg = arg.replace(key, text)
            words.append(arg)
        return words[0] if self.text else shlex.join(words)

    @property
    def deadline(self) -> float:
        """Seconds within which an early refusal must come."""
        return MPI_DEADLINE if self.cmd[0] == "@MPI" else DEADLINE


def expand(arg: str, d: Path) -> str:
    """Replace the placeholders (@LB, @D, ...) in one argument."""
    for key, value in SUBST.items():
        arg = arg.replace(key, value)
    return arg.replace("@D", str(d))


def environment() -> dict[str, str]:
    """The environment of every case: one thread, no launcher, no display."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    return env | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


# ---- the cases ---------------------------------------------------------------------------

LB, PY, MPI2 = "@LB", "@PY", ["@MPI", "-n", "2"]
SMALL = ["--dataset", "synthetic", "--model", "hu", "--epochs", "1", "--global-batch", "32"]
SMALL += ["--threads", "1", "--time-budget", "10", "--quiet", "--no-map"]
PROF = [LB, "profile", "--threads", "1", "--time-budget", "10"]
BR = [LB, "balance-report", "--profiles", "@FX", "--global-batch", "64"]
BRP = [LB, "balance-report", "--threads", "1", "--time-budget", "10"]
BRT = [LB, "balance-report", "--profiles", "@D/p.json", "--global-batch", "64"]
SKIPS = {
    "root": "running as root: a read-only folder does not stop root" if os.geteuid() == 0 else None,
    "gpu": "a CUDA device is present" if shutil.which("nvidia-smi") else None,
}


def tr(*extra: str, out: str | None = "@D/run") -> list[str]:
    """A tiny `lbtrain train` (synthetic scene, hu, 1 epoch); --out $TMP/run unless given."""
    out_flag = ["--out", out] if out and "--out" not in extra else []
    return [LB, "train", "--workload", "hyperspectral", *SMALL, *extra, *out_flag]


def hs(*extra: str) -> list[str]:
    """The same run through `python -m hyperspectral train`."""
    return [PY, "-m", "hyperspectral", "train", *tr(*extra)[4:]]


def earlier_run(d: Path) -> None:
    """A finished 1-epoch run in $TMP/a, to resume."""
    cmd = [expand(a, d) for a in tr("--time-budget", "1", out="@D/a")]
    subprocess.run(cmd, cwd=d, env=environment(), capture_output=True, timeout=TIMEOUT, check=True)


SETUPS: dict[str, Setup] = {
    "f": write("f", "keep"),
    "o": write("o/keep.txt", "k"),
    "e": mkdir("e"),
    "ro": readonly,
    "mat": garbage_mats,
    "s": write("s.npz", "junk"),
    "s10": npz("s.npz", train=[0, 1], test=[2, 3], shape=[10, 10], meta="{}"),
    "sbig": npz("s.npz", train=[10**6], test=[2], shape=[48, 48], meta="{}"),
    "c": write("c.pt", "junk"),
    "a": earlier_run,
    "p{": write("p.json", "{"),
    "p1": one_rank_profiles,
    "plan": plan_file,
    "plan[]": write("plan.json", "[]"),
    "toml-bad": write("c.toml", "epochs = ["),
    "toml-key": write("c.toml", "bogus = 1\n"),
    "toml-type": write("c.toml", 'keep = "two"\n'),
    "toml-nan": write("c.toml", "lr = nan\n"),
    "toml-bytes": write("c.toml", b"lr = \xff\n"),
    "big": many_ranks,
    "notes": write("a/notes.txt", "my notes"),
}
CHECKS: dict[str, Check] = {
    "metrics": json_ok("run/metrics.json"),
    "o-metrics": json_ok("o/metrics.json"),
    "a-metrics": json_ok("a/metrics.json"),
    "notes": kept("a/notes.txt", "my notes"),
    "only-run": only_new("run"),
    "p-json": json_ok("p.json"),
    "only-p": only_new("p.json"),
    "only-none": only_new(),
    "only-r": only_new("r.png"),
    "r-png": exists("r.png"),
    "runs": exists("runs/*/metrics.json"),
    "profiles": exists("profiles.json"),
    "stdout-json": json_ok(None),
    "nan-text": lambda r: (
        "printed nan" if r.rc == 0 and re.search(r"\bnan\b", r.out, re.I) else None
    ),
    "warned": warned,
    "no-p": absent("p.json"),
    "ckpt": exists("run/checkpoints/*"),
    "stopped": stopped,
    "one-interrupted": lbtrain_lines("lbtrain: interrupted"),
    "141": status(141),
    "no-broken": never("Broken pipe"),
    "no-ignored": never("Exception ignored"),
}


def table(base: Callable[..., list[str]], text: str) -> list[Case]:
    """Cases from lines `id category expect word...`; a word is an argument of base(...), or
    +SETUP, !CHECK, ?TEXT (the output says it), ~SECONDS (Ctrl-C then), %SKIP."""
    cases = []
    for line in re.split(r"\n(?=\S)", text.strip()):  # an indented line continues
        cid, cat, expect, *words = shlex.split(line)
        tagged: dict[str, list[str]] = {tag: [] for tag in "+!?~%"}
        args = [w for w in words if w[:1] not in tagged or tagged[w[0]].append(w[1:])]
        setups = [SETUPS[name] for name in tagged["+"]]
        checks = [CHECKS[name] for name in tagged["!"]] + [says(text) for text in tagged["?"]]
        sigint = float(tagged["~"][0]) if tagged["~"] else None
        skip = SKIPS[tagged["%"][0]] if tagged["%"] else None
        setup = (lambda d, s=tuple(setups): [f(d) for f in s] and None) if setups else None
        cases.append(Case(cid, cat, base(*args), expect, tuple(checks), setup, sigint, skip))
    return cases


TEXT = FIXTURE.read_text()
RAW_FILES = {  # balance-report on these bytes as p.json
    "br-profiles-empty": ("refuse", b""),
    "br-profiles-truncated": ("refuse", TEXT[:300].encode()),
    "br-profiles-not-utf8": ("refuse", b"\xff\xfe{\x00"),
    "br-profiles-latin1-host": ("clean", TEXT.replace("node-a", "n\xe9ud").encode("latin-1")),
    "br-profiles-list": ("refuse", b"[]"),
    "br-profiles-null": ("refuse", b"null"),
    "br-profiles-deep": ("refuse", b"[" * 100000),
}


def lib_cases() -> list[Case]:
    """The LIB table: each body runs as main() of a `python -c` script."""
    cases = []
    for entry in re.split(r"\n(?=\S)", LIB.strip()):
        head, body = entry.split(" :: ", 1)
        cid, expect, *words = shlex.split(head)
        body = "\n".join(x.strip() for x in body.replace("; ", "\n").splitlines())
        code = LIB_PRELUDE + textwrap.indent(body, "    ") + "\n" + LIB_END
        checks = tuple(says(w[1:]) for w in words)
        shown = "python -c " + shlex.quote(body.replace("\n", "; "))
        cases.append(Case(cid, "T", [PY, "-c", code], expect, checks, text=shown))
    return cases


def edit_cases() -> list[Case]:
    """The EDITS table and RAW_FILES: balance-report on a broken $TMP/p.json."""
    cases = []
    for line in EDITS.strip().splitlines():
        cid, rest = line.split(None, 1)
        if rest.startswith("del "):
            mutate = put(rest[4:], DROP)
        else:
            path, value = rest.split(" = ", 1)
            mutate = put(path, json.loads(value))
        cases.append(C(cid, "X", BRT, "refuse", says("p.json"), setup=profiles(mutate)))
    for cid, (expect, data) in RAW_FILES.items():
        cases.append(C(cid, "X", BRT, expect, setup=write("p.json", data)))
    return cases


def C(cid: str, cat: str, cmd: list[str], expect: str, *checks: Check, **kw: Any) -> Case:
    """Shorthand for Case."""
    return Case(cid, cat, cmd, expect, checks, **kw)


def all_cases() -> list[Case]:
    """Every case of the sweep, in the order it runs them."""
    return [
        *table(tr, TRAIN),
        C("train-default-out", "O", tr("--time-budget", "1", out=None), "ok", CHECKS["runs"]),
        *table(hs, HS),
        *table(lambda *a: [*MPI2, *tr(*a)], MPI),
        *table(lambda *a: [*PROF, *a], PROFILE),
        *table(lambda *a: [*BR, *a], REPORT),
        *table(lambda *a: [*BRP, *a], REPORT_NOW),
        *edit_cases(),
        *table(lambda *a: list(a), RAW),
        *table(lambda *a: ["bash", "-o", "pipefail", "-c", " ".join(a)], PIPES),
        *lib_cases(),
    ]
