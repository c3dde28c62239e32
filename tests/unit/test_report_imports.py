"""lbtrain.report's modules import in one direction: no circle, not even under TYPE_CHECKING.

The import graph is read from the source with `ast`, every import statement counted wherever
it stands (module level, `if TYPE_CHECKING:`, inside a function), so a circle that only the
type checker would walk is caught too.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Mapping, Set
from pathlib import Path

import pytest

import lbtrain.report

PACKAGE = "lbtrain.report"
FOLDER = Path(lbtrain.report.__file__).parent


def package_modules(folder: Path = FOLDER, package: str = PACKAGE) -> dict[str, Path]:
    """Module name -> source file, for the package itself and each module in its folder."""
    modules = {package: folder / "__init__.py"}
    for path in sorted(folder.glob("*.py")):
        if path.name != "__init__.py":
            modules[f"{package}.{path.stem}"] = path
    return modules


def imported_modules(source: str, module: str, package: str, known: Set[str]) -> set[str]:
    """The modules among `known` that `source` (the text of `module`) imports anywhere.

    `from P import name` counts as importing P.name when that is a known module, else P.
    Relative imports are resolved against `module`, which lives in `package`.
    """
    found: set[str] = set()
    is_package = module == package
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                # A package's own `from . import x` is relative to itself, a module's to its parent.
                base = parts[: len(parts) - node.level + (1 if is_package else 0)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for alias in node.names:
                child = f"{origin}.{alias.name}"
                found.add(child if child in known else origin)
    return {name for name in found if name in known and name != module}


def import_graph(folder: Path = FOLDER, package: str = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports."""
    modules = package_modules(folder, package)
    return {
        name: imported_modules(path.read_text(encoding="utf-8"), name, package, set(modules))
        for name, path in modules.items()
    }


def find_circle(graph: Mapping[str, Set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None when the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done, no circle through it
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                circle = visit(target)
                if circle is not None:
                    return circle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            circle = visit(start)
            if circle is not None:
                return circle
    return None


@pytest.mark.parametrize("module", sorted(package_modules()))
def test_every_report_module_imports_and_says_what_it_exports(module):
    imported = importlib.import_module(module)
    assert imported.__all__, module
    for name in imported.__all__:
        assert hasattr(imported, name), f"{module}.__all__ names {name}, which it lacks"


def test_the_report_package_has_no_import_circle():
    graph = import_graph()
    assert {"lbtrain.report.build", "lbtrain.report.format", "lbtrain.report.plot"} <= set(graph)
    assert find_circle(graph) is None, find_circle(graph)
    # The data knows nothing of its renderings; they read it.
    assert graph["lbtrain.report.build"] == set()
    assert graph["lbtrain.report.format"] == {"lbtrain.report.build"}
    assert graph["lbtrain.report.plot"] == {"lbtrain.report.build"}


def test_the_profiling_package_no_longer_holds_the_report():
    import lbtrain.profiling

    folder = Path(lbtrain.profiling.__file__).parent
    assert not list(folder.glob("report*.py"))
    assert not hasattr(lbtrain.profiling, "build_report")


def test_find_circle_finds_a_circle_and_only_a_circle():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond
    assert find_circle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert find_circle({"a": {"a"}}) == ["a", "a"]


def test_imports_under_type_checking_and_relative_ones_are_counted():
    known = {"p", "p.model", "p.format", "p.plot"}
    model = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from p.format import render\n"
    )
    assert imported_modules(model, "p.model", "p", known) == {"p.format"}
    plot = "from . import model\n\ndef f():\n    from .format import render\n"
    assert imported_modules(plot, "p.plot", "p", known) == {"p.model", "p.format"}
    # Through the package: `from p import X` imports p itself, whose __init__ imports them all.
    assert imported_modules("from p import BalanceReport\n", "p.model", "p", known) == {"p"}
    assert imported_modules("from .model import X\n", "p", "p", known) == {"p.model"}
    graph = {
        "p": {"p.model", "p.format"},
        "p.model": imported_modules(model, "p.model", "p", known),
        "p.format": {"p.model"},
    }
    assert find_circle(graph) == ["p.format", "p.model", "p.format"]


def test_the_check_fails_on_a_package_with_a_circle(tmp_path):
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "__init__.py").write_text("from fake.model import Report\n")
    (folder / "model.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake import plot\n"
    )
    (folder / "plot.py").write_text("from fake.model import Report\n")
    graph = import_graph(folder, "fake")
    assert graph == {
        "fake": {"fake.model"},
        "fake.model": {"fake.plot"},
        "fake.plot": {"fake.model"},
    }
    assert find_circle(graph) == ["fake.model", "fake.plot", "fake.model"]
