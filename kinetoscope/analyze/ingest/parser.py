"""Decode the bytes of one Kineto/Chrome trace into typed event records.

Fast path: msgspec decodes ``traceEvents`` straight into ``Struct`` instances
holding only the fields the analyses use (large ``args`` such as call stacks
and input shapes are skipped without being materialised). If a trace carries
an unexpected type somewhere (a string timestamp, a float stream id), the
lenient path decodes generically and coerces field by field, so odd dialects
still load. Nothing from a trace is ever evaluated or unpickled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from kinetoscope.analyze.ingest.limits import DEFAULT_LIMITS, EXECUTION_TRACE, LoadLimits, too_many_events
from kinetoscope.errors import TraceFormatError

Number = int | float
#: args values: HIP runtime writes numbers as strings ("bytes": "128", "stream": "0x0")
Value = int | float | str | None


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    correlation: Value = None
    device: Value = None
    stream: Value = None
    external_id: Value = msgspec.field(name="External id", default=None)
    external_id_legacy: Value = msgspec.field(name="external id", default=None)
    bytes: Value = None
    mem_bytes: Value = msgspec.field(name="Bytes", default=None)
    total_allocated: Value = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Value = msgspec.field(name="Total Reserved", default=None)
    device_type: Value = msgspec.field(name="Device Type", default=None)
    device_id: Value = msgspec.field(name="Device Id", default=None)
    addr: Value = msgspec.field(name="Addr", default=None)
    name: str | None = None  # process_name / thread_name metadata
    # collective metadata (record_param_comms, NCCL kernels): the names are kept only when strings, and
    # any other value is ignored (not a reason to decode the whole file leniently)
    coll_name: Any = msgspec.field(name="Collective name", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    in_nelems: Value = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Value = msgspec.field(name="Out msg nelems", default=None)
    group_size: Value = msgspec.field(name="Group size", default=None)
    seq: Value = msgspec.field(name="Seq", default=None)


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = float("nan")  # an event without a timestamp cannot be placed: dropped, and counted
    dur: float = 0.0
    pid: int | str = ""
    tid: int | str = ""
    id: int | str | None = None
    args: Args | None = None


class MarkProbe(msgspec.Struct, gc=False):
    """Third, narrow pass used only when a trace has events in category ``kinetoscope`` (the capture's loop
    marks): their args, whole."""

    cat: Any = None
    args: Any = None


class ShapeProbe(msgspec.Struct, gc=False):
    """Fourth, narrow pass used only when a trace has "Input Dims" (``record_shapes=True``): each op's args,
    undecoded (most of them are decoded again only for the few operators whose work is counted)."""

    cat: Any = None
    args: msgspec.Raw = msgspec.Raw(b"")  # a Raw cannot be in a union: empty means absent


class ShapeArgs(msgspec.Struct, gc=False):
    """The shape fields of an op's args, as written (JSON text): decoded later, only where counted."""

    dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw(b""))  # empty: absent
    types: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw(b""))
    concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=msgspec.Raw(b""))


#: an op's recorded inputs, as JSON text (None: not written): (Input Dims, Input type, Concrete Inputs)
OpShapes = tuple[str, str | None, str | None]
#: the categories whose args carry shapes, matched exactly as the scanner does
SHAPE_CATEGORIES = frozenset({"cpu_op", "Operator"})
_shape_args_decoder = msgspec.json.Decoder(ShapeArgs)


def _text(raw: msgspec.Raw) -> str | None:
    return bytes(raw).decode("utf-8") if len(raw) else None


def op_shapes_of(args: bytes | msgspec.Raw) -> OpShapes | None:
    """The shape fields of one op's args object (validated JSON), or None when it holds no Input Dims (or the
    fields are not what record_shapes writes: an object is expected, and text in UTF-8 - a raw field is kept as the
    file's bytes, which the JSON decoder does not check: a corrupted byte there was an internal error)."""
    try:
        a = _shape_args_decoder.decode(args)
        dims = _text(a.dims)
        return None if dims is None else (dims, _text(a.types), _text(a.concrete))
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None


class CounterEvent(msgspec.Struct, gc=False):
    """Second, narrow pass used only when a trace has counter (``C``) events."""

    ph: str = ""
    name: str = ""
    ts: float = float("nan")
    pid: int | str = ""
    args: dict[str, Any] | None = None



#: marks an item of traceEvents that was not a JSON object
NOT_AN_OBJECT = "<not an object>"

class LaunchArgs(msgspec.Struct, gc=False):
    correlation: Any = None
    kernel: Any = None
    grid: Any = None


class LaunchProbe(msgspec.Struct, gc=False):
    """A narrow look at one event, for the kernel a runtime call launches (roctracer writes it in its args; read
    only from traces holding a stream capture, whose captured kernels never run and so are named nowhere else).
    Other args are skipped, not decoded."""

    args: LaunchArgs | None = None


class LaunchProbes(msgspec.Struct, gc=False):
    traceEvents: list[LaunchProbe] = msgspec.field(default_factory=list)


