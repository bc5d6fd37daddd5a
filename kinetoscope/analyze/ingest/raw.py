"""The decoded trace as flat columns: what both decoders produce and the table builder consumes.

Two decoders fill a ``RawColumns``: the compiled scanner (``kinetoscope.analyze.ingest._scan``, fed the
file in chunks) and the reference msgspec decoder (``parser.parse_bytes``, whole document, lenient
fallback for odd dialects) through ``from_parsed``. Everything downstream is shared, so the two
can only differ in decoding, and tests compare them on every real trace.

Layout: one row per item of ``traceEvents``. Strings (``ph``, ``name``, ``cat``, ``args.name``,
counter series) are int32 codes into ``strings``; ``pid``/``tid`` are codes into ``idents`` (ints
and strings kept apart, as in the trace). The few args fields the analyses use, and the flow
``id``, are sparse ``(event, field, value)`` triples: most events carry one or two of them. A value
that is not a plain int64 (a string such as ``"0x0"``, a float, a huge int) is kept as the Python
object in ``odd`` and coerced once, the same way for both decoders. The args of events in category
``kinetoscope`` (the capture's loop marks, a few per step) are kept whole, decoded, in ``marks``; the shape fields
of ops recorded with ``record_shapes`` ("Input Dims", "Input type", "Concrete Inputs") as JSON text in ``shapes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kinetoscope.analyze.ingest.parser import Args, Event, OpShapes, ParsedTrace

#: sparse field ids, in the scanner's order (see ``_scan.c``)
FIELDS = ("correlation", "device", "stream", "external_id", "external_id_legacy", "bytes", "mem_bytes",
          "total_allocated", "total_reserved", "device_type", "device_id", "addr", "name",
          "coll_name", "pg_name", "pg_ranks", "in_nelems", "out_nelems", "group_size", "seq", "id")
F = {name: i for i, name in enumerate(FIELDS)}
_ARG_ATTRS = FIELDS[:20]
#: args fields whose values are strings (kept as codes into ``strings``); the rest are int64
STRING_FIELDS = frozenset({"name", "coll_name", "pg_name", "pg_ranks"})
STRING_FIELD_IDS = frozenset(F[n] for n in STRING_FIELDS)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class RawColumns:
    n: int
    ph: np.ndarray
    name: np.ndarray
    cat: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    strings: list[str]
    idents: list[Any]
    f_event: np.ndarray
    f_id: np.ndarray
    f_value: np.ndarray
    odd: list[tuple[int, int, Any]]
    #: counter ("C") rows: time, counter name, pid, series (args key) and value
    c_ts: np.ndarray
    c_name: np.ndarray
    c_pid: np.ndarray
    c_series: np.ndarray
    c_value: np.ndarray
    metadata: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    decoder: str = "reference"
    #: (event, its args) of each event whose ``cat`` is exactly "kinetoscope" (loop marks), in event order
    marks: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: (event, its shape fields as JSON text) of each op recorded with shapes, in event order
    shapes: list[tuple[int, OpShapes]] = field(default_factory=list)


def _array(value: Any, dtype: Any) -> np.ndarray:
    return np.frombuffer(value, dtype=dtype) if isinstance(value, bytes) else np.asarray(value, dtype=dtype)


def _decoded_marks(items: list[tuple[int, bytes]]) -> list[tuple[int, dict[str, Any]]]:
    """The loop marks' raw args (JSON objects the scanner validated), decoded; data only, never evaluated."""
    import msgspec

    out = []
    for event, text in items:
        try:
            args = msgspec.json.decode(text)
        except (msgspec.DecodeError, RecursionError):
            continue
        if isinstance(args, dict):
            out.append((int(event), args))
    return out


