"""Find the jobs under some roots: rank files of one job are grouped, a lone trace is a job of one rank."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from kinetoscope.analyze.ingest.jobs import TraceFile
from kinetoscope.analyze.ingest.loader import Job, is_trace_file
from kinetoscope.errors import TraceSourceError
from kinetoscope.hangdump import HANG_SUFFIX
from kinetoscope.sources import RemotePath, trace_path

_RANK = re.compile(r"rank[-_]?\d+", re.IGNORECASE)


def _group_key(name: str) -> str | None:
    """Files of one job differ only in their rank number: ``x.rank-3.json`` -> ``x.rank-*.json``."""
    return _RANK.sub("rank-*", name) if _RANK.search(name) else None


def _folders(root: TraceFile) -> Iterator[tuple[TraceFile, list[tuple[TraceFile, bool]]]]:
    """Each folder under ``root`` with its entries (and whether each is a file), as ``os.walk`` orders them; a store
    is listed once, recursively (its objects keep what the listing said of them: ``RemotePath.listed``)."""
    if isinstance(root, RemotePath):
        try:
            listed = root.walk()
        except OSError as exc:
            raise TraceSourceError(f"{root}: cannot list ({exc.strerror or exc})") from None
        for folder, entries in listed.items():
            yield folder, [(p, True) for p, _ in entries]
        return
    for here, dirs, files in os.walk(root):
        dirs.sort()
        yield Path(here), [(Path(here) / name, (Path(here) / name).is_file()) for name in sorted(files)]


def discover(roots: list[str | os.PathLike[str]]) -> list[Job]:
    """Every job under the roots, in a stable order. Files named with a rank (``rank-N``) that share the
    rest of their name in one directory form one job; any other trace file is a job of its own. A root may be a
    URL (``kinetoscope.sources``)."""
    jobs: list[Job] = []
    for given in roots:
        root = trace_path(given)
        try:
            exists = root.exists()
            is_file = exists and root.is_file()
        except OSError as exc:  # a store that cannot be reached or read
            raise TraceSourceError(f"{root}: cannot read ({exc.strerror or exc})") from None
        if not exists:
            raise TraceSourceError(f"{root}: no such file or directory")
        if is_file:
            jobs.append(Job(str(root), (root,)))
            continue
        for here, listed in _folders(root):
            files = [p.name for p, _ in listed]
            by_name = {p.name: p for p, _ in listed}
            groups: dict[str, list[TraceFile]] = {}
            for path, is_file in listed:
                name = path.name
                if not is_trace_file(path, is_file=is_file):
                    continue
                key = _group_key(name)
                if key is None:
                    jobs.append(Job(str(path), (path,)))
                else:
                    groups.setdefault(key, []).append(path)
            dumps = tuple(by_name[n] for n in sorted(files) if n.endswith(HANG_SUFFIX) and not n.startswith("."))
            found: list[Job] = []
            for key, paths in sorted(groups.items()):
                if len(paths) == 1:
                    name = str(paths[0])
                else:
                    name = str(here) if len(groups) == 1 else str(here / key)
                found.append(Job(name, tuple(paths)))
            if dumps:  # a folder's hang dumps go with its (last) job of rank files, or make a job of their own
                if found:
                    found[-1] = Job(found[-1].name, found[-1].files, dumps)
                else:
                    found.append(Job(str(here), (), dumps))
            jobs.extend(found)
    return jobs
