"""The stable JSON report."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from kinetoscope.analyze.report.builder import Report


def _plain(value: Any) -> Any:
    """numpy/pandas scalars to JSON types; NaN becomes null."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    try:
        import pandas as pd

        if value is pd.NA:
            return None
    except ImportError:  # pragma: no cover
        pass
    return str(value)


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return _plain(obj)


def report_to_json(report: Report, *, indent: int | None = None) -> str:
    data = _clean(report.to_dict())
    raw = msgspec.json.encode(data)
    if indent:
        raw = msgspec.json.format(raw, indent=indent)
    return raw.decode()
