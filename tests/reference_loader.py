"""A deliberately plain reference loader: stdlib json, Decimal arithmetic, one event at a time.

It is slow and independent of the fast path (no msgspec, no numpy), so it can check it.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

ALIASES = {"Kernel": "kernel", "Runtime": "cuda_runtime", "Driver": "cuda_driver", "Operator": "cpu_op",
           "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Python": "python_function", "Trace": "trace"}
#: events on a GPU track: work, annotations and sync markers all carry their device and stream
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            try:
                return int(float(value))
            except ValueError:
                return None
    return int(value)


def reference_events(path: Path) -> list[tuple]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw, parse_float=Decimal, parse_int=Decimal)
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    rows = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "ts" not in e:
            continue
        ts_ns = int((Decimal(str(e["ts"])) * 1000).to_integral_value())
        dur_ns = max(0, int((Decimal(str(e.get("dur", 0))) * 1000).to_integral_value()))
        cat = ALIASES.get(e.get("cat") or "", (e.get("cat") or "").lower())
        args = e.get("args") or {}
        device = stream = None
        if cat in GPU_CATS:
            device = _int(args.get("device", e.get("pid")))
            stream = _int(args.get("stream"))
            if stream is None:
                tid = str(e.get("tid"))
                digits = tid.split()[-1] if tid.split() else ""
                stream = int(digits) if digits.isdigit() else None
        rows.append((ts_ns, dur_ns, str(e.get("name", "")), cat, device, stream, _int(args.get("correlation"))))
    return sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3]))
