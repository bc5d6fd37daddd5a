"""The batch results store: Parquet files written once each, atomically, safe with many writers; compacted.

Layout (query with DuckDB: ``SELECT * FROM read_parquet('STORE/traces/*.parquet')``)::

    STORE/store.json          what this is, and the tool version that created it
    STORE/traces/<key>.parquet    one row per input file (status ok | failed)
    STORE/findings/<key>.parquet  one row per finding of that file; job-<key>.parquet for cross-rank ones
    STORE/steps/<key>.parquet     one row per profiled step of that file
    STORE/summaries/<key>.parquet what the job-level analysis needs from that file (collectives, step parts)
    STORE/job_ranks/job-<key>.parquet  per rank of a multi-rank job: clock skew, collective wait, times waited for,
                                       the rank it waited for, straggler and cause
    STORE/jobs/job-<key>.parquet       per multi-rank job: matched collectives, the straggler and its cause, the
                                       most waited-for rank, the largest clock skew
    STORE/hangs/job-<key>.parquet      per job with hang dumps (rank-<r>.hang.json): where it stopped (process group,
                                       sequence number, op), the stuck, missing, mismatched and waiting ranks, why
    STORE/<table>/part-<ns>-<id>.parquet  many of the files above in one (kinetoscope/batch/compact.py, at the end
                                          of every batch and every few files of a watch, in a folder or a bucket):
                                          DuckDB opens a few files, not 4 per rank
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from kinetoscope import __version__
from kinetoscope.errors import TraceSourceError
from kinetoscope.fsutil import atomic_target, atomic_write
from kinetoscope.sources import RemotePath, remote_stat, trace_path

STORE_KIND = "kinetoscope-store"
TABLES = ("traces", "findings", "steps", "summaries", "job_ranks", "jobs", "hangs")

SCHEMAS: dict[str, pa.Schema] = {
    "traces": pa.schema([
        ("key", pa.string()), ("job", pa.string()), ("path", pa.string()), ("rank", pa.int64()),
        ("status", pa.string()), ("error", pa.string()), ("size_bytes", pa.int64()), ("events", pa.int64()),
        ("parse_s", pa.float64()), ("analyze_s", pa.float64()), ("content_sha256", pa.string()),
        ("tool_version", pa.string()), ("window_us", pa.float64()), ("steps", pa.int64()),
        ("mean_step_us", pa.float64()), ("gpu_idle_fraction", pa.float64()), ("loader_fraction", pa.float64()),
        ("loader_gpu_idle_cost_us", pa.float64()), ("h2d_overlap_fraction", pa.float64()),
        ("h2d_pageable_fraction", pa.float64()), ("memory_growth_bytes_per_step", pa.float64()),
        ("peak_allocated_bytes", pa.float64()), ("collective_us", pa.float64()), ("loader_us", pa.float64()),
        ("findings", pa.int64()), ("critical", pa.int64()), ("warnings", pa.int64()),
        ("replay_step_us", pa.float64()), ("replay_error", pa.float64()),
        # the job's size as the trace states it (distributedInfo); null where it does not (and in older stores)
        ("world_size", pa.int64()),
    ]),
    "findings": pa.schema([
        ("key", pa.string()), ("job", pa.string()), ("path", pa.string()), ("rank", pa.int64()), ("id", pa.string()),
        ("severity", pa.string()), ("title", pa.string()), ("impact_us", pa.float64()), ("evidence_json", pa.string()),
        # what fixing it alone is worth to its rank (whatif.estimate); null where not estimated (older stores too)
        ("saving_us_per_step", pa.float64()), ("step_us_after", pa.float64()), ("estimate_json", pa.string()),
    ]),
    "steps": pa.schema([
        ("key", pa.string()), ("job", pa.string()), ("path", pa.string()), ("rank", pa.int64()), ("step", pa.int64()),
        ("dur_us", pa.float64()), ("loader_us", pa.float64()), ("gpu_idle_us", pa.float64()),
    ]),
    "summaries": pa.schema([
        ("key", pa.string()), ("job", pa.string()), ("path", pa.string()), ("rank", pa.int64()),
        ("summary_json", pa.string()),
    ]),
    "job_ranks": pa.schema([
        ("key", pa.string()), ("job", pa.string()), ("rank", pa.int64()), ("clock_skew_us", pa.float64()),
        ("wait_us", pa.float64()), ("waited_for_count", pa.int64()), ("matched", pa.int64()),
        ("unmatched", pa.int64()), ("straggler", pa.bool_()), ("straggler_cause", pa.string()),
        # the rank this one waited for most often (null when it never waited; older stores: null)
        ("waited_for_rank", pa.int64()),
        # the other ranks' waits, summed, at the collectives this one arrived last at (older stores: null)
        ("waited_for_us", pa.float64()),
    ]),
    # one row per multi-rank job: what the reduce over its ranks' summaries found
    "jobs": pa.schema([
        ("key", pa.string()), ("job", pa.string()), ("ranks", pa.int64()), ("ranks_with_collectives", pa.int64()),
        ("matched", pa.int64()), ("unmatched", pa.int64()), ("reference_rank", pa.int64()),
        ("most_waited_for_rank", pa.int64()), ("straggler_rank", pa.int64()), ("straggler_cause", pa.string()),
        ("straggler_wait_us_per_step", pa.float64()), ("max_abs_clock_skew_us", pa.float64()),
        ("reduce_s", pa.float64()),
    ]),
    # one row per job with hang dumps: the hang analyzer's diagnosis (status failed: the dumps could not be read)
    "hangs": pa.schema([
        ("key", pa.string()), ("job", pa.string()), ("status", pa.string()), ("error", pa.string()),
        ("dumps", pa.int64()), ("hung", pa.bool_()), ("process_group", pa.string()), ("seq", pa.int64()),
        ("op", pa.string()), ("stuck_ranks", pa.list_(pa.int64())), ("missing_ranks", pa.list_(pa.int64())),
        ("mismatched_ranks", pa.list_(pa.int64())), ("waiting_ranks", pa.list_(pa.int64())),
        ("ranks_without_dump", pa.list_(pa.int64())), ("cause", pa.string()),
    ]),
}


#: where a store lives: a local folder, or a prefix in an object store (``kinetoscope.sources``)
StoreRoot = Path | RemotePath


def _arrow(path: StoreRoot) -> tuple[str, Any]:
    """(path, filesystem) as pyarrow takes them: a local path with its own, a store's key with its fsspec one."""
    return path.arrow() if isinstance(path, RemotePath) else (str(path), None)


