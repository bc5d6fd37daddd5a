"""Capture artifacts: gzipped traces written atomically, a manifest, step timings.

The artifact is a contract with ``kinetoscope.analyze``: per rank,
``rank-<r>.step-<a>-<b>.pt.trace.json.gz`` (Kineto JSON, gzip, with the loop's marks spliced in) and
``rank-<r>.manifest.json``; always-on step timings in ``rank-<r>.steps.json``. Sidecars pass through the
project's redaction (``kinetoscope.analyze.ingest.redact``: numpy and the standard library) before they are written:
a secret on the command line never reaches the disk.
"""

from __future__ import annotations

import gzip
import itertools
import logging
import os
import platform
import queue
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from kinetoscope.fsutil import atomic_target, atomic_write, pid_alive
from kinetoscope.manifest import Manifest, StepTimes, manifest_name, step_times_name

if TYPE_CHECKING:
    from kinetoscope.capture.loop import WindowMarks

log = logging.getLogger("kinetoscope.capture")

#: 2: the ``loop`` object (loop marks, contract version ``loop.marks``)


def trace_name(rank: int, first_step: int, last_step: int) -> str:
    return f"rank-{rank}.step-{first_step}-{last_step}.pt.trace.json.gz"


#: how far into a raw export the "traceEvents" key is looked for (Kineto writes its metadata first)
_HEAD_BYTES = 4 * 2**20
_CHUNK = 8 * 2**20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def finish_trace(raw_path: Path, final_path: Path, *, extra_events: list[dict[str, Any]],
                 distributed_info: dict[str, Any] | None, marks: WindowMarks | None = None) -> None:
    """Add telemetry counters, the loop's marks and missing distributedInfo to a raw export, gzip it, rename
    atomically.

    Streamed in bounded memory: the additions are spliced into the JSON text (the counters and marks right after
    ``"traceEvents": [``, distributedInfo right after the opening brace) and the file is copied through
    gzip in 8 MiB chunks; the trace is never decoded. The marks' host times are placed on the trace's clock
    through the window's ProfilerStep spans (found by a first pass over the text, ``step_starts``). Where the text
    is not shaped as expected (no ``traceEvents`` near the start), the trace is written as exported, without the
    additions.
    """
    if marks is not None and marks.marks:
        extra_events = list(extra_events) + _mark_events(raw_path, marks)
    with open(raw_path, "rb") as src:
        head = src.read(_HEAD_BYTES)
        splice = _splice_points(head, extra_events, distributed_info)
        with atomic_target(final_path) as tmp, open(tmp, "wb") as out, \
                gzip.GzipFile(fileobj=out, mode="wb", compresslevel=3, mtime=0) as gz:
            done = 0
            for at, text in splice:
                gz.write(head[done:at])
                gz.write(text)
                done = at
            gz.write(head[done:])
            while chunk := src.read(_CHUNK):
                gz.write(chunk)
    raw_path.unlink(missing_ok=True)


def _mark_events(raw_path: Path, marks: WindowMarks) -> list[dict[str, Any]]:
    offset = marks.offset_ns(step_starts(raw_path, set(marks.steps)), base_time_ns(raw_path))
    if offset is None:
        log.warning("kinetoscope: %s has neither ProfilerStep spans nor baseTimeNanoseconds; loop marks not added",
                    raw_path.name)
        return []
    return marks.events(offset)


#: a host-side ProfilerStep span: its name, then (before its args) its start; the category in between or before
_STEP_NAME = re.compile(rb'"name"\s*:\s*"ProfilerStep#(\d+)"')
_TS = re.compile(rb'"ts"\s*:\s*(-?[0-9][0-9.eE+-]*)')
_CAT = re.compile(rb'"cat"\s*:\s*"([^"]*)"')


def step_starts(raw_path: Path, wanted: set[int]) -> dict[int, int]:
    """The trace-clock start (ns) of each ``ProfilerStep#N`` host span in ``wanted``: one pass over the text in
    8 MiB chunks (a memchr-speed search for the name), never decoding the trace. The device-side copies Kineto
    writes of these spans (``gpu_user_annotation``) are left out."""
    found: dict[int, int] = {}
    if not wanted:
        return found
    ahead, behind = 4096, 1024  # an event is read whole: its name is searched this far from a chunk's ends
    with open(raw_path, "rb") as fh:
        data, begin = b"", 0
        while True:
            chunk = fh.read(_CHUNK)
            data += chunk
            limit = len(data) if not chunk else max(len(data) - ahead, begin)  # later: with the next chunk
            for m in _STEP_NAME.finditer(data, begin, limit):
                step = int(m.group(1))
                if step not in wanted or step in found:
                    continue
                start = data.rfind(b"{", 0, m.start())
                end = data.find(b"}", m.end())
                if start < 0 or end < 0:
                    continue
                cat = _CAT.search(data, start, end)
                if cat is None or cat.group(1) not in (b"user_annotation", b"cpu_op", b"User Annotation", b"Operator"):
                    continue
                ts = _TS.search(data, start, end)
                if ts is None:
                    continue
                try:
                    found[step] = round(float(ts.group(1)) * 1000.0)
                except ValueError:
                    continue
            if not chunk or len(found) == len(wanted):
                return found
            keep = max(limit - behind, 0)
            data, begin = data[keep:], limit - keep


