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


def frac(part: Any, whole: Any) -> float | None:
    """``part / whole``, never clamped (a fraction outside [0, 1] is a bug the report's checks count);
    None when either is unknown or the whole is empty."""
    if part is None or whole is None or not whole:
        return None
    value = float(part) / float(whole)
    return None if math.isnan(value) else value