def launched_kernels(data: bytes) -> dict[int, tuple[str, str | None]]:
    """(kernel name, launch grid as JSON text) by correlation id, for the calls whose args name the kernel they
    launch; {} where the document cannot be read so (the names are extra: never a reason to fail a load)."""
    try:
        probes = (msgspec.json.decode(data, type=LaunchProbes).traceEvents if data.lstrip()[:1] == b"{"
                  else msgspec.json.decode(data, type=list[LaunchProbe]))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}
    out: dict[int, tuple[str, str | None]] = {}
    for p in probes:
        a = p.args
        if a is not None and isinstance(a.kernel, str) and isinstance(a.correlation, int) \
                and not isinstance(a.correlation, bool):
            out[a.correlation] = (a.kernel, msgspec.json.encode(a.grid).decode() if a.grid is not None else None)
    return out


_events_decoder = msgspec.json.Decoder(list[Event])
_counter_decoder = msgspec.json.Decoder(list[CounterEvent])
_mark_decoder = msgspec.json.Decoder(list[MarkProbe])
_shape_decoder = msgspec.json.Decoder(list[ShapeProbe])
#: the category of the capture's loop marks (``kinetoscope.capture.loop``), matched exactly as the scanner does
MARK_CATEGORY = "kinetoscope"
_top_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_any_decoder = msgspec.json.Decoder()


@dataclass
class ParsedTrace:
    events: list[Event]
    counters: list[CounterEvent]
    metadata: dict[str, Any]
    lenient: bool = False
    notes: list[str] = field(default_factory=list)
    #: (event, args) of the loop marks (events of category ``kinetoscope`` with an args object)
    marks: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: (event, shapes) of the ops recorded with shapes (category cpu_op/Operator, args with "Input Dims")
    shapes: list[tuple[int, OpShapes]] = field(default_factory=list)


def _json_error(source: str, exc: Exception) -> TraceFormatError:
    text = str(exc)
    if "trailing characters" in text:
        return TraceFormatError(source, f"extra data after the JSON document ({text}): two traces concatenated?")
    if "truncated" in text.lower():
        return TraceFormatError(
            source, "the JSON ends early (a truncated file: an interrupted copy or a crashed writer)"
        )
    return TraceFormatError(source, f"not valid JSON ({text})")


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def nesting_depth(data: bytes) -> int:
    """How deep arrays and objects nest inside the document's own (the scanner's count: a value of the
    top-level object is at level 1, an event at 2); brackets inside strings are left out."""
    if b"[" not in data and b"{" not in data:
        return 0
    bare = np.frombuffer(_STRING.sub(b'""', data), dtype=np.uint8)
    step = np.zeros(256, dtype=np.int8)
    step[[ord("["), ord("{")]] = 1
    step[[ord("]"), ord("}")]] = -1
    depth = np.cumsum(step[bare], dtype=np.int64)
    return max(int(depth.max()) - 1, 0) if depth.size else 0


def parse_bytes(data: bytes, source: str, limits: LoadLimits = DEFAULT_LIMITS) -> ParsedTrace:
    """Decode a whole trace document (``{"traceEvents": [...]}`` or a bare array)."""
    # the same depth limit as the scanner's, checked before decoding: msgspec descends one native frame per
    # level, bounded by Python's recursion limit (process-wide, never changed here) less the frames in use
    if nesting_depth(data) > limits.max_depth:
        raise TraceFormatError(source, f"JSON nested deeper than {limits.max_depth} levels (limit max_depth)")
    try:
        parsed = _parse(data, source)
    except RecursionError:
        raise TraceFormatError(source, "JSON nested too deep for the reference decoder on this thread's stack "
                               f"(within the {limits.max_depth}-level limit, but Python's recursion limit is "
                               "nearer here; the fast scanner has no such bound)") from None
    if len(parsed.events) > limits.max_events:
        raise too_many_events(source, limits, len(parsed.events))
    return parsed


