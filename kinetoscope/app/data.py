"""What the app shows comes from here: jobs to pick from, uploads, and analyses cached per content."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.ingest.jobs import TraceFile
from kinetoscope.analyze.ingest.limits import LoadLimits, parse_size
from kinetoscope.analyze.ingest.loader import Job, find_jobs
from kinetoscope.analyze.model.trace import Trace, ViewLocks
from kinetoscope.analyze.report.builder import Report
from kinetoscope.analyze.report.job import analyse_job
from kinetoscope.app.launch import MAX_UPLOAD_MB, bundled_samples
from kinetoscope.cli.settings import from_environment
from kinetoscope.errors import KinetoscopeError
from kinetoscope.fsutil import pid_alive
from kinetoscope.sources import trace_path, version_of

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Choice:
    label: str
    job: Job
    #: the job's files the batch could not read (a store's job opens without them)
    unread: int = 0


@dataclass(frozen=True)
class Analysis:
    label: str
    report: Report
    trace: Trace
    #: rank files that could not be read: (file name, one-sentence reason)
    failed: tuple[tuple[str, str], ...] = ()
    #: each rank's file name (uploads: the trace's sources name only the file, never the server's folder)
    rank_files: tuple[tuple[int, str], ...] = ()


def sample_choices() -> list[Choice]:
    root = bundled_samples()
    if root is None:
        return []
    out = []
    for sub in ("real", "cpu", "gpu", "pairs"):
        folder = root / sub
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.name.endswith((".json", ".json.gz")):
                continue
            try:
                jobs = find_jobs(path)
            except KinetoscopeError:
                continue
            for job in jobs:
                out.append(Choice(f"{sub}/{path.name}", job))
    return out


def path_choices(paths: list[str]) -> list[Choice]:
    return [Choice(job.name, job) for p in paths for job in find_jobs(p)]


def store_choices(store: str | os.PathLike[str]) -> list[Choice]:
    """A batch store's jobs, named relative to the folder they share, each with the files batch read
    successfully (the paths it recorded: on a shared file system the app reads them in place)."""
    from kinetoscope.batch.report import relative_names
    from kinetoscope.batch.store import read_table

    traces = read_table(store, "traces")
    hangs = read_table(store, "hangs")
    hung = set(hangs.loc[hangs["status"] == "ok", "job"]) if len(hangs) else set()
    ok = traces[traces["status"] == "ok"]
    names = relative_names(sorted(set(traces["job"]) | hung))
    failed = traces[traces["status"] != "ok"].groupby("job").size()
    jobs = {job: tuple(trace_path(p) for p in rows.sort_values("rank")["path"]) for job, rows in ok.groupby("job")}
    out = []
    for job in sorted(set(jobs) | hung):
        files = jobs.get(job, ())
        out.append(Choice(names[job], Job(names[job], files, _hang_dumps(job) if job in hung else ()),
                          unread=int(failed.get(job, 0))))
    return out


def _hang_dumps(job: str) -> tuple[TraceFile, ...]:
    """A store's job's hang dumps, read in place: ``rank-<r>.hang.json`` in its folder (batch names a job by its
    folder, or by one of its files)."""
    from kinetoscope.analyze.ingest.jobs import hang_dumps

    if "://" in job:  # a job in a bucket: its dumps are not read from there yet
        return ()
    return hang_dumps(Path(job) if Path(job).is_dir() else Path(job).parent)


def content_key(files: tuple[TraceFile, ...]) -> str:
    """Identity of a job for caching: file names, sizes and modification times (cheap, no read)."""
    h = hashlib.sha256()
    for f in files:
        try:
            size, version = version_of(f)
        except OSError:  # gone (a store's job moved away): analysed as missing, and said so
            h.update(f"{f}|missing".encode())
            continue
        h.update(f"{f.resolve() if isinstance(f, Path) else f}|{size}|{version}".encode())
    return h.hexdigest()


#: upload folders: kinetoscope-upload-<pid of the app server>-<random>
UPLOAD_PREFIX = "kinetoscope-upload-"


class UploadDir:
    """A folder of uploaded files, deleted when its owner (one browser session) lets go of it: on a new
    upload, or when Streamlit drops the session's state (the session ended) and this object with it."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=f"{UPLOAD_PREFIX}{os.getpid()}-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), True)

    def cleanup(self) -> None:
        self._finalizer()


