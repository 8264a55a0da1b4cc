"""Argument checks shared by the packages: one ValueError wording everywhere."""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an integer (not a bool) >= ``minimum``; else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value
