"""Compaction of a batch store: each table's many single files (one per key) merged into one part.

A 1,024-rank job leaves 4 single files per rank; the batch merges them at its end into ``part-<ns>-<id>.parquet``
per table (with the parts left by earlier batches while they are under PART_TARGET_BYTES), so a reader lists and
opens a few files. Every file of a table holds all the rows of each key it holds (a key's rows are written
together); where two files hold a key (a rerun wrote it again, or a reader listed between a compaction's rename and
its deletes) the newer file's rows are the key's rows: ``newest_rows`` and ``rows_in_parts`` apply that rule, and a
raw ``read_parquet('STORE/traces/*.parquet')`` sees both copies only in that moment.

A store in a bucket is compacted too. An object store has no rename, but an upload is seen whole or not at all (a
multipart upload appears when it completes), so the part is uploaded straight to its own new key and the merged keys
are deleted after it. Modification times there are the store's (to the second), so the rule is stated without them:
a key's single file, while it exists, is its newest write (each write replaces it; a compaction deletes it only
when its ETag is still the one it merged), and among parts the later name (``part-<ns>-...``) is the newer.
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
from kinetoscope.sources import RemotePath, remote_stat, trace_path

PART_PREFIX = "part-"
#: parts below this size are merged again by the next compaction; larger ones stay (unless a key in them is rewritten)
PART_TARGET_BYTES = 64 * 2**20
#: a compaction lock older than this is taken to be left by a compaction that died
COMPACT_LOCK_STALE_S = 600.0


def rows_in_parts(folder: Path | RemotePath, name: str, schema: pa.Schema) -> list[dict[str, Any]] | None:
    """The rows of key ``name`` in the newest part in ``folder`` (a table's) that holds it (None: no part does)."""
    if isinstance(folder, RemotePath):
        return _remote_rows_in_parts(folder, name, schema)
    for part in sorted(_parts(folder), key=_mtime, reverse=True):
        try:
            rows = pq.read_table(part, schema=schema, filters=[("key", "=", name)]).to_pylist()
        except FileNotFoundError:  # replaced by a compaction since it was listed
            continue
        if rows:
            return rows
    return None


def newest_rows(files: list[str], schema: pa.Schema, fs: Any = None) -> pa.Table:
    """The rows of a table's files (local paths, or keys in the object store ``fs``), each key's from the newest
    file holding it."""
    if fs is not None:
        return _remote_newest_rows(*_remote_read_with_files(files, schema, fs))
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


def compact(root: str | os.PathLike[str] | RemotePath, schemas: dict[str, pa.Schema]) -> dict[str, int] | None:
    """Merge each table's (each of ``schemas``) single files, and its parts below PART_TARGET_BYTES, into one new
    part; returns how many files each table had merged. The part is written under a temporary name, renamed in,
    and only then are the merged files deleted: a reader never misses a row (``read_table`` takes the newer of a
    key's copies). One compaction at a time per store (a lock file; another's compaction just skips, and returns
    None, not a count); safe beside writers (a file written or rewritten after the listing stays for the next one).
    A store in a bucket: ``_compact_remote``."""
    where = trace_path(root)
    if isinstance(where, RemotePath):
        return _compact_remote(where, schemas)
    root = where
    lock = root / ".compact.lock"
    if not _take_lock(lock):
        return None
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


# -- a store in an object store (s3://, gs://, az://) --

def _remote_name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _remote_stamp(key: str) -> tuple[int, str]:
    """A file's place in the newest-wins order of a bucket: a single file above every part, parts by name."""
    name = _remote_name(key)
    return (0 if name.startswith(PART_PREFIX) else 1, name)


def _remote_parquet(folder: RemotePath) -> list[tuple[RemotePath, dict[str, Any]]]:
    try:
        listed = folder.listing()
    except FileNotFoundError:
        return []
    return [(p, info) for p, info in listed
            if info.get("type") == "file" and p.name.endswith(".parquet") and not p.name.startswith(".")]


def _remote_rows_in_parts(folder: RemotePath, name: str, schema: pa.Schema) -> list[dict[str, Any]] | None:
    parts = sorted((p for p, _ in _remote_parquet(folder) if p.name.startswith(PART_PREFIX)),
                   key=lambda p: p.name, reverse=True)
    for part in parts:
        key, fs = part.arrow()
        try:
            rows = pq.read_table(key, schema=schema, filters=[("key", "=", name)], filesystem=fs).to_pylist()
        except FileNotFoundError:  # replaced by a compaction since it was listed
            continue
        if rows:
            return rows
    return None


def _remote_read_with_files(files: list[str], schema: pa.Schema, fs: Any) -> tuple[pa.Table, list[str]]:
    """``_read_with_files`` over keys in ``fs``, with the keys it read: where a compaction deleted a key since the
    listing, the folder is listed again (its rows are in the part that replaced it) and read as listed now."""
    for _ in range(5):
        try:
            return ds.dataset(files, format="parquet", schema=schema, filesystem=fs).to_table(
                columns=[*schema.names, "__filename"]), files
        except FileNotFoundError:
            folder = files[0].rsplit("/", 1)[0] if files else ""
            fs.invalidate_cache()
            files = sorted(f["name"] for f in fs.ls(folder, detail=True)
                           if f.get("type") == "file" and f["name"].endswith(".parquet")
                           and not _remote_name(f["name"]).startswith("."))
    raise TraceSourceError("store: files keep changing while being read")


def _remote_newest_rows(rows: pa.Table, listed: list[str]) -> pa.Table:
    """``_newest_rows`` in a bucket's order (``_remote_stamp``); a single file listed claims its key even empty."""
    names = rows.column("__filename").to_pylist()
    keys = rows.column("key").to_pylist()
    newest: dict[str, tuple[int, str]] = {}
    for key, name in zip(keys, names, strict=True):
        newest[key] = max(newest.get(key, (-1, "")), _remote_stamp(name))
    for name in listed:
        if not _remote_name(name).startswith(PART_PREFIX):
            stem = _remote_name(name).removesuffix(".parquet")
            newest[stem] = max(newest.get(stem, (-1, "")), _remote_stamp(name))
    keep = [newest[key] == _remote_stamp(name) for key, name in zip(keys, names, strict=True)]
    return rows.filter(pa.array(keep, pa.bool_())).drop_columns(["__filename"])


def _compact_remote(root: RemotePath, schemas: dict[str, pa.Schema]) -> dict[str, int] | None:
    """``compact`` for a store in a bucket: the part uploaded to its own key (seen whole or not at all), then the
    merged keys deleted; a single file whose ETag changed since the listing (rewritten) stays."""
    lock = root / ".compact.lock"
    token = uuid.uuid4().hex
    if not _take_remote_lock(lock, token):
        return None
    merged: dict[str, int] = {}
    try:
        for table, schema in schemas.items():
            folder = root / table
            listed = _remote_parquet(folder)
            singles = [(p, info) for p, info in listed if not p.name.startswith(PART_PREFIX)]
            if not singles:
                continue
            fs = folder.arrow()[1]
            claimed = {p.name.removesuffix(".parquet") for p, _ in singles}
            inputs = list(singles)
            for part, info in listed:
                if not part.name.startswith(PART_PREFIX):
                    continue
                if int(info.get("size") or 0) < PART_TARGET_BYTES or claimed & set(
                        pq.read_table(part.arrow()[0], columns=["key"], filesystem=fs).column("key").to_pylist()):
                    inputs.append((part, info))
            if len(inputs) < 2:
                continue
            files = [p.arrow()[0] for p, _ in inputs]
            rows = _remote_newest_rows(*_remote_read_with_files(files, schema, fs))
            rows = rows.sort_by([("key", "ascending")])
            part_key = (folder / f"{PART_PREFIX}{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet").arrow()[0]
            pq.write_table(rows, part_key, row_group_size=64 * 1024, filesystem=fs)
            now = {p: _etag_of(info) for p, info in _remote_parquet(folder)}
            doomed = []
            for old, info in inputs:
                if not old.name.startswith(PART_PREFIX) and now.get(old) != _etag_of(info):
                    continue  # rewritten since the listing (a rerun of that key): not in the part, it stays
                doomed.append(old.arrow()[0])
            if doomed:
                fs.rm(doomed)
            merged[table] = len(inputs)
    finally:
        try:
            if _remote_token(lock) == token:
                lock.arrow()[1].rm(lock.arrow()[0])
        except OSError:
            pass
    return merged


def _etag_of(info: dict[str, Any]) -> str | None:
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
    return None if etag is None else str(etag)


def _remote_token(lock: RemotePath) -> str | None:
    try:
        return lock.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def _take_remote_lock(lock: RemotePath, token: str) -> bool:
    """One compaction at a time per store in a bucket, as far as an object store allows: no compare-and-set, so
    the lock is written, read back, and held only if the token read is ours (a second compaction that overlaps
    anyway loses no row: both parts hold every merged key, and the newer part wins)."""
    try:
        info = lock.info()
    except FileNotFoundError:
        info = None
    if info is not None:
        # when it was written, as each store says it (S3's LastModified, GCS's updated, Azure's last_modified);
        # a store that does not say (0) never has its lock taken over
        stamp = remote_stat(info).st_mtime
        if not stamp or time.time() - stamp < COMPACT_LOCK_STALE_S:
            return False
    lock.write_bytes(token.encode())
    return _remote_token(lock) == token
