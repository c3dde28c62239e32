"""The balance report: a what-if over plans, not a measurement.

Given replica profiles and a global batch, it plans the batch under each policy and shows
what each would buy. The modules import in one direction only: `build` (the report's data)
knows nothing of `format` (text, markdown, JSON) or `plot` (matplotlib), which both read it.
"""

from lbtrain.report.build import BalanceReport, PolicyResult, build_report, rank_rows
from lbtrain.report.format import FORMATS, format_report
from lbtrain.report.plot import plot_report, require_matplotlib

__all__ = [
    "FORMATS",
    "BalanceReport",
    "PolicyResult",
    "build_report",
    "format_report",
    "plot_report",
    "rank_rows",
    "require_matplotlib",
]
