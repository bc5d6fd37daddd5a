"""The memory this process may use: the host's physical memory and its cgroup's limit, read once when the manifest
is written, so that CPU memory growth can be judged against them (``analyze.analyzers.memory``)."""

from __future__ import annotations

import os
from pathlib import Path


def physical_memory_bytes() -> int | None:
    """The host's physical memory (bytes), None where the platform does not say."""
    try:
        value = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return value if value > 0 else None


def cgroup_memory_limit_bytes(proc_cgroup: Path = Path("/proc/self/cgroup"),
                              root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The lowest memory limit of this process's cgroup (bytes: v2's ``memory.max``, v1's
    ``memory.limit_in_bytes``, at the process's own cgroup and at the mount's root); None where none is set ("max",
    or v1's page-rounded 2**63) or none can be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    candidates: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, where = parts
        where = where.strip().lstrip("/")
        if controllers == "":  # cgroup v2 (or the hybrid layout's unified hierarchy)
            for base in (root, root / "unified"):
                candidates += [base / where / "memory.max", base / "memory.max"]
        elif "memory" in controllers.split(","):
            candidates += [root / "memory" / where / "memory.limit_in_bytes", root / "memory" / "memory.limit_in_bytes"]
    limits = []
    for path in dict.fromkeys(candidates):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 1 << 62:  # "max", and v1's unlimited (2**63 rounded to pages)
            limits.append(int(text))
    return min(limits) if limits else None


def memory_facts() -> dict[str, int | None]:
    """``memory_bytes`` (the host's) and ``memory_limit_bytes`` (the cgroup's, where lower than the host's; else
    None) for the manifest's ``host``."""
    physical = physical_memory_bytes()
    limit = cgroup_memory_limit_bytes()
    return {"memory_bytes": physical,
            "memory_limit_bytes": limit if limit is not None and (physical is None or limit < physical) else None}
