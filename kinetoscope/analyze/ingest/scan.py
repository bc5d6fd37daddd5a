"""Stream a trace file through the compiled columnar scanner, in fixed-size chunks.

Memory stays bounded by one chunk per scanning thread plus the columns (~60 bytes per event,
against 250-450 bytes of JSON per event): a trace never has to fit in memory as text, and gzip is
decompressed chunk by chunk on a second thread into two reused buffers. Plain files from 48 MiB are
scanned as two halves on two threads. ``None`` means "use the reference decoder": the extension is
not built, ``LoadLimits.decoder`` is "reference" (the command's ``KINETOSCOPE_DECODER=reference``), or the
scanner met something it does not handle exactly like the reference (odd types, invalid JSON, ...), which then
decides and reports.
"""

from __future__ import annotations

import gzip
import io
import os
import queue
import re
import threading
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, cast

from kinetoscope.analyze.ingest.limits import (
    DEFAULT_LIMITS,
    EXECUTION_TRACE,
    LoadLimits,
    decompressed_too_large,
    file_too_large,
    inflates_too_much,
    too_many_events,
)
from kinetoscope.errors import TraceFormatError, TraceSourceError

if TYPE_CHECKING:
    from kinetoscope.analyze.ingest.jobs import TraceFile
    from kinetoscope.analyze.ingest.raw import RawColumns
# numpy and the columns (kinetoscope.analyze.ingest.raw) are imported where the scanner's output is turned into
# columns, not here: scanning can then start before they are imported (``Ahead``)

try:
    from kinetoscope.analyze.ingest import _scan
except ImportError:  # built without a C compiler: the reference decoder does all the work
    _scan = None  # type: ignore[assignment]
try:  # ISA-L's inflate: gunzips a trace 2-4x faster than zlib, leaving the cores to the scanner
    from isal.igzip import IGzipFile as _GzipFile
    from isal.isal_zlib import error as _isal_error

    _inflate_error = cast(type[Exception], _isal_error)  # isal's stub declares an instance, not the class
except ImportError:  # not installed (it is a dependency; a platform without its wheel): zlib
    _GzipFile = gzip.GzipFile  # type: ignore[assignment,misc]
    _inflate_error = zlib.error

#: bytes handed to the scanner per call; an event cut at the end is carried to the next chunk
CHUNK_BYTES = 8 * 2**20
_BOM = b"\xef\xbb\xbf"


def available(limits: LoadLimits = DEFAULT_LIMITS) -> bool:
    """Whether the compiled scanner is used (built, and not switched off by ``limits.decoder``)."""
    return _scan is not None and limits.decoder != "reference"


class _Bail(Exception):
    pass


class Unhandled(Exception):
    """Valid JSON the scanner does not handle exactly (odd types, repeated keys, ...): the reference decoder
    takes the file, within ``LoadLimits.max_fallback_bytes``. The message is the scanner's reason."""


#: what the scanner finds wrong with a document is final: the reference decoder would refuse it too, after
#: holding the whole file in memory (a 2 MB gzip of zeros gunzips to gigabytes)
_FINAL = {
    "the document is empty": "file is empty",
    "not a JSON object or array": "not a JSON trace (expected '{' or '[' at the start)",
    "the document ends early": "the JSON ends early (a truncated file: an interrupted copy or a crashed writer)",
    "data after the JSON document": "extra data after the JSON document: two traces concatenated?",
    "traceEvents is not a list": "'traceEvents' is not a list",
    "a JSON document without traceEvents": "JSON object without 'traceEvents': not a Chrome/Kineto trace",
    "top-level metadata over 4 MiB": "more than 4 MiB of top-level values besides 'traceEvents' (a profiler writes "
                                     "a few KiB there): not a Chrome/Kineto trace",
}
# (invalid UTF-8 in a value the analyses skip, such as an argument, and out-of-range numbers are not final: the
# reference decoder accepts them there, and a file it accepts must not be refused; the fallback's size cap
# bounds what that costs. In a name, category or other decoded string, invalid UTF-8 is final.)
_INVALID = frozenset({"bad number", "bad literal", "bad escape", "bad \\u escape", "control character in a string",
                      "expected ':'", "expected a key", "expected ',' or a closing bracket",
                      "expected ',' or ']' in traceEvents", "expected ',' or '}' at the top level",
                      "invalid UTF-8 in a decoded string"})