def _parse(data: bytes, source: str) -> ParsedTrace:
    if data[:3] == b"\xef\xbb\xbf":  # a UTF-8 byte-order mark some editors add
        data = data[3:]
    start = data[:64].lstrip()
    if not start:
        raise TraceFormatError(source, "file is empty")
    if start[:1] == b"[":
        raw_events: bytes | msgspec.Raw = data
        metadata: dict[str, Any] = {}
    elif start[:1] == b"{":
        try:
            top = _top_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise _json_error(source, exc) from None
        if "traceEvents" not in top:
            if "nodes" in top and "schema" in top:
                raise TraceFormatError(source, EXECUTION_TRACE)
            raise TraceFormatError(
                source, "JSON object without 'traceEvents': not a Chrome/Kineto trace"
            )
        raw_events = top.pop("traceEvents")
        metadata = {}
        for key, raw in top.items():
            try:
                metadata[key] = _any_decoder.decode(raw)
            except msgspec.DecodeError:  # pragma: no cover - top level already validated
                metadata[key] = None
    else:
        raise TraceFormatError(source, "not a JSON trace (expected '{' or '[' at the start)")

    notes: list[str] = []
    lenient = False
    try:
        events = _events_decoder.decode(raw_events)
    except msgspec.ValidationError as exc:
        events = _lenient_events(raw_events, source)
        lenient = True
        notes.append(f"unusual field types ({exc}); decoded leniently")
    except msgspec.DecodeError as exc:
        raise _json_error(source, exc) from None
    skipped = sum(1 for e in events if e.ph == NOT_AN_OBJECT)
    if skipped:
        if skipped == len(events):
            raise TraceFormatError(source, "a JSON array whose items are not trace events (a memory timeline or "
                                   "another tool's export?)")
        notes.append(f"{skipped} items of traceEvents were not JSON objects and were skipped")

    counters: list[CounterEvent] = []
    if any(e.ph == "C" for e in events):
        try:
            counters = [c for c in _counter_decoder.decode(raw_events) if c.ph == "C"]
        except msgspec.ValidationError as exc:
            notes.append(f"counter events skipped: {exc}")
    marks = _marks(events, raw_events) if any(e.cat == MARK_CATEGORY for e in events) else []
    shapes = _shapes(raw_events) if b'"Input Dims"' in data else []
    return ParsedTrace(events=events, counters=counters, metadata=metadata, lenient=lenient, notes=notes,
                       marks=marks, shapes=shapes)


def _shapes(raw: bytes | msgspec.Raw) -> list[tuple[int, OpShapes]]:
    """The recorded shapes of each op, by its position in traceEvents (items that are not objects keep theirs)."""
    try:
        probes: list[Any] = _shape_decoder.decode(raw)
    except msgspec.ValidationError:  # items that are not objects, or args that are not: decoded generically
        probes = [ShapeProbe(cat=i.get("cat"), args=msgspec.Raw(msgspec.json.encode(i["args"])))
                  if isinstance(i, dict) and isinstance(i.get("args"), dict) else ShapeProbe()
                  for i in _any_decoder.decode(raw)]
    out = []
    for i, p in enumerate(probes):
        if isinstance(p.cat, str) and p.cat in SHAPE_CATEGORIES and len(p.args):  # a cat may be any JSON
            found = op_shapes_of(p.args)
            if found is not None:
                out.append((i, found))
    return out


def _marks(events: list[Event], raw: bytes | msgspec.Raw) -> list[tuple[int, dict[str, Any]]]:
    """The args of each loop mark, by its position in traceEvents (items that are not objects keep theirs)."""
    try:
        probes: list[Any] = _mark_decoder.decode(raw)
    except msgspec.ValidationError:  # items that are not objects: decoded generically
        probes = [MarkProbe(cat=i.get("cat"), args=i.get("args")) if isinstance(i, dict) else MarkProbe()
                  for i in _any_decoder.decode(raw)]
    return [(i, p.args) for i, p in enumerate(probes) if p.cat == MARK_CATEGORY and isinstance(p.args, dict)]


def _lenient_events(raw: bytes | msgspec.Raw, source: str) -> list[Event]:
    try:
        items = _any_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise _json_error(source, exc) from None
    if not isinstance(items, list):
        raise TraceFormatError(source, "'traceEvents' is not a list")
    out = []
    for item in items:
        if isinstance(item, dict):
            out.append(_coerce_event(item))
        else:
            out.append(Event(ph=NOT_AN_OBJECT))  # counted and reported, never silently lost
    return out


def _num(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value, 0)
        except ValueError:
            return None
    return None


def _ident(value: Any) -> int | str:
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, str)):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return str(value)


_ARG_FIELDS = {f.encode_name: f.name for f in msgspec.structs.fields(Args)}
_STRING_ATTRS = frozenset({"name", "coll_name", "pg_name", "pg_ranks"})


def _coerce_event(item: dict[str, Any]) -> Event:
    args = item.get("args")
    parsed_args = None
    if isinstance(args, dict):
        kwargs: dict[str, Any] = {}
        for key, attr in _ARG_FIELDS.items():
            if key in args:
                if attr in _STRING_ATTRS:
                    if isinstance(args[key], str):
                        kwargs[attr] = args[key]
                else:
                    kwargs[attr] = _num(args[key])
        parsed_args = Args(**kwargs)
    ts = _num(item.get("ts"))
    dur = _num(item.get("dur"))
    flow_id = item.get("id")
    return Event(
        ph=str(item.get("ph", "")),
        name=str(item.get("name", "")),
        cat=str(item.get("cat", "") or ""),
        ts=float(ts) if ts is not None else float("nan"),  # no usable time: dropped downstream, and counted
        dur=float(dur) if dur is not None else 0.0,
        pid=_ident(item.get("pid")),
        tid=_ident(item.get("tid")),
        id=_ident(flow_id) if flow_id is not None else None,
        args=parsed_args,
    )
