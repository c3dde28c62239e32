"""Hyperspectral land-cover classification: scenes, splits, models, metrics and maps.

The application lbtrain trains, as the workload ``hyperspectral``
(:mod:`hyperspectral.workload`): see ``lbtrain train --workload hyperspectral --help``.
``python -m hyperspectral`` is an alias of that command (:mod:`hyperspectral.cli`).
"""

from __future__ import annotations

__all__ = ["datasets", "models"]
