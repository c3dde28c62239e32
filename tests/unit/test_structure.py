"""lbtrain stays readable: no function over 60 lines, runnable modules that run main last, and
the call frames docs/design.md lists (issues 20, 39)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("function_lengths", REPO / "scripts" /
                                               "function_lengths.py")  # fmt: skip
function_lengths = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(function_lengths)  # type: ignore[union-attr]


def test_no_function_in_lbtrain_is_over_60_lines(tmp_path):
    # All of lbtrain/ (issue 39).
    checked = [REPO / "lbtrain"]
    assert function_lengths.long_functions(checked, 60) == []
    # The check can fail: a 61-line function is found.
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "long.py").write_text(f"def long():\n{body}")
    assert [name for _, name, _ in function_lengths.long_functions([tmp_path], 60)] == ["long"]


def _main_guard_not_last(path: Path) -> bool:
    """Whether `path` has an `if __name__ == "__main__":` block with statements after it."""
    import ast

    body = ast.parse(path.read_text(encoding="utf-8")).body
    guards = [i for i, node in enumerate(body) if isinstance(node, ast.If)
              and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"']  # fmt: skip
    return bool(guards) and guards[-1] != len(body) - 1


def test_a_runnable_module_runs_main_after_everything_it_defines(tmp_path):
    # `python -m lbtrain.cli.main train ...` (a module since gone) trained, then failed with
    # a NameError: main() ran from a guard above the helpers it calls at the end (issue 39).
    runnable = [p for d in ("lbtrain", "hyperspectral") for p in (REPO / d).rglob("*.py")]
    assert [str(p) for p in runnable if _main_guard_not_last(p)] == []
    early = tmp_path / "early.py"
    early.write_text('def main():\n    return later()\n\nif __name__ == "__main__":\n    main()\n'
                     "\ndef later():\n    return 0\n")  # fmt: skip
    assert _main_guard_not_last(early)


def _calls(path: Path, qualname: str) -> set[str]:
    """The names that function `qualname` (`f` or `Class.f`) of `path` calls."""
    import ast

    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    *owners, name = qualname.split(".")
    for owner in owners:
        scope = next(n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == owner)
    function = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    calls = [n.func for n in ast.walk(function) if isinstance(n, ast.Call)]
    return {ast.unparse(f) for f in calls} | {
        getattr(f, "attr", getattr(f, "id", "")) for f in calls
    }


def _frames() -> list[tuple[str, str]]:
    """(function, module) of each row of docs/design.md's call-frame table."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    table = text.split("### From `lbtrain train` to `optimizer.step()`")[1].split("\n\n")[2]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    return [(f.strip().strip("`"), m.strip().strip("`")) for f, m in rows]


def test_the_call_frames_design_md_lists_lead_from_the_verb_to_the_optimizer_step():
    # Issue 39: from `lbtrain train` to optimizer.step() in few frames, each in a module
    # whose name says what it does. The table must stay true: each frame calls the next.
    frames = _frames()
    verb = [f for f, m in frames].index("run")
    assert frames[verb][1] == "lbtrain/cli/train.py"
    assert len(frames) - verb - 1 <= 4, frames  # at most four frames below the verb's run
    assert "args.run" in _calls(REPO / frames[verb - 1][1], frames[verb - 1][0])  # dispatch
    for (function, module), (callee, _) in zip(frames, frames[1:], strict=False):
        if callee != "run":
            assert callee.split(".")[-1] in _calls(REPO / module, function), (function, callee)
    function, module = frames[-1]
    assert "self.optimizer.step" in _calls(REPO / module, function)
    # The check can fail: a frame that does not call the next one is found.
    assert "_step" not in _calls(REPO / "lbtrain/trainer/engine.py", "Engine.fit")
