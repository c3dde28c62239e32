"""List functions longer than a limit (default 60 lines) in the given files or folders.

Usage: python scripts/function_lengths.py lbtrain/trainer [--limit 60]
Exits 1 when any is over, so it can guard a folder in the test run.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def long_functions(paths: list[Path], limit: int) -> list[tuple[str, str, int]]:
    """(file, qualified name, lines) of every function over `limit` lines."""
    found = []
    files = [f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]
    for file in files:
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append((str(file), node.name, length))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--limit", type=int, default=60)
    args = parser.parse_args()
    found = long_functions(args.paths, args.limit)
    for file, name, length in found:
        print(f"{file}: {name} has {length} lines (limit {args.limit})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
