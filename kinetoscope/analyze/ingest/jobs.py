"""Which files make up a job: light (no numpy, no pandas), so a command can find its files and start reading
them before the analyses' imports have finished."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kinetoscope.errors import TraceSourceError

TRACE_SUFFIXES = (".json", ".json.gz")
#: files a capture writes beside its traces; they are not traces
SIDECAR_SUFFIXES = (".manifest.json", ".steps.json")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
#: ``rank-0.step-3-5.pt.trace.json.gz``: one capture window of one rank
_WINDOW_IN_NAME = re.compile(r"\.step-(\d+)-(\d+)\.")


@dataclass(frozen=True)
class Job:
    """One job to analyse: a name and the files of its ranks."""

    name: str
    files: tuple[Path, ...]


def is_trace_file(path: Path) -> bool:
    name = path.name.lower()
    return (
        path.is_file()
        and name.endswith(TRACE_SUFFIXES)
        and not name.endswith(SIDECAR_SUFFIXES)
        and not name.startswith(".")
    )


def find_jobs(path: str | os.PathLike[str]) -> list[Job]:
    """The jobs at ``path``: a file is one job; a directory is one job, or one per capture window."""
    p = Path(path)
    if not p.exists():
        raise TraceSourceError(f"{p}: no such file or directory")
    if p.is_file():
        return [Job(str(p), (p,))]
    if not p.is_dir():
        raise TraceSourceError(f"{p}: not a regular file or a directory (a device, socket or pipe?)")
    try:
        files = sorted(f for f in p.iterdir() if is_trace_file(f))
    except OSError as exc:
        raise TraceSourceError(f"{p}: cannot list ({exc.strerror or exc})") from None
    if not files:
        raise TraceSourceError(f"{p}: directory holds no .json or .json.gz trace files")
    windows: dict[str, list[Path]] = {}
    for f in files:
        m = _WINDOW_IN_NAME.search(f.name)
        windows.setdefault(f"steps {m.group(1)}-{m.group(2)}" if m else "", []).append(f)
    if len(windows) == 1:
        return [Job(str(p), tuple(files))]
    return [
        Job(f"{p} ({w or 'other files'})", tuple(fs))
        for w, fs in sorted(windows.items(), key=lambda kv: _window_key(kv[0]))
    ]


def _window_key(label: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", label)
    return (int(digits[0]) if digits else -1, label)


def resolve(path: str | os.PathLike[str]) -> list[Path]:
    """The trace files of the one job at ``path``."""
    jobs = find_jobs(path)
    if len(jobs) > 1:
        raise TraceSourceError(
            f"{path}: holds {len(jobs)} capture windows ({', '.join(j.name for j in jobs)}); "
            "analyse them with 'kinetoscope analyze' (one report per window) or pass one window's files"
        )
    return list(jobs[0].files)


def is_capture_window(path: Path) -> bool:
    """Whether the file is one window of a Kinetoscope capture (``rank-0.step-3-5.pt.trace.json.gz``), with the
    capture's sidecars beside it."""
    return _WINDOW_IN_NAME.search(path.name) is not None


def rank_from_name(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None
