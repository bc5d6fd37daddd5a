"""Capture artifacts: gzipped traces written atomically, a manifest, step timings.

The artifact is a contract with ``kinetoscope.analyze``: per rank,
``rank-<r>.step-<a>-<b>.pt.trace.json.gz`` (Kineto JSON, gzip) and
``rank-<r>.manifest.json``; always-on step timings in ``rank-<r>.steps.json``.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import msgspec

from kinetoscope.fsutil import atomic_write

MANIFEST_VERSION = 1


def trace_name(rank: int, first_step: int, last_step: int) -> str:
    return f"rank-{rank}.step-{first_step}-{last_step}.pt.trace.json.gz"


def finish_trace(raw_path: Path, final_path: Path, *, extra_events: list[dict[str, Any]],
                 distributed_info: dict[str, Any] | None) -> None:
    """Add telemetry counters and missing distributedInfo to a raw export, gzip it, rename atomically."""
    data = raw_path.read_bytes()
    if extra_events or distributed_info:
        doc = msgspec.json.decode(data)
        if isinstance(doc, dict):
            doc.setdefault("traceEvents", []).extend(extra_events)
            if distributed_info and "distributedInfo" not in doc:
                doc["distributedInfo"] = distributed_info
            data = msgspec.json.encode(doc)
    atomic_write(final_path, gzip.compress(data, compresslevel=3))
    raw_path.unlink(missing_ok=True)


def base_time_ns(raw_path: Path) -> int | None:
    """``baseTimeNanoseconds`` from a raw export: Kineto writes it among the metadata at the start
    (older versions at the end), so both ends are searched; the events in between are never read."""
    key = '"baseTimeNanoseconds":'
    with open(raw_path, "rb") as fh:
        head = fh.read(65536).decode("utf-8", "replace")
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 65536))
        tail = fh.read().decode("utf-8", "replace")
    for text in (head, tail):
        at = text.find(key)
        if at >= 0:
            digits = ""
            for ch in text[at + len(key):at + len(key) + 40].lstrip():
                if not ch.isdigit():
                    break
                digits += ch
            if digits:
                return int(digits)
    return None


def versions() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["hip"] = getattr(torch.version, "hip", None)
        info["cuda_available"] = bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        pass
    from kinetoscope import __version__

    info["kinetoscope"] = __version__
    return info


def write_manifest(out_dir: Path, rank: int, payload: dict[str, Any]) -> Path:
    doc = {
        "manifest_version": MANIFEST_VERSION,
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "versions": versions(),
        **payload,
    }
    path = out_dir / f"rank-{rank}.manifest.json"
    atomic_write(path, json.dumps(doc, indent=2, default=str).encode())
    return path


def write_step_times(out_dir: Path, rank: int, payload: dict[str, Any]) -> Path:
    path = out_dir / f"rank-{rank}.steps.json"
    atomic_write(path, msgspec.json.encode(payload))
    return path
