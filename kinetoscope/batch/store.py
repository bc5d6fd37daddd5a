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
                                          of every batch): DuckDB opens a few files, not 4 per rank
"""

from __future__ import annotations

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


def open_store(path: str | os.PathLike[str], *, create: bool = False) -> Path:
    root = Path(path)
    marker = root / "store.json"
    if marker.is_file():
        try:
            kind = json.loads(marker.read_text()).get("kind")
        except (OSError, ValueError):
            kind = None
        if kind != STORE_KIND:
            raise TraceSourceError(f"{root}: store.json is not a Kinetoscope store")
    elif create:
        if root.exists() and any(root.iterdir()):
            raise TraceSourceError(f"{root}: exists and is not a Kinetoscope store (refusing to write into it)")
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(marker, json.dumps({"kind": STORE_KIND, "created_by": __version__}).encode())
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


def write_rows(root: Path, table: str, name: str, rows: list[dict[str, Any]]) -> None:
    """Write one Parquet file of rows (to a temporary name, then renamed: never half a file)."""
    arrow = pa.Table.from_pylist(rows, schema=SCHEMAS[table])
    with atomic_target(root / table / f"{name}.parquet") as tmp:
        pq.write_table(arrow, tmp)


def read_rows(root: Path, table: str, name: str) -> list[dict[str, Any]] | None:
    path = root / table / f"{name}.parquet"
    if not path.is_file():
        from kinetoscope.batch.compact import rows_in_parts

        return rows_in_parts(root / table, name, SCHEMAS[table])  # compacted (None: no rows of that key anywhere)
    return pq.read_table(path, schema=SCHEMAS[table]).to_pylist()


def read_table(root: str | os.PathLike[str], table: str):  # -> pandas.DataFrame
    """A whole table of the store as a DataFrame (temporary files are ignored)."""
    folder = Path(root) / table
    files = sorted(str(p) for p in folder.glob("*.parquet"))
    if not files:
        return SCHEMAS[table].empty_table().to_pandas()
    if any(os.path.basename(f).startswith("part-") for f in files):  # compacted: a key's rows from its newest file
        from kinetoscope.batch.compact import newest_rows

        return newest_rows(files, SCHEMAS[table]).to_pandas()
    return ds.dataset(files, format="parquet", schema=SCHEMAS[table]).to_table().to_pandas()