def sweep_stale_uploads(older_than_s: float = 3600.0) -> int:
    """Remove upload folders left by app servers that are gone (killed before they could clean up)."""
    removed = 0
    root = Path(tempfile.gettempdir())
    for folder in root.glob(f"{UPLOAD_PREFIX}*"):
        try:
            pid = int(folder.name[len(UPLOAD_PREFIX):].split("-", 1)[0])
        except ValueError:
            pid = None
        try:
            alive = pid is not None and (pid == os.getpid() or pid_alive(pid))
            if not alive and time.time() - folder.stat().st_mtime > older_than_s:
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    return removed


def upload_key(files: list[tuple[str, bytes]]) -> str:
    """Identity of an upload: its files' names and contents."""
    digest = hashlib.sha256()
    for name, data in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def save_uploads(files: list[tuple[str, bytes]]) -> tuple[str, Job, UploadDir]:
    """Write uploaded files under safe names into a new folder of their own; they form one job. The key
    identifies their content (for the analysis cache); the folder goes when the returned object does."""
    if not files:
        raise KinetoscopeError("no files were uploaded")
    total = sum(len(data) for _, data in files)
    if total > MAX_UPLOAD_MB * 1024 * 1024:
        raise KinetoscopeError(f"the upload is {total / 2**20:.0f} MiB, above the app's {MAX_UPLOAD_MB} MiB limit; "
                               "use 'kinetoscope analyze' for traces this large")
    key = upload_key(files)
    for name, _ in files:
        safe = _safe_name(name)
        if not safe.endswith((".json", ".json.gz")):
            raise KinetoscopeError(f"{Path(name).name}: only .json and .json.gz trace files can be uploaded")
    folder = UploadDir()
    paths = []
    for name, data in files:
        path = folder.path / _safe_name(name)
        path.write_bytes(data)
        paths.append(path)
    label = ", ".join(Path(n).name for n, _ in files)
    return key, Job(label, tuple(sorted(paths))), folder


def separate_runs(job: Job) -> list[Choice]:
    """An uploaded job's files as runs of their own, one job each (the user said they are not ranks)."""
    return [Choice(path.name, Job(path.name, (path,))) for path in job.files]


def _safe_name(name: str) -> str:
    return _SAFE_NAME.sub("_", Path(name).name).lstrip(".") or "trace.json"


def without_folder(message: str, folder: Path | None) -> str:
    """A message about uploaded files that names the files, never the server's folder they were saved in."""
    if folder is None:
        return message
    return message.replace(f"{folder}{os.sep}", "").replace(str(folder), "the upload")


def app_limits() -> LoadLimits:
    """The app's load limits, shared by every session of one server: KINETOSCOPE_MAX_SIZE (default 1G) caps
    the gunzipped size of one file (analysing it takes about 2.5 times that in memory), and
    KINETOSCOPE_MAX_FALLBACK (default 16M) what the reference decoder may hold; KINETOSCOPE_DECODER as for the
    command (``cli.settings``)."""
    return LoadLimits(max_decompressed_bytes=parse_size(os.environ.get("KINETOSCOPE_MAX_SIZE", "1G")),
                      max_fallback_bytes=parse_size(os.environ.get("KINETOSCOPE_MAX_FALLBACK", "16M")),
                      decoder=from_environment().decoder)


def analyse(label: str, job: Job, upload: Path | None = None) -> Analysis:
    """Load every rank that can be loaded and analyse them; broken files are reported, not fatal.
    ``upload``: the folder uploaded files were saved in, kept out of every message, page and report."""
    files: tuple[tuple[int, str], ...] = ()

    def relabel(trace: Trace) -> Trace:
        nonlocal files
        files = tuple((r.rank, Path(r.meta.source).name) for r in trace.ranks)
        return _named_by_file(trace, label) if upload is not None else trace

    try:
        analysed = analyse_job(job, limits=app_limits(), tolerant=True, relabel=relabel,
                               max_threads=from_environment().threads)
    except KinetoscopeError as exc:
        raise KinetoscopeError(without_folder(str(exc), upload)) from None
    if analysed.trace is None or analysed.report is None:
        reasons = "; ".join(without_folder(reason, upload) for _, reason in analysed.failed)
        raise KinetoscopeError(f"no file could be analysed: {reasons}")
    return Analysis(label, analysed.report, analysed.trace,
                    tuple((p.name, without_folder(r, upload)) for p, r in analysed.failed), files)


def _named_by_file(trace: Trace, label: str) -> Trace:
    """The trace with each rank's source the uploaded file's name (not its path in the server's folder)."""
    ranks = tuple(replace(r, meta=replace(r.meta, source=Path(r.meta.source).name), _views={},
                           _view_locks=ViewLocks()) for r in trace.ranks)
    return Trace(source=label, ranks=ranks, hang_dumps=trace.hang_dumps)


