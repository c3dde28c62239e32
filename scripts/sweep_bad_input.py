"""Bad-input sweep (issue 11): try what a new user would mistype, one case at a time.

Every case runs in a fresh temporary folder (also its working directory) as a subprocess
with a time limit, and is classified: HANG (time limit), TRACEBACK, OK-REFUSED (non-zero
exit with one `error:` line, or argparse's usage + error), MULTILINE (any other non-zero
exit with output), QUIET (non-zero exit, nothing on stderr), EXIT0. Each case says what the
issue expects; per-case checks add what the outcome alone cannot show (nothing written on a
refusal, no NaN in the metrics, a refusal before the expensive work, ...).

    .venv/bin/python scripts/sweep_bad_input.py [--only SUB] [--list] [--jobs N] [--markdown FILE]

--only runs the cases whose id contains SUB, --list lists them (nothing runs), --jobs runs N
at once, --markdown also writes the results as a Markdown table. The cases are defined in
sweep_cases.py (with its tables in sweep_cases_train/report/lib.py and its setups and checks
in sweep_cases_checks.py); this module runs, classifies and judges them.

Exit status 1 when any case hangs, shows a traceback or a multi-line error, or is not as
expected.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_cases import (  # noqa: E402  (after the path insert)
    CATEGORIES,
    EXPECT,
    REFUSALS,
    TIMEOUT,
    Case,
    all_cases,
    environment,
    expand,
)
from sweep_cases_checks import Run  # noqa: E402

ONE_LINE = re.compile(r"^(lbtrain: (error: |interrupted)|error: |[\w.-]+( \w+)?: error: )")


def snapshot(d: Path) -> dict[str, tuple[int, int]]:
    """Every path under d with its size and modification time."""
    return {str(p.relative_to(d)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in d.rglob("*")}


def classify(r: Run) -> str:
    """HANG, TRACEBACK, EXIT0, QUIET, OK-REFUSED or MULTILINE."""
    if r.hang:
        return "HANG"
    if "Traceback" in r.err:
        return "TRACEBACK"
    if r.rc == 0:
        return "EXIT0"
    lines = [x for x in r.err.splitlines() if x.strip() and not x.startswith("lbtrain: warning:")]
    if not lines:
        return "QUIET"
    errors = [x for x in lines if ONE_LINE.match(x)]
    if (
        lines[0].startswith("usage:")
        and len(errors) <= 1
        and (not errors or errors[0] == lines[-1])
    ):
        return "OK-REFUSED"  # argparse: usage, then one error line (or the help text alone)
    return "OK-REFUSED" if len(lines) == 1 and errors else "MULTILINE"


def execute(case: Case) -> tuple[Run | None, str, list[str]]:
    """Run one case in a fresh folder; return the run, its outcome and what was unexpected."""
    with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
        d = Path(tmp)
        try:
            if case.setup:
                case.setup(d)
        except Exception as exc:  # a broken setup is reported, not raised
            return None, "SETUP-ERROR", [f"setup failed: {type(exc).__name__}: {exc}"]
        before = snapshot(d)
        start = time.monotonic()
        proc = subprocess.Popen(
            [expand(a, d) for a in case.cmd],
            cwd=d, env=environment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
        hang = False
        try:
            if case.sigint is not None:
                try:
                    proc.wait(timeout=case.sigint)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does
            out, err = proc.communicate(timeout=max(1.0, TIMEOUT - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            hang = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
        run = Run(d, before, proc.returncode, out, err, time.monotonic() - start, hang)
        outcome = classify(run)
        return run, outcome, judge(case, run, outcome)


def judge(case: Case, r: Run, outcome: str) -> list[str]:
    """Everything about the run that is not what the case expects."""
    text, allowed, codes, early = EXPECT[case.expect]
    problems = []
    if outcome not in allowed:
        problems.append(f"expected {text}")
    elif codes is not None and r.rc not in codes:
        problems.append(f"exit status {r.rc}, expected {'/'.join(map(str, codes))}")
    if outcome == "OK-REFUSED" and early and r.seconds > case.deadline:
        problems.append(f"refused after {r.seconds:.1f} s (> {case.deadline:g} s): after the work")
    if case.expect in REFUSALS and r.rc != 0 and not r.hang:
        changed = sorted(k for k, v in snapshot(r.d).items() if r.before.get(k) != v)
        if changed:
            problems.append(f"refused but wrote {', '.join(changed[:3])}")
    problems += [p for p in (check(r) for check in case.checks) if p]
    return problems


def first_lines(text: str, n: int = 3, width: int = 160) -> list[str]:
    """The first n non-empty lines, shortened."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return [x if len(x) <= width else x[: width - 3] + "..." for x in lines[:n]]


