"""Settings of the process a ``kinetoscope`` command owns, applied by its entry point (``kinetoscope.cli.run``) and
nowhere in the library: the BLAS thread pool, glibc's malloc arenas and free pages, pandas imported without pyarrow.
A library caller (``kinetoscope.cli.main``, the app, batch, a notebook) keeps its process as it is. No imports beyond
the standard library: the command calls it before anything else. Where the C library is not glibc, the heap functions
do nothing."""

from __future__ import annotations

import functools
import os
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


def quiet_blas() -> None:
    """One BLAS thread: the analyses do no linear algebra worth a pool, and OpenBLAS's idle threads spin on the cores
    the scanner uses (~5% of a 2-core run). Must run before numpy is first imported."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _pandas_major() -> int | None:
    """The installed pandas' major version, read from its dist-info folder's name without importing it (a few ms,
    where importlib.metadata costs ~25); None when it cannot be told."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("pandas")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    found = Path(spec.origin).parent.parent.glob("pandas-*.dist-info")
    majors = {p.name.split("-")[1].split(".")[0] for p in found}
    return int(majors.pop()) if len(majors) == 1 and next(iter(majors)).isdigit() else None


def import_pandas_without_pyarrow() -> bool:
    """In a process the command owns (never a library caller's: pandas would believe pyarrow missing for the rest of
    it), import pandas as on an install without pyarrow, when neither is imported yet and pandas is 3.x (2.x's
    pyarrow hooks break when it is blocked). pyarrow is optional (``app`` and ``cluster`` extras) and the analyses
    never need it; importing it with pandas costs ~0.15 s of CPU and ~38 MB of memory. True if it did."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules or (_pandas_major() or 0) < 3:
        return False
    sys.modules["pyarrow"] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        import pandas  # noqa: F401
    finally:
        if "pyarrow" in sys.modules and sys.modules["pyarrow"] is None:
            del sys.modules["pyarrow"]
    return True
