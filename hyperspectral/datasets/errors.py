"""The one exception type raised for every data problem a user can fix."""

from __future__ import annotations

__all__ = ["DatasetError"]


class DatasetError(ValueError):
    """A scene file is missing, unreadable or inconsistent; the message says how to fix it."""