def from_scanner(out: dict[str, Any], metadata: dict[str, Any]) -> RawColumns:
    """Wrap the compiled scanner's buffers (bytes, wrapped without copies; or merged arrays)."""
    c_event = _array(out["c_event"], np.int64)
    ts = _array(out["ts"], np.float64)
    name = _array(out["name"], np.int32)
    pid = _array(out["pid"], np.int32)
    return RawColumns(
        n=out["n"],
        ph=_array(out["ph"], np.int32),
        name=name,
        cat=_array(out["cat"], np.int32),
        ts=ts,
        dur=_array(out["dur"], np.float64),
        pid=pid,
        tid=_array(out["tid"], np.int32),
        strings=out["strings"],
        idents=out["idents"],
        f_event=_array(out["f_event"], np.int64),
        f_id=_array(out["f_id"], np.uint8),
        f_value=_array(out["f_value"], np.int64),
        odd=out["odd"],
        c_ts=ts[c_event],
        c_name=name[c_event],
        c_pid=pid[c_event],
        c_series=_array(out["c_series"], np.int32),
        c_value=_array(out["c_value"], np.float64),
        metadata=metadata,
        decoder="scanner",
        marks=_decoded_marks(out.get("marks", [])),
        shapes=out.get("shapes", []),
    )


class _Interner:
    def __init__(self) -> None:
        self.codes: dict[Any, int] = {}
        self.values: list[Any] = []

    def __call__(self, value: Any) -> int:
        key = (type(value), value)
        code = self.codes.get(key)
        if code is None:
            code = self.codes[key] = len(self.values)
            self.values.append(value)
        return code


def from_parsed(parsed: ParsedTrace) -> RawColumns:
    """Columns from the reference decoder's event records (one Python pass)."""
    events = parsed.events
    strings, idents = _Interner(), _Interner()
    n = len(events)
    ph = np.empty(n, np.int32)
    name = np.empty(n, np.int32)
    cat = np.empty(n, np.int32)
    pid = np.empty(n, np.int32)
    tid = np.empty(n, np.int32)
    f_event: list[int] = []
    f_id: list[int] = []
    f_value: list[int] = []
    odd: list[tuple[int, int, Any]] = []

    def put(i: int, fid: int, value: Any) -> None:
        if type(value) is int and INT64_MIN <= value <= INT64_MAX:
            f_event.append(i)
            f_id.append(fid)
            f_value.append(value)
        else:
            odd.append((i, fid, value))

    for i, e in enumerate(events):
        ph[i] = strings(e.ph)
        name[i] = strings(e.name)
        cat[i] = strings(e.cat)
        pid[i] = idents(e.pid)
        tid[i] = idents(e.tid)
        a: Args | None = e.args
        if a is not None:
            for fid, attr in enumerate(_ARG_ATTRS):
                value = getattr(a, attr)
                if value is None:
                    continue
                if fid in STRING_FIELD_IDS:
                    if isinstance(value, str):
                        put(i, fid, strings(value))
                else:
                    put(i, fid, value)
        if e.id is not None:
            put(i, F["id"], e.id)
    ts = np.fromiter((e.ts for e in events), dtype=np.float64, count=n)
    dur = np.fromiter((e.dur for e in events), dtype=np.float64, count=n)

    rows = [(c.ts, strings(c.name), idents(c.pid), strings(key), float(value))
            for c in parsed.counters for key, value in (c.args or {}).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)]
    return RawColumns(
        n=n, ph=ph, name=name, cat=cat, ts=ts, dur=dur, pid=pid, tid=tid,
        strings=strings.values, idents=idents.values,
        f_event=np.asarray(f_event, dtype=np.int64), f_id=np.asarray(f_id, dtype=np.uint8),
        f_value=np.asarray(f_value, dtype=np.int64), odd=odd,
        c_ts=np.array([r[0] for r in rows], dtype=np.float64),
        c_name=np.array([r[1] for r in rows], dtype=np.int32),
        c_pid=np.array([r[2] for r in rows], dtype=np.int32),
        c_series=np.array([r[3] for r in rows], dtype=np.int32),
        c_value=np.array([r[4] for r in rows], dtype=np.float64),
        metadata=parsed.metadata, notes=list(parsed.notes), marks=list(parsed.marks),
        shapes=list(parsed.shapes),
    )


__all__ = ["FIELDS", "F", "STRING_FIELDS", "STRING_FIELD_IDS", "RawColumns", "from_parsed", "from_scanner", "Event"]