def _verdict(reason: str, source: str, limits: LoadLimits) -> Exception:
    """The scanner's reason to stop: a final refusal, or ``Unhandled`` (the reference decoder's turn)."""
    if reason in _FINAL:
        return TraceFormatError(source, _FINAL[reason])
    if reason in _INVALID:
        return TraceFormatError(source, f"not valid JSON ({reason})")
    if reason == "nesting deeper than max_depth":
        return TraceFormatError(source, f"JSON nested deeper than {limits.max_depth} levels (limit max_depth)")
    return Unhandled(reason)


def scan_file(path: TraceFile, limits: LoadLimits = DEFAULT_LIMITS) -> tuple[RawColumns, int] | None:
    """Columns and JSON byte count of a trace file (plain or gzip, by magic); None when the scanner is not
    built. Raises TraceFormatError for what is wrong with the file, ``Unhandled`` for valid JSON the
    reference decoder must take."""
    if not available(limits):
        return None
    try:
        # a store's object is a stream of ranged reads (kinetoscope.sources), never downloaded whole
        with cast(BinaryIO, path.open("rb", buffering=0)) as fh:
            gz = fh.read(2) == b"\x1f\x8b"
            fh.seek(0)
            size = os.fstat(fh.fileno()).st_size if isinstance(path, Path) else path.stat().st_size
            if not gz and size > limits.max_decompressed_bytes:
                raise file_too_large(str(path), size, limits)
            if not gz and size > TAIL_CHECK_MIN_BYTES:
                _check_tail(fh, size, str(path))
            if gz:  # gunzip on a second thread while the scanner (which runs without the GIL) scans
                with _GzipFile(fileobj=fh) as stream, _Prefetch(_RatioGuard(stream, fh, str(path))) as ahead:
                    return _finish(_feed(_scan.Scanner(max_depth=limits.max_depth), ahead, str(path), limits))
            if size >= PARALLEL_MIN_BYTES and (os.cpu_count() or 1) > 1 and isinstance(path, Path):
                return _scan_halves(fh, size, str(path), limits)
            return _finish(_feed(_scan.Scanner(max_depth=limits.max_depth), fh, str(path), limits))
    except _Bail as bail:
        raise _verdict(str(bail), str(path), limits) from None
    except TraceFormatError:
        raise
    except EOFError:
        # (ISA-L says the same of bytes after the last gzip member that are not gzip)
        raise TraceFormatError(str(path), "corrupt or truncated gzip (the stream ends early, or what follows it "
                               "is not gzip)") from None
    except (gzip.BadGzipFile, zlib.error, _inflate_error) as exc:
        raise TraceFormatError(str(path), f"corrupt or truncated gzip ({exc})") from None
    except OSError as exc:
        raise TraceSourceError(f"{path}: cannot read ({exc.strerror or exc})") from None


def scan_bytes(data: bytes, source: str, limits: LoadLimits = DEFAULT_LIMITS) -> tuple[RawColumns, int] | None:
    """The same for a document already in memory (uploads): plain JSON bytes."""
    if not available(limits):
        return None
    try:
        return _finish(_feed(_scan.Scanner(max_depth=limits.max_depth), io.BytesIO(data), source, limits))
    except _Bail as bail:
        raise _verdict(str(bail), source, limits) from None


class Ahead:
    """``scan_file`` on a thread, started before the analyses' imports: the scanner runs without the GIL, so
    the interpreter importing pandas on one core costs the scan on the other little, and a command's start-up
    hides behind its reading. ``result()`` returns what ``scan_file`` returned or raises what it raised."""

    def __init__(self, path: TraceFile, limits: LoadLimits = DEFAULT_LIMITS) -> None:
        self.path, self.limits = path, limits
        self._out: tuple[RawColumns, int] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kinetoscope-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._out = scan_file(self.path, self.limits)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by result()
            self._error = exc

    def result(self) -> tuple[RawColumns, int] | None:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        out, self._out = self._out, None  # handed over once: the columns are not held here as well
        return out