def markdown(rows: list[tuple[Case, str, float, list[str], str]], path: Path) -> None:
    """Write the results as a Markdown table."""
    out = [
        "| id | category | expected | outcome | s | first stderr line |",
        "|---|---|---|---|---|---|",
    ]
    for case, outcome, seconds, problems, line in rows:
        verdict = outcome + ("" if not problems else " **(" + "; ".join(problems) + ")**")
        cells = [case.id, CATEGORIES[case.cat], EXPECT[case.expect][0], verdict, f"{seconds:.1f}"]
        cells.append(f"`{line[:120]}`" if line else "")
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    path.write_text("\n".join(out) + "\n")


def main() -> int:
    """Run the sweep (or list it)."""
    # A background job of a non-interactive shell starts with SIGINT ignored, and children
    # inherit that, so the Ctrl-C cases could not work; with a handler here they start with
    # the default disposition, as from a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", metavar="SUBSTRING", help="run the cases whose id contains it")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--jobs", type=int, default=1, help="cases at once (default: 1)")
    parser.add_argument("--markdown", metavar="FILE", type=Path, help="also write a table here")
    args = parser.parse_args()
    every = all_cases()
    assert len({c.id for c in every}) == len(every), "duplicate case ids"
    cases = [c for c in every if args.only is None or args.only in c.id]
    if args.list:
        for c in cases:
            print(f"{c.id:32} {CATEGORIES[c.cat]:34} {EXPECT[c.expect][0]:30} {c.shown[:200]}")
        return 0
    todo = [c for c in cases if not c.skip]
    for c in cases:
        if c.skip:
            print(f"SKIP {c.id}: {c.skip}")
    rows, bad = [], []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = zip(todo, pool.map(execute, todo), strict=True)
        for i, (case, (run, outcome, problems)) in enumerate(results, 1):
            errs = first_lines(run.err if run else "")
            rows.append((case, outcome, run.seconds if run else 0.0, problems, "".join(errs[:1])))
            mark = "ok" if not problems else "UNEXPECTED: " + "; ".join(problems)
            rc = f"rc={run.rc}" if run else ""
            print(
                f"[{i:3}/{len(todo)}] {case.id:28} {outcome:10} {rc:7} {rows[-1][2]:5.1f}s {mark}"
            )
            if problems:
                bad.append((case, run, outcome, problems))
    counts = Counter(row[1] for row in rows)
    print("\nsummary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{len(rows) - len(bad)} as expected, {len(bad)} not, {len(cases) - len(todo)} skipped")
    for case, run, outcome, problems in bad:
        print(f"\n- {case.id} [{CATEGORIES[case.cat]}] {outcome}: {'; '.join(problems)}")
        print(f"  $ {case.shown[:400]}")
        for line in first_lines(run.err if run else "", 4) or ["(stderr empty)"]:
            print(f"  | {line}")
        if run and not run.err.strip() and run.out.strip():
            print(f"  stdout: {first_lines(run.out[-2000:], 99)[-1]}")
    if args.markdown:
        markdown(rows, args.markdown)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
