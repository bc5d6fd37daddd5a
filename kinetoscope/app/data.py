"""What the app shows comes from here: jobs to pick from, uploads, and analyses cached per content."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
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


def save_uploads(files: list[tuple[str, bytes]]) -> tuple[str, Job]:
    """Write uploaded files under safe names into a directory named by their content hash; they form one job."""
    if not files:
        raise KinetoscopeError("no files were uploaded")
    total = sum(len(data) for _, data in files)
    if total > MAX_UPLOAD_MB * 1024 * 1024:
        raise KinetoscopeError(f"the upload is {total / 2**20:.0f} MiB, above the app's {MAX_UPLOAD_MB} MiB limit; "
                               "use 'kinetoscope analyze' for traces this large")
    digest = hashlib.sha256()
    for name, data in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    key = digest.hexdigest()
    folder = Path(tempfile.gettempdir()) / f"kinetoscope-upload-{key[:24]}"
    folder.mkdir(exist_ok=True)
    paths = []
    for name, data in files:
        safe = _SAFE_NAME.sub("_", Path(name).name).lstrip(".") or "trace.json"
        if not safe.endswith((".json", ".json.gz")):
            raise KinetoscopeError(f"{name}: only .json and .json.gz trace files can be uploaded")
        path = folder / safe
        if not path.exists():
            path.write_bytes(data)
        paths.append(path)
    label = ", ".join(Path(n).name for n, _ in files)
    return key, Job(label, tuple(sorted(paths)))


def app_limits() -> LoadLimits:
    """The app's load limits: KINETOSCOPE_MAX_SIZE (e.g. 2G) caps the gunzipped size of one file."""
    return LoadLimits(max_decompressed_bytes=parse_size(os.environ.get("KINETOSCOPE_MAX_SIZE", "4G")))


def analyse(label: str, job: Job) -> Analysis:
    """Load every rank that can be loaded and analyse them; broken files are reported, not fatal."""
    trace, failed = load_job_tolerant(job, app_limits())
    if trace is None:
        reasons = "; ".join(reason for _, reason in failed)
        raise KinetoscopeError(f"no file could be analysed: {reasons}")
    return Analysis(label, build_report(trace), trace, tuple((p.name, r) for p, r in failed))