#: a plain file this large is checked for a cut-off end before it is read (a truncated 500 MB file is refused
#: at once, not after scanning 500 MB)
TAIL_CHECK_MIN_BYTES = 8 * 2**20


def _check_tail(fh: BinaryIO, size: int, source: str) -> None:
    """A JSON document ends with '}' or ']' (then whitespace): anything else there is a cut-off file."""
    fh.seek(max(0, size - 4096))
    tail = fh.read(4096).rstrip(b" \t\r\n")
    fh.seek(0)
    if tail and tail[-1:] not in (b"}", b"]"):
        raise TraceFormatError(source, _FINAL["the document ends early"])


#: one JSON value (an event, or a top-level key's value) the scanner holds whole: a profiler's events are
#: bytes to kilobytes; past this a file is not a trace, and holding it would cost memory without bound
MAX_ITEM_BYTES = 16 * 2**20
# (the scanner itself refuses a file whose events average under 24 bytes of JSON, checked from a million
# events on: its columns, ~40-80 bytes an event, would outgrow the file several-fold)


def _too_small_events(source: str, n: int, total: int) -> TraceFormatError:
    return TraceFormatError(source, f"{n:,} events within the first {total / 2**20:.1f} MiB, under 24 bytes each where "
                            "a profiler's events take 50+: not a Chrome/Kineto trace")


def _refuse_execution_trace(head: bytes, source: str) -> None:
    """A PyTorch execution trace (``{"schema": ..., "nodes": [...]}``) gets its own refusal."""
    if head.lstrip(_BOM + b" \t\r\n")[:1] == b"{" and b'"schema"' in head and b'"nodes"' in head:
        raise TraceFormatError(source, EXECUTION_TRACE)


class _RatioGuard:
    """A gunzipping stream that refuses to inflate past MAX_GZIP_RATIO (a bomb of zeros or spaces is refused
    after 64 MiB of output, not after gunzipping gigabytes)."""

    def __init__(self, stream: Any, raw: Any, source: str) -> None:
        self._stream, self._raw, self._source, self._out = stream, raw, source, 0

    def readinto(self, view: Any) -> int:
        n = self._stream.readinto(view)
        self._out += n
        refusal = inflates_too_much(self._source, self._out, self._raw.tell())
        if refusal is not None:
            raise refusal
        return n


