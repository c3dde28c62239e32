"""Run folders read back: what `lbtrain show` and `lbtrain compare` print.

Pure Python (no torch): :func:`load_run` reads a folder `lbtrain train` wrote into a
:class:`Run`; :func:`format_run` writes one run as text, :func:`format_comparison` several
runs as one table, aligned text or markdown.
"""

from __future__ import annotations

from lbtrain.runs.compare import COMPARE_FORMATS, format_comparison
from lbtrain.runs.folder import RUN_MARKERS, Run, load_run
from lbtrain.runs.show import format_run

__all__ = ["COMPARE_FORMATS", "RUN_MARKERS", "Run", "format_comparison", "format_run", "load_run"]
