"""What the app shows comes from here: jobs to pick from and their reports (computed once, cached)."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kinetoscope.analyze.loader import Job, find_jobs, load_job
from kinetoscope.analyze.report import Report, build_report
from kinetoscope.app.launch import bundled_samples
from kinetoscope.errors import KinetoscopeError

#: the app refuses uploads above this (a browser upload of a multi-GB trace belongs on the CLI)
MAX_UPLOAD_BYTES = 512 * 1024 * 1024
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Choice:
    label: str
    job: Job


def sample_choices() -> list[Choice]:
    root = bundled_samples()
    if root is None:
        return []
    candidates = sorted(p for p in (root / "real").iterdir()) if (root / "real").is_dir() else []
    candidates += sorted(p for p in (root / "cpu").iterdir() if p.is_dir()) if (root / "cpu").is_dir() else []
    out = []
    for path in candidates:
        if path.is_file() and not path.name.endswith((".json", ".json.gz")):
            continue
        try:
            jobs = find_jobs(path)
        except KinetoscopeError:
            continue
        for job in jobs:
            out.append(Choice(f"{path.parent.name}/{path.name}", job))
    return out


def path_choices(paths: list[str]) -> list[Choice]:
    out = []
    for p in paths:
        for job in find_jobs(p):
            out.append(Choice(job.name, job))
    return out


def save_uploads(files: list[tuple[str, bytes]]) -> Path:
    """Write uploaded files into a fresh directory under safe names; the set is one job."""
    total = sum(len(data) for _, data in files)
    if total > MAX_UPLOAD_BYTES:
        raise KinetoscopeError(f"uploads total {total / 2**20:.0f} MiB, above the app's {MAX_UPLOAD_BYTES // 2**20} MiB limit")
    folder = Path(tempfile.mkdtemp(prefix="kinetoscope-upload-"))
    for name, data in files:
        safe = _SAFE_NAME.sub("_", Path(name).name).lstrip(".") or "trace.json"
        if not safe.endswith((".json", ".json.gz")):
            raise KinetoscopeError(f"{name}: only .json and .json.gz traces can be uploaded")
        (folder / safe).write_bytes(data)
    return folder


def analyse(job: Job) -> Report:
    return build_report(load_job(job))
