"""Atomic file writes, shared by capture and batch: readers never see half a file under its final name."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def _new_file(directory: Path, prefix: str) -> str:
    """Create an empty file with a unique name, mode 0666 less the process umask (applied by the kernel:
    the umask is never read or changed here, so no other thread sees it move)."""
    for _ in range(100):
        name = os.path.join(directory, f"{prefix}{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return name
    raise FileExistsError(f"{directory}: no free temporary name")


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``, on failure removed."""
    tmp = _new_file(path.parent, f".{path.name}.")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_target(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one we may not signal counts as alive); 0 names no process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
