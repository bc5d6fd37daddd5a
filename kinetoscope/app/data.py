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
from dataclasses import dataclass
from pathlib import Path

from kinetoscope.analyze.limits import LoadLimits, parse_size
from kinetoscope.analyze.loader import Job, find_jobs, load_job_tolerant
from kinetoscope.analyze.report import Report, build_report
from kinetoscope.analyze.trace import Trace
from kinetoscope.app.launch import MAX_UPLOAD_MB, bundled_samples
from kinetoscope.errors import KinetoscopeError

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Choice:
    label: str
    job: Job


@dataclass(frozen=True)
class Analysis:
    label: str
    report: Report
    trace: Trace
    #: rank files that could not be read: (file name, one-sentence reason)
    failed: tuple[tuple[str, str], ...] = ()


def sample_choices() -> list[Choice]:
    root = bundled_samples()
    if root is None:
        return []
    out = []
    for sub in ("real", "cpu", "gpu"):
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


def content_key(files: tuple[Path, ...]) -> str:
    """Identity of a job for caching: file names, sizes and modification times (cheap, no read)."""
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
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
            alive = pid is not None and (pid == os.getpid() or _alive(pid))
            if not alive and time.time() - folder.stat().st_mtime > older_than_s:
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def _safe_name(name: str) -> str:
    return _SAFE_NAME.sub("_", Path(name).name).lstrip(".") or "trace.json"


def without_folder(message: str, folder: Path | None) -> str:
    """A message about uploaded files that names the files, never the server's folder they were saved in."""
    if folder is None:
        return message
    return message.replace(f"{folder}{os.sep}", "").replace(str(folder), "the upload")


def app_limits() -> LoadLimits:
    """The app's load limits: KINETOSCOPE_MAX_SIZE (e.g. 2G) caps the gunzipped size of one file."""
    return LoadLimits(max_decompressed_bytes=parse_size(os.environ.get("KINETOSCOPE_MAX_SIZE", "4G")))


def analyse(label: str, job: Job, upload: Path | None = None) -> Analysis:
    """Load every rank that can be loaded and analyse them; broken files are reported, not fatal.
    ``upload``: the folder uploaded files were saved in, kept out of every message."""
    try:
        trace, failed = load_job_tolerant(job, app_limits())
    except KinetoscopeError as exc:
        raise KinetoscopeError(without_folder(str(exc), upload)) from None
    if trace is None:
        reasons = "; ".join(without_folder(reason, upload) for _, reason in failed)
        raise KinetoscopeError(f"no file could be analysed: {reasons}")
    return Analysis(label, build_report(trace), trace, tuple((p.name, without_folder(r, upload)) for p, r in failed))


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
    """The memory an analysis holds: its trace's tables and the report's tables (shallow: fast)."""
    total = 0
    for r in analysis.trace.ranks:
        for frame in (r.events, r.memory, r.counters, r.flows, r.instants, r.steps, r.comm_args):
            total += int(frame.memory_usage(index=True, deep=False).sum())
    for results in analysis.report.results.values():
        for res in results.values():
            for table in res.tables.values():
                total += int(table.memory_usage(index=True, deep=False).sum())
    return total


def app_cache_bytes() -> int:
    """The analysis cache's budget: KINETOSCOPE_APP_CACHE (e.g. 2G), default 1 GiB."""
    return parse_size(os.environ.get("KINETOSCOPE_APP_CACHE", "1G"))