class _Prefetch:
    """Reads the next chunk of ``stream`` on a thread while the caller scans the current one."""

    _END = object()

    def __init__(self, stream: Any, chunk: int = CHUNK_BYTES) -> None:
        self._stream = stream
        self._ready: queue.Queue[Any] = queue.Queue()
        self._free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(2):
            self._free.put(bytearray(chunk))
        self._stop = threading.Event()
        self._current: memoryview | None = None
        self._buf: bytearray | None = None
        self._pos = 0
        self._thread = threading.Thread(target=self._run, name="kinetoscope-read", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                buf = self._free.get()
                if self._stop.is_set():
                    break
                n = self._stream.readinto(buf)
                if not n:
                    self._ready.put(self._END)
                    return
                self._ready.put((buf, n))
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread, raised there
            self._ready.put(exc)

    def readinto(self, view: memoryview) -> int:
        if self._current is None:
            item = self._ready.get()
            if item is self._END:
                self._ready.put(item)
                return 0
            if isinstance(item, BaseException):
                raise item
            self._buf, n = item
            self._current, self._pos = memoryview(self._buf)[:n], 0
        n = min(len(view), len(self._current) - self._pos)
        view[:n] = self._current[self._pos:self._pos + n]
        self._pos += n
        if self._pos == len(self._current):
            self._current.release()
            self._current = None
            self._free.put(self._buf)  # type: ignore[arg-type]
        return n

    def __enter__(self) -> _Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._free.put(bytearray(0))  # wake the reader if it waits for a buffer
        self._thread.join()


class _Stop(Exception):
    """The second half's scanner ends early (its start was not an item boundary after all)."""


class _Readable(Protocol):
    def readinto(self, view: memoryview, /) -> int: ...


def _feed(scanner: Any, stream: BinaryIO | _Readable, source: str, limits: LoadLimits, *, stop: int | None = None,
          final: bool = True, done: int = 0) -> tuple[Any, int]:
    """Feed ``stream`` (up to ``stop`` bytes of it) through ``scanner`` in chunks; (scanner, bytes fed).

    ``final``: the stream ends the document. Otherwise every byte must be consumed, ending just
    before an item of traceEvents (checked by the caller through ``scanner.at_item``).
    """
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    have, total = 0, 0
    head = b""
    try:
        while True:
            if have == len(buf):  # one item larger than the buffer: grow it
                if len(buf) >= MAX_ITEM_BYTES:
                    _refuse_execution_trace(head, source)
                    raise TraceFormatError(source, f"one JSON value (an event, or a top-level key's value) of more "
                                           f"than {MAX_ITEM_BYTES // 2**20} MiB: not a Chrome/Kineto trace")
                view.release()
                buf.extend(bytes(len(buf)))
                view = memoryview(buf)
            want = len(buf) - have if stop is None else min(len(buf) - have, stop - total)
            # typeshed's BinaryIO has no readinto (a file opened "rb" and the readers here have it)
            got = (stream.readinto(view[have:have + want]) or 0) if want else 0  # type: ignore[union-attr]
            total += got
            if not head:
                head = bytes(view[:min(have + got, 4096)])
            if done + total > limits.max_decompressed_bytes:
                raise decompressed_too_large(source, limits)
            have += got
            last = got == 0
            used = scanner.feed(view[:have], final and last)
            if used < 0:
                if scanner.reason == "events average under 24 bytes":
                    raise _too_small_events(source, scanner.n, done + total)
                if scanner.reason in ("a JSON document without traceEvents", "top-level metadata over 4 MiB"):
                    _refuse_execution_trace(head, source)
                raise _Bail(scanner.reason)
            if scanner.n > limits.max_events:
                raise too_many_events(source, limits)
            if last:
                if not final and used != have:
                    raise _Stop
                break
            rest = have - used
            if rest:
                buf[:rest] = view[used:have]
            have = rest
    finally:
        view.release()
    return scanner, total


def _metadata(items: list[tuple[str, bytes]]) -> dict[str, Any]:
    """The other top-level keys (validated by the scanner), decoded; anything odd: the reference decides."""
    import msgspec  # here, not at the top: the scan starts ~12 ms sooner (a command imports this module first)

    try:
        return {key: msgspec.json.decode(raw) for key, raw in items}
    except (msgspec.DecodeError, RecursionError) as exc:
        raise Unhandled(f"top-level metadata: {exc}") from None


def _columns(out: dict[str, Any]) -> RawColumns:
    from kinetoscope.analyze.ingest.raw import from_scanner

    return from_scanner(out, _metadata(out.pop("meta")))


def _finish(fed: tuple[Any, int]) -> tuple[RawColumns, int]:
    scanner, total = fed
    return _columns(scanner.finish()), total


#: plain files from this size are scanned as two halves on two cores
PARALLEL_MIN_BYTES = 48 * 2**20
#: an item boundary inside traceEvents: the end of one event object, a comma, the next one's start
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def _scan_halves(fh: BinaryIO, size: int, source: str, limits: LoadLimits) -> tuple[RawColumns, int]:
    """Scan the two halves of a plain file at once (the scanner runs without the GIL).

    The second scanner starts at a guessed item boundary past the middle; the guess holds only if
    the first scanner, parsing from the true start, ends exactly there, in traceEvents, expecting an
    item. Otherwise the second half's work is dropped and the first scanner simply carries on.
    """
    fh.seek(0)
    head = fh.read(64).lstrip(_BOM + b" \t\r\n")
    fh.seek(size // 2)
    m = _BOUNDARY.search(fh.read(4 * 2**20))
    if not m or head[:1] not in (b"{", b"["):
        fh.seek(0)
        return _finish(_feed(_scan.Scanner(max_depth=limits.max_depth), fh, source, limits))
    cut = size // 2 + m.end() - 1
    resume = 2 if head[:1] == b"[" else 1
    second: dict[str, Any] = {}

    def run_second() -> None:
        try:
            with open(fh.name, "rb", buffering=0) as other:
                other.seek(cut)
                second["fed"] = _feed(_scan.Scanner(max_depth=limits.max_depth, resume=resume), other, source,
                                      limits, done=cut)
        except Exception as exc:  # noqa: BLE001 - any failure just means "no second half"
            second["error"] = exc

    worker = threading.Thread(target=run_second, name="kinetoscope-scan", daemon=True)
    worker.start()
    first = _scan.Scanner(max_depth=limits.max_depth)
    fh.seek(0)
    try:
        _feed(first, fh, source, limits, stop=cut, final=False)
        landed = first.at_item
    except _Stop:
        landed = False
    finally:
        worker.join()
    if not landed:  # the guess was inside something else: scan the file in one pass after all
        fh.seek(0)
        return _finish(_feed(_scan.Scanner(max_depth=limits.max_depth), fh, source, limits))
    if "fed" not in second:
        fh.seek(cut)  # the first scanner is exactly at the cut: it carries on alone
        _, rest = _feed(first, fh, source, limits, done=cut)
        return _finish((first, cut + rest))
    a, b = first.finish(), second["fed"][0].finish()
    if a["n"] + b["n"] > limits.max_events:  # each half checked only its own count
        raise too_many_events(source, limits, a["n"] + b["n"])
    return _columns(_merge(a, b)), cut + second["fed"][1]


def _remap(values: list[Any], more: list[Any]) -> tuple[list[Any], Any]:
    """Append ``more``'s new values to ``values``; the code of each of ``more`` in the merged list."""
    import numpy as np

    codes = {(type(v), v): i for i, v in enumerate(values)}
    merged = list(values)
    out = np.empty(len(more), dtype=np.int32)
    for i, v in enumerate(more):
        code = codes.get((type(v), v))
        if code is None:
            code = codes[(type(v), v)] = len(merged)
            merged.append(v)
        out[i] = code
    return merged, out


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One scanner's output from two: b's codes re-mapped into a's tables, b's events after a's.
    Each input column is dropped as soon as its merged column exists (the peak is one column)."""
    import numpy as np

    from kinetoscope.analyze.ingest.raw import STRING_FIELD_IDS

    strings, smap = _remap(a.pop("strings"), b.pop("strings"))
    idents, imap = _remap(a.pop("idents"), b.pop("idents"))
    n = a["n"]
    remap = {"ph": smap, "name": smap, "cat": smap, "c_series": smap, "pid": imap, "tid": imap}
    dtypes = {"ph": np.int32, "name": np.int32, "cat": np.int32, "ts": np.float64, "dur": np.float64,
              "pid": np.int32, "tid": np.int32, "f_event": np.int64, "f_id": np.uint8, "f_value": np.int64,
              "c_event": np.int64, "c_series": np.int32, "c_value": np.float64}
    b_fid = np.frombuffer(b["f_id"], dtype=np.uint8)
    names = np.isin(b_fid, list(STRING_FIELD_IDS))  # string codes, re-mapped like the other strings
    out: dict[str, Any] = {"n": n + b["n"], "strings": strings, "idents": idents}
    for key, dtype in dtypes.items():
        right = np.frombuffer(b.pop(key), dtype=dtype)
        if key in remap:
            right = remap[key][right]
        elif key in ("f_event", "c_event"):
            right = right + n
        elif key == "f_value" and names.any():
            right = right.copy()
            right[names] = smap[right[names]]
        out[key] = np.concatenate([np.frombuffer(a.pop(key), dtype=dtype), right])
        del right
    out["odd"] = a["odd"] + [(e + n, f, v) for e, f, v in b["odd"]]
    out["marks"] = a.get("marks", []) + [(e + n, v) for e, v in b.get("marks", [])]
    out["shapes"] = a.get("shapes", []) + [(e + n, v) for e, v in b.get("shapes", [])]
    out["meta"] = a["meta"] + b["meta"]
    return out
