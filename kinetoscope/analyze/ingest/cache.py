"""A columnar cache of parsed traces: Parquet tables + a JSON metadata file per trace, never pickle.

Opt-in (``kinetoscope analyze --cache`` or ``KINETOSCOPE_CACHE_DIR``, which the command reads: here, a folder is
given). The key is the file's resolved path, size and modification time plus the tool version, so a cached
trace is found with one ``stat`` and reopened at the speed of reading Parquet; a changed file or a new version misses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from kinetoscope import __version__
from kinetoscope.analyze.ingest.jobs import TraceFile
from kinetoscope.analyze.model.trace import RankTrace, TraceMeta
from kinetoscope.sources import version_of

TABLES = ("events", "memory", "counters", "flows", "instants", "steps", "run_steps", "comm_args", "marks", "shapes",
          "graph_captures", "launch_kernels")
#: the tables' layout: part of the key, so a cache written by an older layout is a miss, never misread
#: 9: the capture facts' run (steps_run, ended_by); 8: marks.evaluation; 7: run_steps without the capture's own steps,
#: capture_busy_ns
FORMAT = 9


def key_for(path: TraceFile, default_rank: int) -> str:
    """A local file by its resolved path, size and mtime; an object in a store by its URL, size and version."""
    size, version = version_of(path)
    where = path.resolve() if isinstance(path, Path) else path
    raw = f"{where}|{size}|{version}|{default_rank}|{__version__}|{FORMAT}"
    return hashlib.sha256(raw.encode()).hexdigest()[:40]


def _meta_to_json(meta: TraceMeta) -> dict[str, Any]:
    doc = dataclasses.asdict(meta)
    doc["thread_names"] = [[p, t, n] for (p, t), n in meta.thread_names.items()]
    doc["device_properties"] = list(meta.device_properties)
    doc["warnings"] = list(meta.warnings)
    return doc


def _meta_from_json(doc: dict[str, Any]) -> TraceMeta:
    doc = dict(doc)
    doc["thread_names"] = {(p, t): n for p, t, n in doc["thread_names"]}
    doc["device_properties"] = tuple(doc["device_properties"])
    doc["warnings"] = tuple(doc["warnings"])
    return TraceMeta(**doc)


def save(trace: RankTrace, key: str, root: Path) -> None:
    """Write the trace's tables and metadata under ``root/key`` (a directory renamed into place)."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / key
    if target.exists():
        return
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{key}."))
    try:
        dtypes: dict[str, dict[str, str]] = {}
        for name in TABLES:
            table = getattr(trace, name)
            if table is not None:
                table.to_parquet(tmp / f"{name}.parquet", index=False)
                dtypes[name] = {str(c): str(t) for c, t in table.dtypes.items()}
        doc = {"rank": trace.rank, "meta": _meta_to_json(trace.meta), "dtypes": dtypes}
        (tmp / "meta.json").write_text(json.dumps(doc, default=str))
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a full or read-only cache never fails the analysis
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load(key: str, root: Path) -> RankTrace | None:
    folder = root / key
    meta_file = folder / "meta.json"
    if not meta_file.is_file():
        return None
    try:
        doc = json.loads(meta_file.read_text())
        tables: dict[str, pd.DataFrame] = {}
        for name in TABLES:
            file = folder / f"{name}.parquet"
            if name not in doc["dtypes"]:
                tables[name] = None
                continue
            frame = pd.read_parquet(file)
            # Parquet keeps most dtypes; empty categoricals and object columns need the recorded ones back
            tables[name] = frame.astype({c: t for c, t in doc["dtypes"][name].items() if str(frame[c].dtype) != t})
        return RankTrace(rank=int(doc["rank"]), meta=_meta_from_json(doc["meta"]), **tables)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged cache entry is a miss, never an error