def job_file(job: Job | None, name: str) -> TraceFile | None:
    """The file of ``job`` called ``name`` (the session's own copy: a cached analysis may come from another
    session's upload, whose folder is gone)."""
    if job is None:
        return None
    return next((f for f in job.files if f.name == name and f.is_file()), None)


class UploadJanitor:
    """Deletes upload folders whose browser session has ended. Streamlit keeps an ended session's state
    (and so its UploadDir) for two minutes in case it reconnects, and frees it only when another session
    comes or goes; on a quiet server an upload would stay until the server stops. A thread checks every
    ``period_s`` and deletes the folders of sessions inactive for longer than ``grace_s``."""

    def __init__(self, is_active: Any, grace_s: float = 150.0, period_s: float = 30.0) -> None:
        self._is_active = is_active
        self._grace_s, self._period_s = grace_s, period_s
        self._folders: dict[str, tuple[str, list[Path]]] = {}  # session id -> (owner token, folders)
        self._inactive_since: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kinetoscope-upload-janitor", daemon=True)
        self._thread.start()

    def watch(self, session_id: str, folder: Path) -> None:
        with self._lock:
            self._folders.setdefault(session_id, ("", []))[1].append(folder)

    def sweep(self, now: float | None = None) -> int:
        """Delete the folders of sessions inactive past the grace period; how many were deleted."""
        now = time.monotonic() if now is None else now
        removed = 0
        with self._lock:
            for session_id in list(self._folders):
                if self._is_active(session_id):
                    self._inactive_since.pop(session_id, None)
                    continue
                since = self._inactive_since.setdefault(session_id, now)
                if now - since < self._grace_s:
                    continue
                for folder in self._folders.pop(session_id)[1]:
                    if folder.exists():
                        shutil.rmtree(folder, ignore_errors=True)
                        removed += 1
                self._inactive_since.pop(session_id, None)
        return removed

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - a janitor never takes the server down
                continue

    def stop(self) -> None:
        self._stop.set()


class AnalysisCache:
    """Analyses kept in memory for every session of the server, least recently used first out, within a
    byte budget (an analysis is about the size of its trace's tables). Thread-safe: sessions run in threads."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[Analysis, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Analysis | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: str, analysis: Analysis) -> None:
        size = analysis_bytes(analysis)
        with self._lock:
            self._items[key] = (analysis, size)
            self._items.move_to_end(key)
            while len(self._items) > 1 and self.used_bytes() > self.max_bytes:
                self._items.popitem(last=False)

    def used_bytes(self) -> int:
        return sum(size for _, size in self._items.values())

    def __len__(self) -> int:
        return len(self._items)


def analysis_bytes(analysis: Analysis) -> int:
    """The memory an analysis holds: its trace's tables, the views derived from them (kept by the trace),
    and the report's tables, each array counted once."""
    return _deep_bytes(analysis, set())


def _deep_bytes(obj: Any, seen: set[int]) -> int:
    if id(obj) in seen or obj is None or isinstance(obj, (bool, int, float, str, bytes, Path)):
        return 0
    seen.add(id(obj))
    if isinstance(obj, pd.DataFrame):
        return int(obj.memory_usage(index=True, deep=True).sum())
    if isinstance(obj, (pd.Series, pd.Index)):
        return (
            int(obj.memory_usage(index=True, deep=True))
            if isinstance(obj, pd.Series)
            else int(obj.memory_usage(deep=True))
        )
    if isinstance(obj, np.ndarray):
        base = obj.base if isinstance(obj.base, np.ndarray) else None
        if base is not None:
            return _deep_bytes(base, seen)
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(_deep_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sum(_deep_bytes(v, seen) for v in obj)
    total = 0
    if is_dataclass(obj):
        total += sum(_deep_bytes(getattr(obj, f.name, None), seen) for f in fields(obj))
    extra = getattr(obj, "__dict__", None)  # cached properties (RankTrace.gpu_events) live here
    if isinstance(extra, dict):
        total += sum(_deep_bytes(v, seen) for v in extra.values())
    return total


def app_cache_bytes() -> int:
    """The analysis cache's budget: KINETOSCOPE_APP_CACHE (e.g. 2G), default 1 GiB."""
    return parse_size(os.environ.get("KINETOSCOPE_APP_CACHE", "1G"))
