"""The C heap of this process (glibc's malloc), for the command that owns the process: where it is not glibc,
each function does nothing. No imports beyond the standard library: the command calls it before anything else."""

from __future__ import annotations

import functools
import sys
from typing import Any

#: glibc's malloc.h
_M_ARENA_MAX = -8


@functools.lru_cache(maxsize=1)
def _glibc() -> Any | None:
    """The interpreter's own C library when it is glibc on Linux, else None (macOS, Windows; musl lacks these);
    looked up once per process."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, TypeError):
        return None


def one_malloc_arena() -> bool:
    """Ask glibc to serve every thread from one malloc arena (``mallopt(M_ARENA_MAX, 1)``); True if it took.

    The scanner's threads grow their columns with malloc; by default each thread gets its own arena, and
    what a scanner thread frees stays in its arena while the main thread's tables grow in another: the
    process's peak was ~20% higher (441 against 370 MB on a 358 MB trace). For a command's own process
    (the ``kinetoscope`` command, ``cli.run``), called before any thread starts; a library must not change it for
    its host."""
    libc = _glibc()
    return bool(libc.mallopt(_M_ARENA_MAX, 1)) if libc is not None else False


def give_back_free_memory() -> None:
    """Return the C heap's free pages to the system (glibc ``malloc_trim``), e.g. once a trace's raw columns are
    dropped: freed, they stay resident, and the analyses' larger arrays come from fresh pages beside them (peak
    232 -> 223 MiB on a 223 MB trace)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
