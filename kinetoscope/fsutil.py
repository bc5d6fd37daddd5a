"""Atomic file writes, shared by capture and batch: readers never see half a file under its final name."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``, on failure removed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_target(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
