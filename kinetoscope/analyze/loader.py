"""Find trace files, read them, and assemble one ``Trace`` per job.

One resolver serves the CLI, the app and batch: a file is a one-rank job; a
directory is one job whose ``*.json``/``*.json.gz`` files are its ranks.
"""

from __future__ import annotations

import gzip
import os
import re
import time
import zlib
from dataclasses import replace
from pathlib import Path

from kinetoscope.analyze.build import build_rank_trace
from kinetoscope.analyze.parser import parse_bytes
from kinetoscope.analyze.trace import RankTrace, Trace
from kinetoscope.errors import TraceFormatError, TraceSourceError

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(TRACE_SUFFIXES) and not path.name.startswith(".")


def resolve(path: str | os.PathLike[str]) -> list[Path]:
    """The trace files of one job at ``path`` (a file or a directory of rank files)."""
    p = Path(path)
    if not p.exists():
        raise TraceSourceError(f"{p}: no such file or directory")
    if p.is_file():
        return [p]
    files = sorted(f for f in p.iterdir() if is_trace_file(f))
    if not files:
        raise TraceSourceError(f"{p}: directory holds no .json or .json.gz trace files")
    return files


def read_bytes(path: Path) -> bytes:
    """The trace's JSON bytes, gunzipped when the file is gzip (by magic, not name)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise TraceSourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(str(path), f"corrupt or truncated gzip ({exc})") from None
    return data


def rank_from_name(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def load_rank(path: Path, *, default_rank: int = 0) -> RankTrace:
    """Load one rank file. Rank: distributedInfo, else ``rank-N`` in the name, else default."""
    started = time.perf_counter()
    data = read_bytes(path)
    parsed = parse_bytes(data, str(path))
    dist = parsed.metadata.get("distributedInfo")
    rank, rank_source = None, "default"
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        rank, rank_source = dist["rank"], "distributedInfo"
    if rank is None:
        named = rank_from_name(path)
        if named is not None:
            rank, rank_source = named, "filename"
    if rank is None:
        rank = default_rank
    size = len(data)
    del data
    trace = build_rank_trace(parsed, source=str(path), rank=rank, rank_source=rank_source, bytes_read=size)
    if trace.events.empty and trace.memory.empty:
        raise TraceFormatError(str(path), "trace holds no timed events (nothing to analyse)")
    return replace(trace, meta=replace(trace.meta, load_seconds=time.perf_counter() - started))


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Load one job: a trace file, or a directory holding that job's rank files."""
    files = resolve(path)
    ranks = [load_rank(f, default_rank=i) for i, f in enumerate(files)]
    _check_distinct_ranks(ranks)
    ranks.sort(key=lambda r: r.rank)
    return Trace(source=str(path), ranks=tuple(ranks))


def _check_distinct_ranks(ranks: list[RankTrace]) -> None:
    seen: dict[int, RankTrace] = {}
    for r in ranks:
        other = seen.get(r.rank)
        if other is not None:
            raise TraceSourceError(
                f"{Path(other.meta.source).name} and {Path(r.meta.source).name} both claim rank {r.rank} "
                f"({other.meta.rank_source} / {r.meta.rank_source}); a directory must hold one job with one "
                "file per rank - analyse the files separately"
            )
        seen[r.rank] = r
