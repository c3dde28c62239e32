"""The `lbtrain` console script: tune malloc, then run the command line.

Kept apart from `lbtrain.cli.main` because malloc must be tuned before torch is imported,
and importing `lbtrain.cli.main` imports torch (see lbtrain/malloc.py for why and by how
much: one HybridSN CPU step went from 0.95 s to 0.39 s).
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> int:
    """Run `lbtrain` with sys.argv."""
    from lbtrain.malloc import tune_malloc

    tune_malloc()
    from lbtrain.cli.main import main as run

    return run()
