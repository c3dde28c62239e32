"""The `lbtrain` console script: tune malloc, then run the command line.

Kept apart from `lbtrain.cli.main` because malloc must be tuned before torch is imported,
and importing `lbtrain.cli.main` imports torch (see lbtrain/malloc.py for why and by how
much: one HybridSN CPU step went from 0.95 s to 0.39 s).
"""

from __future__ import annotations

import sys

from lbtrain.cli.launcher import launcher_rank

__all__ = ["main"]


def main() -> int:
    """Run `lbtrain` with sys.argv; Ctrl-C while it starts up is one line and status 130."""
    try:
        from lbtrain.malloc import tune_malloc

        tune_malloc()
        from lbtrain.cli.main import main as run

        return run()
    except KeyboardInterrupt:
        # Importing torch takes seconds, and parsing happens before any run: a Ctrl-C there
        # would otherwise be a long traceback. (A run catches its own, and stops every rank.)
        # Under mpiexec every rank gets it; the first says it.
        if launcher_rank() == 0:
            print("lbtrain: interrupted", file=sys.stderr, flush=True)
        return 130
