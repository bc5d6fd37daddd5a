"""Shared by the benchmarks: a real trace's events, and copies of them shifted in time."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: ids of copy i are offset by i times this, so links (flows, correlations) stay unique
ID_STRIDE = 10_000_000


def load_events(source: Path) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """(the document, its traceEvents emptied but in place; the events; the time one copy spans in
    us, plus 1 ms)."""
    raw = source.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    doc["traceEvents"] = []
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    doc.setdefault("distributedInfo", {"rank": 0, "world_size": 1})
    return doc, events, span


def shifted_copy(events: list[dict[str, Any]], i: int, span: float) -> Iterator[dict[str, Any]]:
    """Copy ``i`` of the events: ``i`` spans later, ids offset, timestamps to the nanosecond as
    Kineto writes them; metadata (``M``) events only in the first copy."""
    for e in events:
        if e.get("ph") == "M" and i:
            continue
        c = dict(e)
        if isinstance(c.get("ts"), (int, float)):
            c["ts"] = round(c["ts"] + i * span, 3)
        if c.get("ph") in ("s", "f") and isinstance(c.get("id"), int):
            c["id"] = c["id"] + i * ID_STRIDE
        if isinstance(c.get("args"), dict):
            a = dict(c["args"])
            for key in ("correlation", "External id", "external id"):
                if isinstance(a.get(key), int):
                    a[key] = a[key] + i * ID_STRIDE
            c["args"] = a
        yield c