def _splice_points(head: bytes, extra_events: list[dict[str, Any]],
                   distributed_info: dict[str, Any] | None) -> list[tuple[int, bytes]]:
    """(offset in the head, bytes to insert there), in order."""
    m = _EVENTS_KEY.search(head)
    start = len(head) - len(head.lstrip(b"\xef\xbb\xbf \t\r\n"))
    if m is None or head[start:start + 1] != b"{":
        if extra_events or distributed_info:
            log.warning("kinetoscope: the exported trace has no traceEvents near its start; telemetry not added")
        return []
    out: list[tuple[int, bytes]] = []
    if distributed_info and b'"distributedInfo"' not in head[:m.start()]:
        out.append((start + 1, b'"distributedInfo": ' + msgspec.json.encode(distributed_info) + b", "))
    if extra_events:
        rest = head[m.end():].lstrip()
        empty = rest[:1] == b"]"
        items = b", ".join(msgspec.json.encode(e) for e in extra_events)
        out.append((m.end(), items + (b"" if empty else b", ")))
    return out


class BusyClock:
    """When the capture's own work ran (``time.perf_counter_ns``): the trace's export on the training thread and its
    finishing (gzip, marks) on the writer's thread. Each step records how much of its wall the capture was busy, so
    the analysis leaves the capture's cost out of the run's measures instead of blaming the training for it."""

    #: intervals kept: steps ask about recent time only
    KEEP = 64

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._done: list[tuple[int, int]] = []
        self._open: dict[int, int] = {}  # token -> start
        self._tokens = itertools.count()

    def begin(self) -> int:
        start = self._clock()
        with self._lock:
            token = next(self._tokens)
            self._open[token] = start
        return token

    def end(self, token: int) -> None:
        end = self._clock()
        with self._lock:
            start = self._open.pop(token, None)
            if start is not None:
                self._done = (self._done + [(start, end)])[-self.KEEP:]

    def overlap_ns(self, lo: int, hi: int) -> int:
        """Nanoseconds of [lo, hi) in which the capture was busy (a union: the export and a gzip at once count
        once); work still running counts up to ``hi``."""
        with self._lock:
            spans = sorted([(max(s, lo), min(e, hi)) for s, e in self._done if e > lo and s < hi]
                           + [(max(s, lo), hi) for s in self._open.values() if s < hi])
        total, reach = 0, lo
        for s, e in spans:
            s = max(s, reach)
            if e > s:
                total += e - s
                reach = e
        return total


class TraceWriter:
    """Finishes exported traces (``finish_trace``) on a thread of its own, so the training thread only
    hands the file over: gzip of a multi-GB export takes seconds to minutes. The thread lives while there
    is work and is not a daemon: an exiting interpreter waits for the trace being written, then exits."""

    def __init__(self, busy: BusyClock | None = None) -> None:
        self._queue: queue.Queue[tuple[Path, Path, dict[str, Any]]] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.failures: list[str] = []
        self._busy = busy

    def submit(self, raw_path: Path, final_path: Path, **kwargs: Any) -> None:
        with self._lock:
            self._queue.put((raw_path, final_path, kwargs))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kinetoscope-trace-writer", daemon=False)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                try:
                    raw_path, final_path, kwargs = self._queue.get_nowait()
                except queue.Empty:
                    self._thread = None  # no more work: the next submit starts a new thread
                    return
            token = self._busy.begin() if self._busy is not None else None
            try:
                finish_trace(raw_path, final_path, **kwargs)
                log.info("kinetoscope: wrote %s", final_path)
            except Exception as exc:  # noqa: BLE001 - a full disk must not stop training
                self.failures.append(f"{final_path.name}: {type(exc).__name__}: {exc}")
                log.warning("kinetoscope: could not write %s (%s: %s); training continues",
                            final_path.name, type(exc).__name__, exc)
                Path(raw_path).unlink(missing_ok=True)
            finally:
                if token is not None and self._busy is not None:
                    self._busy.end(token)

    def close(self, timeout: float | None = None) -> None:
        """Wait until every submitted trace is written."""
        while True:
            with self._lock:
                thread = self._thread
            if thread is None:
                return
            thread.join(timeout)
            if timeout is not None:
                return


