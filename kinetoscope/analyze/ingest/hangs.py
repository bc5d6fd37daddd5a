"""The ranks' hang dumps (``rank-<r>.hang.json``, ``kinetoscope.hangdump``) read back: JSON only, under the limits.

A pickle is refused with one line (torch's own flight recorder dumps are pickles; nothing here unpickles). A dump
that does not decode as the contract is a one-line error naming the file.
"""

from __future__ import annotations

import msgspec

from kinetoscope.analyze.ingest.jobs import TraceFile
from kinetoscope.analyze.ingest.limits import DEFAULT_LIMITS, LoadLimits, size_text
from kinetoscope.errors import TraceSourceError
from kinetoscope.hangdump import PICKLE_MAGIC, PICKLE_REFUSED, HangDump


def read_hang_dump(path: TraceFile, limits: LoadLimits = DEFAULT_LIMITS) -> HangDump:
    try:
        size = path.stat().st_size
        if size > limits.max_decompressed_bytes:
            raise TraceSourceError(f"{path}: hang dump of {size_text(size)} is over the "
                                   f"{size_text(limits.max_decompressed_bytes)} limit (--max-size)")
        data = path.read_bytes()
    except OSError as exc:
        raise TraceSourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data[:1] == PICKLE_MAGIC:
        raise TraceSourceError(f"{path}: {PICKLE_REFUSED}")
    try:
        return msgspec.json.decode(data, type=HangDump)
    except msgspec.DecodeError as exc:
        raise TraceSourceError(f"{path}: not a Kinetoscope hang dump ({exc})") from None


def read_hang_dumps(paths: tuple[TraceFile, ...], limits: LoadLimits = DEFAULT_LIMITS) -> tuple[HangDump, ...]:
    """Each rank's dump, by rank; two files claiming one rank are an error."""
    dumps: dict[int, tuple[TraceFile, HangDump]] = {}
    for path in paths:
        dump = read_hang_dump(path, limits)
        if dump.rank in dumps:
            raise TraceSourceError(f"{dumps[dump.rank][0].name} and {path.name} are both the hang dump of rank "
                                   f"{dump.rank}: a directory holds one job")
        dumps[dump.rank] = (path, dump)
    return tuple(d for _, (_, d) in sorted(dumps.items()))
