"""Unit conversion at the report edge: internal ns -> reported us."""

from __future__ import annotations

import math
from typing import Any


def us(ns: Any) -> float | None:
    """Nanoseconds to microseconds, rounded to the ns; None stays None."""
    if ns is None:
        return None
    value = float(ns)
    if math.isnan(value):
        return None
    return round(value / 1000.0, 3)


def frac(part: float, whole: float) -> float | None:
    """A fraction clamped to [0, 1]; None when the whole is empty."""
    if not whole:
        return None
    return min(max(float(part) / float(whole), 0.0), 1.0)
