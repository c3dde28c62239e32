"""Hyperspectral land-cover classification: scenes, splits, models, metrics and maps.

The application lbtrain runs; it works on its own in one process
(``python -m hyperspectral train --help``).
"""

from __future__ import annotations

__all__ = ["datasets", "models"]
