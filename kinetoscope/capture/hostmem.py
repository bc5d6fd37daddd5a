"""The memory this process may use: the host's physical memory and its cgroup's limit, read once when the manifest
is written, so that CPU memory growth can be judged against them (``analyze.analyzers.memory``). Nothing here may
stop a capture: an unreadable or odd file is no limit."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

#: v1's "unlimited": 2**63 rounded down to pages; anything this large is no limit
_UNLIMITED = 1 << 62


def physical_memory_bytes() -> int | None:
    """The host's physical memory (bytes), None where the platform does not say."""
    try:
        value = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return value if value > 0 else None


def _number(path: Path, key: str | None = None) -> int | None:
    """A limit read from ``path`` (its whole content, or the value of ``key`` in a ``key value`` listing): ASCII
    digits only, under v1's unlimited; None otherwise."""
    try:
        text = path.read_bytes().decode("ascii", errors="replace")
    except OSError:
        return None
    if key is not None:
        text = next((line.split()[1] for line in text.splitlines()
                     if len(line.split()) == 2 and line.split()[0] == key), "")
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if 0 < value < _UNLIMITED else None


def _ancestors(where: str) -> list[PurePosixPath]:
    """The cgroup ``where`` and each cgroup above it, up to the hierarchy's root (``.``)."""
    path = PurePosixPath(where.strip().lstrip("/") or ".")
    return [path, *path.parents] if str(path) != "." else [path]


def cgroup_memory_limit_bytes(proc_cgroup: Path = Path("/proc/self/cgroup"),
                              root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The lowest memory limit on this process's cgroup path (bytes): v2's ``memory.max`` at its cgroup and each one
    above it (a Slurm job's limit sits above its tasks'), v1's ``hierarchical_memory_limit`` (the lowest on the path)
    and ``memory.limit_in_bytes`` along it; None where none is set ("max", v1's unlimited) or none can be read."""
    try:
        lines = proc_cgroup.read_bytes().decode("ascii", errors="replace").splitlines()
    except OSError:
        lines = []
    limits: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, where = parts
        if controllers == "":  # cgroup v2 (or the hybrid layout's unified hierarchy)
            for base in (root, root / "unified"):
                limits += [v for p in _ancestors(where) if (v := _number(base / p / "memory.max")) is not None]
        elif "memory" in controllers.split(","):
            base = root / "memory"
            own = base / PurePosixPath(where.strip().lstrip("/") or ".")
            limits += [v for v in (_number(own / "memory.stat", "hierarchical_memory_limit"),) if v is not None]
            limits += [v for p in _ancestors(where) if (v := _number(base / p / "memory.limit_in_bytes")) is not None]
    return min(limits) if limits else None


def memory_facts() -> dict[str, int | None]:
    """``memory_bytes`` (the host's) and ``memory_limit_bytes`` (the cgroup's, where lower than the host's; else
    None) for the manifest's ``host``; both None where reading them fails in any way."""
    try:
        physical = physical_memory_bytes()
        limit = cgroup_memory_limit_bytes()
    except Exception:  # noqa: BLE001 - a manifest is worth more than these two numbers
        return {"memory_bytes": None, "memory_limit_bytes": None}
    return {"memory_bytes": physical,
            "memory_limit_bytes": limit if limit is not None and (physical is None or limit < physical) else None}
