"""The trainer stays readable: no function in lbtrain/trainer/ over 60 lines (issue 20)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("function_lengths", REPO / "scripts" /
                                               "function_lengths.py")  # fmt: skip
function_lengths = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(function_lengths)  # type: ignore[union-attr]


def test_no_function_in_the_trainer_is_over_60_lines(tmp_path):
    assert function_lengths.long_functions([REPO / "lbtrain" / "trainer"], 60) == []
    # The check can fail: a 61-line function is found.
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "long.py").write_text(f"def long():\n{body}")
    assert [name for _, name, _ in function_lengths.long_functions([tmp_path], 60)] == ["long"]
