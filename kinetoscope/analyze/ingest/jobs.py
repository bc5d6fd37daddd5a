"""Which files make up a job: light (no numpy, no pandas), so a command can find its files and start reading
them before the analyses' imports have finished."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kinetoscope.errors import TraceSourceError
from kinetoscope.hangdump import HANG_SUFFIX, PICKLE_MAGIC, PICKLE_REFUSED
from kinetoscope.sources import RemotePath, trace_path

#: a trace file where it lives: a local path, or an object in a store (``kinetoscope.sources``)
TraceFile = Path | RemotePath

TRACE_SUFFIXES = (".json", ".json.gz")
#: files a capture writes beside its traces; they are not traces
SIDECAR_SUFFIXES = (".manifest.json", ".steps.json", HANG_SUFFIX)
#: names torch gives its flight recorder dumps (pickles: TORCH_FR_DUMP_TEMP_FILE, default /tmp/nccl_trace_rank_<r>)
_FR_PICKLE_NAME = re.compile(r"(trace_rank_\d+|\.pkl|\.pickle)$", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
#: ``rank-0.step-3-5.pt.trace.json.gz``: one capture window of one rank
_WINDOW_IN_NAME = re.compile(r"\.step-(\d+)-(\d+)\.")


@dataclass(frozen=True)
class Job:
    """One job to analyse: a name, the files of its ranks and the ranks' hang dumps (``rank-<r>.hang.json``)."""

    name: str
    files: tuple[TraceFile, ...]
    hang_dumps: tuple[TraceFile, ...] = ()


def is_trace_file(path: TraceFile, *, is_file: bool | None = None) -> bool:
    """``is_file``: what a listing already said of it (a store is not asked again)."""
    name = path.name.lower()
    return (
        name.endswith(TRACE_SUFFIXES)
        and not name.endswith(SIDECAR_SUFFIXES)
        and not name.startswith(".")
        and (path.is_file() if is_file is None else is_file)
    )


def list_folder(folder: TraceFile) -> list[tuple[TraceFile, bool]]:
    """A folder's entries, sorted, each with whether it is a file (one listing of a store, not a request each)."""
    if isinstance(folder, RemotePath):
        return [(p, info.get("type") == "file") for p, info in folder.listing()]
    return [(f, f.is_file()) for f in sorted(folder.iterdir())]


def _dumps(entries: list[tuple[TraceFile, bool]]) -> tuple[TraceFile, ...]:
    """The hang dumps (``rank-<r>.hang.json``) among a folder's entries, hidden files left out."""
    return tuple(f for f, is_file in entries if f.name.endswith(HANG_SUFFIX) and not f.name.startswith(".") and is_file)


def hang_dumps(folder: TraceFile) -> tuple[TraceFile, ...]:
    """A folder's hang dumps, by name (none where it cannot be listed)."""
    try:
        return _dumps(list_folder(folder))  # sorted, as the listing is
    except OSError:
        return ()


def find_jobs(path: str | os.PathLike[str]) -> list[Job]:
    """The jobs at ``path``: a file is one job; a directory is one job, or one per capture window."""
    p = trace_path(path)
    try:
        return _find_jobs(p)
    except OSError as exc:  # a store that cannot be reached or read (a local path's errors are handled below)
        raise TraceSourceError(f"{p}: cannot read ({exc.strerror or exc})") from None


def _find_jobs(p: TraceFile) -> list[Job]:
    if not p.exists():
        raise TraceSourceError(f"{p}: no such file or directory")
    if p.is_file():
        if p.name.endswith(HANG_SUFFIX):
            _refuse_pickle(p)
            return [Job(str(p), (), (p,))]
        if _is_pickle(p):
            raise TraceSourceError(f"{p}: {PICKLE_REFUSED}")
        return [Job(str(p), (p,))]
    if not p.is_dir():
        raise TraceSourceError(f"{p}: not a regular file or a directory (a device, socket or pipe?)")
    try:
        entries = list_folder(p)
        files = [f for f, is_file in entries if is_trace_file(f, is_file=is_file)]
        dumps = _dumps(entries)
    except OSError as exc:
        raise TraceSourceError(f"{p}: cannot list ({exc.strerror or exc})") from None
    for f in dumps + tuple(f for f, is_file in entries if _FR_PICKLE_NAME.search(f.name) and is_file):
        _refuse_pickle(f)
    if not files and not dumps:
        raise TraceSourceError(f"{p}: directory holds no .json or .json.gz trace files")
    windows: dict[str, list[TraceFile]] = {}
    for f in files:
        m = _WINDOW_IN_NAME.search(f.name)
        windows.setdefault(f"steps {m.group(1)}-{m.group(2)}" if m else "", []).append(f)
    if len(windows) <= 1:
        return [Job(str(p), tuple(files), dumps)]
    # the hang dumps go with the last window: the run's end, analysed beside the hang
    ordered = sorted(windows.items(), key=lambda kv: _window_key(kv[0]))
    return [Job(f"{p} ({w or 'other files'})", tuple(fs), dumps if i == len(ordered) - 1 else ())
            for i, (w, fs) in enumerate(ordered)]


def _is_pickle(path: TraceFile) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(1) == PICKLE_MAGIC
    except OSError:
        return False


def _refuse_pickle(path: TraceFile) -> None:
    if _is_pickle(path):
        raise TraceSourceError(f"{path}: {PICKLE_REFUSED}")


def _window_key(label: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", label)
    return (int(digits[0]) if digits else -1, label)


def resolve(path: str | os.PathLike[str]) -> list[TraceFile]:
    """The trace files of the one job at ``path``."""
    jobs = find_jobs(path)
    if len(jobs) > 1:
        raise TraceSourceError(
            f"{path}: holds {len(jobs)} capture windows ({', '.join(j.name for j in jobs)}); "
            "analyse them with 'kinetoscope analyze' (one report per window) or pass one window's files"
        )
    return list(jobs[0].files)


def is_capture_window(path: TraceFile) -> bool:
    """Whether the file is one window of a Kinetoscope capture (``rank-0.step-3-5.pt.trace.json.gz``), with the
    capture's sidecars beside it."""
    return _WINDOW_IN_NAME.search(path.name) is not None


def rank_from_name(path: TraceFile) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None