def open_store(path: str | os.PathLike[str] | StoreRoot, *, create: bool = False) -> StoreRoot:
    """The store at ``path`` (a folder or a URL), checked; with ``create``, made where nothing is."""
    root = trace_path(path)
    try:
        return _open_store(root, create)
    except OSError as exc:  # an object store's answer (no such bucket, access denied, unreachable)
        raise TraceSourceError(f"{root}: cannot open the store ({exc.strerror or exc})") from None


def _open_store(root: StoreRoot, create: bool) -> StoreRoot:
    marker = root / "store.json"
    if marker.is_file():
        try:
            kind = json.loads(marker.read_bytes()).get("kind")
        except (OSError, ValueError):
            kind = None
        if kind != STORE_KIND:
            raise TraceSourceError(f"{root}: store.json is not a Kinetoscope store")
    elif create:
        if root.exists() and any(root.iterdir()):
            raise TraceSourceError(f"{root}: exists and is not a Kinetoscope store (refusing to write into it)")
        root.mkdir(parents=True, exist_ok=True)
        doc = json.dumps({"kind": STORE_KIND, "created_by": __version__}).encode()
        if isinstance(marker, RemotePath):
            marker.write_bytes(doc)
        else:
            atomic_write(marker, doc)
    else:
        raise TraceSourceError(f"{root}: not a Kinetoscope store (no store.json)")
    for table in TABLES:
        (root / table).mkdir(exist_ok=True)
    return root


def is_store(path: str | os.PathLike[str]) -> bool:
    try:
        open_store(path)
    except TraceSourceError:
        return False
    return True


def store_version(root: str | os.PathLike[str] | StoreRoot) -> str:
    """A cheap stamp of what the store's ``traces`` table holds, changed by every row written: the folder's mtime
    locally (a row lands by a rename), one listing's names and ETags in an object store. ``""`` where unreadable."""
    folder = trace_path(root) / "traces"
    try:
        if isinstance(folder, RemotePath):
            listed = folder.listing()
            # each object's version as its store names it (S3's ETag, GCS's etag or generation, Azure's etag)
            return hashlib.sha256("\n".join(f"{p.name}|{remote_stat(info).version}"
                                             for p, info in listed).encode()).hexdigest()
        return str(folder.stat().st_mtime_ns)
    except OSError:
        return ""


def write_rows(root: StoreRoot, table: str, name: str, rows: list[dict[str, Any]]) -> None:
    """Write one Parquet file of rows (to a temporary name, then renamed: never half a file; in an object store
    one upload, which readers see whole or not at all)."""
    arrow = pa.Table.from_pylist(rows, schema=SCHEMAS[table])
    target = root / table / f"{name}.parquet"
    if isinstance(target, RemotePath):
        key, fs = target.arrow()
        pq.write_table(arrow, key, filesystem=fs)
        return
    with atomic_target(target) as tmp:
        pq.write_table(arrow, tmp)


def read_rows(root: StoreRoot, table: str, name: str) -> list[dict[str, Any]] | None:
    """The rows of key ``name``: its single file's, or (compacted) the newest part's that holds it."""
    path = root / table / f"{name}.parquet"
    if path.is_file():
        where, fs = _arrow(path)
        try:
            return pq.read_table(where, schema=SCHEMAS[table], filesystem=fs).to_pylist()
        except FileNotFoundError:  # merged into a part by a compaction since it was seen
            pass
    from kinetoscope.batch.compact import rows_in_parts

    return rows_in_parts(root / table, name, SCHEMAS[table])  # compacted (None: no rows of that key anywhere)


def read_table(root: str | os.PathLike[str] | StoreRoot, table: str):  # -> pandas.DataFrame
    """A whole table of the store as a DataFrame (temporary files are ignored)."""
    folder = trace_path(root) / table
    if isinstance(folder, RemotePath):
        try:
            listed = [p for p, info in folder.listing() if info.get("type") == "file"]
        except FileNotFoundError:
            listed = []
        files = sorted(p.arrow()[0] for p in listed if p.name.endswith(".parquet") and not p.name.startswith("."))
        fs = folder.arrow()[1]
    else:
        files, fs = sorted(str(p) for p in folder.glob("*.parquet")), None
    if not files:
        return SCHEMAS[table].empty_table().to_pandas()
    if any(os.path.basename(f).startswith("part-") for f in files):
        # compacted: a key's rows come from its newest file
        from kinetoscope.batch.compact import newest_rows

        return newest_rows(files, SCHEMAS[table], fs).to_pandas()
    return ds.dataset(files, format="parquet", schema=SCHEMAS[table], filesystem=fs).to_table().to_pandas()