#: a raw export left by a process: .rank-<rank>.<pid>.step-<first>-<last>.raw.json
_RAW = re.compile(r"^\.rank-(\d+)\.(\d+)\.step-(\d+)-(\d+)\.raw\.json$")
#: a half-written file (``fsutil.atomic_target``) untouched this long belongs to no live writer
STALE_TMP_S = 60.0


def _complete_json(path: Path) -> bool:
    """Whether a file ends like a whole JSON document (an export killed midway does not)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4096))
            tail = fh.read().rstrip()
    except OSError:
        return False
    return tail[-1:] in (b"}", b"]")


def tidy_output_dir(out: Path, *, writers_gone: bool = False) -> tuple[list[Path], int]:
    """What a killed run left in ``out``: its raw exports are recovered as plain traces when whole (a kill
    while the writer thread gzipped them) and removed otherwise, half-written files removed. Only files of
    processes that are gone (``writers_gone``: every writer of ``out`` has exited, so every file).
    Returns (recovered traces, files removed)."""
    recovered: list[Path] = []
    removed = 0
    if not out.is_dir():
        return recovered, removed
    now = time.time()
    for p in sorted(out.iterdir()):
        try:
            m = _RAW.match(p.name)
            if m is not None:
                rank, pid, first, last = (int(g) for g in m.groups())
                if not writers_gone and pid_alive(pid):
                    continue
                final = out / trace_name(rank, first, last)
                plain = final.with_name(final.name[:-3])  # .pt.trace.json
                if not final.exists() and not plain.exists() and _complete_json(p):
                    os.replace(p, plain)
                    recovered.append(plain)
                else:
                    p.unlink()
                    removed += 1
            elif p.name.startswith(".") and (p.name.endswith(".tmp") or p.name.endswith(".new")) and (
                    writers_gone or now - p.stat().st_mtime > STALE_TMP_S):
                p.unlink()
                removed += 1
            elif p.name.startswith(".kinetoscope-status-") and writers_gone:  # read by the CLI, which is done
                p.unlink()
        except OSError:
            continue
    return recovered, removed


def base_time_ns(raw_path: Path) -> int | None:
    """``baseTimeNanoseconds`` from a raw export: Kineto writes it among the metadata at the start
    (older versions at the end), so both ends are searched; the events in between are never read."""
    key = '"baseTimeNanoseconds":'
    with open(raw_path, "rb") as fh:
        head = fh.read(65536).decode("utf-8", "replace")
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 65536))
        tail = fh.read().decode("utf-8", "replace")
    for text in (head, tail):
        at = text.find(key)
        if at >= 0:
            digits = ""
            for ch in text[at + len(key):at + len(key) + 40].lstrip():
                if not ch.isdigit():
                    break
                digits += ch
            if digits:
                return int(digits)
    return None


def versions() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["hip"] = getattr(torch.version, "hip", None)
        info["cuda_available"] = bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        pass
    from kinetoscope import __version__

    info["kinetoscope"] = __version__
    return info


def warm_redaction() -> None:
    """Load the redaction's detectors now (~0.2 s, once per process), before the training runs: the sidecars are
    redacted as the process exits, when importing them would cost a Ctrl-C its exit status (130: see
    ``redact.load_detectors``). Not on a thread of its own: its imports must be over before the script can end."""
    if "detect_secrets.core.scan" in sys.modules:
        return
    from kinetoscope.analyze.ingest.redact import load_detectors

    load_detectors()


def redacted(data: bytes) -> bytes:
    """JSON text with every secret in its strings redacted, as ``kinetoscope redact`` does to traces (the command
    line's ``--api-key sk-...``, ``HF_TOKEN=...``, credentials in URLs)."""
    from kinetoscope.analyze.ingest.redact import redact_json_bytes  # numpy and the standard library; only when writing

    return redact_json_bytes(data)[0]


def write_manifest(out_dir: Path, manifest: Manifest) -> Path:
    path = out_dir / manifest_name(manifest.rank)
    atomic_write(path, redacted(manifest.to_json()))
    return path


def write_step_times(out_dir: Path, rank: int, times: StepTimes) -> Path:
    path = out_dir / step_times_name(rank)
    atomic_write(path, redacted(times.to_json()))
    return path
