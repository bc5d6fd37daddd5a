"""Stream a trace file through the compiled columnar scanner, in fixed-size chunks.

Memory stays bounded by one chunk plus the columns (~25-60 bytes per event, against 250-450 bytes
of JSON per event): a trace never has to fit in memory as text, and gzip is decompressed chunk by
chunk into the same reused buffer. ``None`` means "use the reference decoder": the extension is
not built, ``KINETOSCOPE_DECODER=reference`` is set, or the scanner met something it does not
handle exactly like the reference (odd types, invalid JSON, ...), which then decides and reports.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from typing import BinaryIO

import msgspec

from kinetoscope.analyze.limits import DEFAULT_LIMITS, LoadLimits
from kinetoscope.analyze.raw import RawColumns, from_scanner
from kinetoscope.errors import TraceFormatError, TraceSourceError

try:
    from kinetoscope.analyze import _scan
except ImportError:  # built without a C compiler: the reference decoder does all the work
    _scan = None  # type: ignore[assignment]

#: bytes handed to the scanner per call; an event cut at the end is carried to the next chunk
CHUNK_BYTES = 8 * 2**20
_BOM = b"\xef\xbb\xbf"
_any = msgspec.json.Decoder()


def available() -> bool:
    """Whether the compiled scanner is used (built, and not switched off)."""
    return _scan is not None and os.environ.get("KINETOSCOPE_DECODER", "") != "reference"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class _Bail(Exception):
    pass


def scan_file(path: Path, limits: LoadLimits = DEFAULT_LIMITS) -> tuple[RawColumns, int] | None:
    """Columns and JSON byte count of a trace file (plain or gzip, by magic), or None (see module)."""
    if not available():
        return None
    try:
        with open(path, "rb", buffering=0) as fh:
            gz = fh.read(2) == b"\x1f\x8b"
            fh.seek(0)
            size = os.fstat(fh.fileno()).st_size
            if not gz and size > limits.max_decompressed_bytes:
                raise TraceFormatError(str(path), f"file is {_gib(size)}, above the "
                                       f"{_gib(limits.max_decompressed_bytes)} limit")
            if gz:
                with gzip.GzipFile(fileobj=fh) as stream:
                    return _scan_stream(stream, str(path), limits)
            return _scan_stream(fh, str(path), limits)
    except OSError as exc:
        if isinstance(exc, (gzip.BadGzipFile, EOFError)) or "gzip" in str(exc).lower():
            return None  # corrupt gzip: the reference path reports it
        raise TraceSourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (EOFError, zlib.error, _Bail):
        return None


def scan_bytes(data: bytes, source: str, limits: LoadLimits = DEFAULT_LIMITS) -> tuple[RawColumns, int] | None:
    """The same for a document already in memory (uploads): plain JSON bytes."""
    if not available():
        return None
    try:
        return _scan_stream(io.BytesIO(data), source, limits)
    except _Bail:
        return None


def _scan_stream(stream: BinaryIO, source: str, limits: LoadLimits) -> tuple[RawColumns, int]:
    scanner = _scan.Scanner(max_depth=limits.max_depth)
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    have = total = 0
    first = True
    try:
        while True:
            if have == len(buf):  # one item larger than the buffer: grow it
                view.release()
                buf.extend(bytes(len(buf)))
                view = memoryview(buf)
            got = stream.readinto(view[have:]) or 0  # type: ignore[attr-defined]
            total += got
            if total > limits.max_decompressed_bytes:
                raise TraceFormatError(source, f"decompresses to more than the {_gib(limits.max_decompressed_bytes)} "
                                       "limit (a gzip bomb, or raise the limit with --max-size)")
            have += got
            start = 0
            if first and have >= 3:
                first = False
                if view[:3] == _BOM:
                    start = 3
            used = scanner.feed(view[start:have], got == 0)
            if used < 0:
                raise _Bail(scanner.reason)
            if scanner.n > limits.max_events:
                raise TraceFormatError(source, f"more than {limits.max_events:,} events, above the limit (max_events)")
            if got == 0:
                break
            used += start
            rest = have - used
            if rest:
                buf[:rest] = view[used:have]
            have = rest
    finally:
        view.release()
    out = scanner.finish()
    del scanner, buf
    metadata = {key: _any.decode(raw) for key, raw in out.pop("meta")}
    return from_scanner(out, metadata), total
