"""Compaction of a batch store: each table's many single files (one per key) merged into one part.

A 1,024-rank job leaves 4 single files per rank; the batch merges them at its end into ``part-<ns>-<id>.parquet``
per table (with the parts left by earlier batches while they are under PART_TARGET_BYTES), so a reader lists and
opens a few files. Every file of a table holds all the rows of each key it holds (a key's rows are written
together); where two files hold a key (a rerun wrote it again, or a reader listed between a compaction's rename and
its deletes) the newer file's rows are the key's rows: ``newest_rows`` and ``rows_in_parts`` apply that rule, and a
raw ``read_parquet('STORE/traces/*.parquet')`` sees both copies only in that moment. Local stores only: an object
store has no rename (a store given by URL is left as written).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from kinetoscope.errors import TraceSourceError
from kinetoscope.fsutil import atomic_target

PART_PREFIX = "part-"
#: parts below this size are merged again by the next compaction; larger ones stay (unless a key in them is rewritten)
PART_TARGET_BYTES = 64 * 2**20
#: a compaction lock older than this is taken to be left by a compaction that died
COMPACT_LOCK_STALE_S = 600.0


def rows_in_parts(folder: Path, name: str, schema: pa.Schema) -> list[dict[str, Any]] | None:
    """The rows of key ``name`` in the newest part in ``folder`` (a table's) that holds it (None: no part does, or
    ``folder`` is in an object store, which is never compacted)."""
    if not isinstance(folder, Path):
        return None
    for part in sorted(_parts(folder), key=_mtime, reverse=True):
        try:
            rows = pq.read_table(part, schema=schema, filters=[("key", "=", name)]).to_pylist()
        except FileNotFoundError:  # replaced by a compaction since it was listed
            continue
        if rows:
            return rows
    return None


def newest_rows(files: list[str], schema: pa.Schema) -> pa.Table:
    """The rows of a table's files, each key's from the newest file holding it."""
    return _newest_rows(_read_with_files([Path(f) for f in files], schema))


def _parts(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{PART_PREFIX}*.parquet"))


def _singles(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith(PART_PREFIX))


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return -1


def _read_with_files(files: list[Path], schema: pa.Schema) -> pa.Table:
    """The rows of these files, each with the file it came from (``__filename``); a file that a concurrent
    compaction removed since it was listed is read from the part that replaced it (listed again)."""
    for _ in range(5):
        present = [str(f) for f in files if f.exists()]
        try:
            return ds.dataset(present, format="parquet", schema=schema).to_table(
                columns=[*schema.names, "__filename"])
        except FileNotFoundError:
            files = sorted(files[0].parent.glob("*.parquet")) if files else []
    raise TraceSourceError(f"{files[0].parent if files else 'store'}: files keep changing while being read")


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


def compact(root: str | os.PathLike[str], schemas: dict[str, pa.Schema]) -> dict[str, int]:
    """Merge each table's (each of ``schemas``) single files, and its parts below PART_TARGET_BYTES, into one new
    part; returns how many files each table had merged. The part is written under a temporary name, renamed in,
    and only then are the merged files deleted: a reader never misses a row (``read_table`` takes the newer of a
    key's copies). One compaction at a time per store (a lock file; another batch's compaction just skips); safe
    beside writers (a file written or rewritten after the listing stays for the next one)."""
    if "://" in str(root):  # an object store: no rename, so no compaction (see the module's docstring)
        return {}
    root = Path(root)
    lock = root / ".compact.lock"
    if not _take_lock(lock):
        return {}
    merged: dict[str, int] = {}
    try:
        for table, schema in schemas.items():
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
            rows = _newest_rows(_read_with_files(inputs, schema))
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
