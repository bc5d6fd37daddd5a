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
    STORE/<table>/part-<ns>-<id>.parquet  many of the files above compacted into one (``compact``, at the end of
                                          every batch): a bucket lists and DuckDB opens a few files, not 4 per rank

Every file of a table holds all the rows of the keys it holds (a key's rows are always written together); where two
files hold a key (a rerun, or the moment between a compaction's rename and its deletes), the newer file's rows are
the key's rows. ``read_table`` applies that rule; a raw ``read_parquet('STORE/traces/*.parquet')`` sees both only in
that moment.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from kinetoscope import __version__
from kinetoscope.errors import TraceSourceError
from kinetoscope.fsutil import atomic_target, atomic_write

STORE_KIND = "kinetoscope-store"
PART_PREFIX = "part-"
#: parts below this size are merged again by the next compaction; larger ones stay (unless a key in them is rewritten)
PART_TARGET_BYTES = 64 * 2**20
#: a compaction lock older than this is taken to be left by a compaction that died
COMPACT_LOCK_STALE_S = 600.0
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
    """The rows of key ``name``: its own file, or else the newest compacted part holding it (None: neither)."""
    path = root / table / f"{name}.parquet"
    if path.is_file():
        return pq.read_table(path, schema=SCHEMAS[table]).to_pylist()
    for part in sorted(_parts(root / table), key=_mtime, reverse=True):
        try:
            rows = pq.read_table(part, schema=SCHEMAS[table], filters=[("key", "=", name)]).to_pylist()
        except FileNotFoundError:  # replaced by a compaction since it was listed
            continue
        if rows:
            return rows
    return None


def _parts(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{PART_PREFIX}*.parquet"))


def _singles(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith(PART_PREFIX))


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return -1


def read_table(root: str | os.PathLike[str], table: str):  # -> pandas.DataFrame
    """A whole table of the store as a DataFrame (temporary files are ignored; a key's rows from its newest file)."""
    folder = Path(root) / table
    files = sorted(str(p) for p in folder.glob("*.parquet"))
    if not files:
        return SCHEMAS[table].empty_table().to_pandas()
    if not any(Path(f).name.startswith(PART_PREFIX) for f in files):  # never compacted: one file per key
        return ds.dataset(files, format="parquet", schema=SCHEMAS[table]).to_table().to_pandas()
    return _newest_rows(_read_with_files([Path(f) for f in files], table)).to_pandas()


def _read_with_files(files: list[Path], table: str) -> pa.Table:
    """The rows of these files, each with the file it came from (``__filename``); a file that a concurrent
    compaction removed since it was listed is read from the part that replaced it (listed again)."""
    for _ in range(5):
        present = [str(f) for f in files if f.exists()]
        try:
            return ds.dataset(present, format="parquet", schema=SCHEMAS[table]).to_table(
                columns=[*SCHEMAS[table].names, "__filename"])
        except FileNotFoundError:
            files = sorted(files[0].parent.glob("*.parquet")) if files else []
    raise TraceSourceError(f"{files[0].parent if files else table}: files keep changing while being read")


def _newest_rows(rows: pa.Table) -> pa.Table:
    """Per key, the rows of the newest file that holds it. A single file holds its key even with no rows (a
    rank's findings rewritten empty), so its claim comes from its name."""
    names = rows.column("__filename").to_pylist()
    files = sorted(set(names))
    mtimes = {f: _mtime(Path(f)) for f in files}
    newest: dict[str, tuple[int, str]] = {}
    for key, name in zip(rows.column("key").to_pylist(), names, strict=True):
        if (mtimes[name], name) > newest.get(key, (-2, "")):
            newest[key] = (mtimes[name], name)
    folder = Path(files[0]).parent if files else None
    if folder is not None:  # empty single files claim their key too
        for single in _singles(folder):
            stamp = (_mtime(single), str(single))
            if stamp > newest.get(single.stem, (-2, "")):
                newest[single.stem] = stamp
    keep = [newest[key][1] == name for key, name in zip(rows.column("key").to_pylist(), names, strict=True)]
    return rows.filter(pa.array(keep, pa.bool_())).drop_columns(["__filename"])


def compact(root: str | os.PathLike[str], tables: tuple[str, ...] = TABLES) -> dict[str, int]:
    """Merge each table's single files (and its parts below PART_TARGET_BYTES) into one new part; returns how many
    files each table had merged. The part is written under a temporary name, renamed in, and only then are the
    merged files deleted: a reader never misses a row (``read_table`` takes the newer of a key's copies). One
    compaction at a time per store (a lock file; another batch's compaction just skips); safe beside writers (a
    file written after the listing stays for the next one)."""
    root = Path(root)
    lock = root / ".compact.lock"
    if not _take_lock(lock):
        return {}
    merged: dict[str, int] = {}
    try:
        for table in tables:
            folder = root / table
            singles = _singles(folder)
            if not singles:
                continue
            claimed = {p.stem for p in singles}
            inputs = list(singles)
            listed = {p: _mtime(p) for p in singles}
            for part in _parts(folder):
                size = part.stat().st_size
                if size < PART_TARGET_BYTES or claimed & set(
                        pq.read_table(part, columns=["key"]).column("key").to_pylist()):
                    inputs.append(part)
            if len(inputs) < 2:
                continue
            rows = _newest_rows(_read_with_files(inputs, table))
            rows = rows.sort_by([("key", "ascending")])  # row groups' statistics then narrow a key look-up
            name = f"{PART_PREFIX}{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
            with atomic_target(folder / name) as tmp:
                pq.write_table(rows, tmp, row_group_size=64 * 1024)
            for old in inputs:
                # a single file rewritten since the listing (a rerun of that key) is not in the part: it stays
                if old.name.startswith(PART_PREFIX) or _mtime(old) == listed[old]:
                    old.unlink(missing_ok=True)
            merged[table] = len(inputs)
    finally:
        lock.unlink(missing_ok=True)
    return merged


def _take_lock(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        if time.time() - lock.stat().st_mtime < COMPACT_LOCK_STALE_S:
            return False
        lock.unlink(missing_ok=True)  # left by a compaction that died
        return _take_lock(lock)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True
