"""Decode the bytes of one Kineto/Chrome trace into typed event records.

Fast path: msgspec decodes ``traceEvents`` straight into ``Struct`` instances
holding only the fields the analyses use (large ``args`` such as call stacks
and input shapes are skipped without being materialised). If a trace carries
an unexpected type somewhere (a string timestamp, a float stream id), the
lenient path decodes generically and coerces field by field, so odd dialects
still load. Nothing from a trace is ever evaluated or unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import msgspec

from kinetoscope.errors import TraceFormatError

Number = Union[int, float]
#: args values: HIP runtime writes numbers as strings ("bytes": "128", "stream": "0x0")
Value = Union[int, float, str, None]


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
    name: Union[str, None] = None  # process_name / thread_name metadata


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: Union[int, str] = ""
    tid: Union[int, str] = ""
    id: Union[int, str, None] = None
    args: Union[Args, None] = None


class CounterEvent(msgspec.Struct, gc=False):
    """Second, narrow pass used only when a trace has counter (``C``) events."""

    ph: str = ""
    name: str = ""
    ts: float = 0.0
    pid: Union[int, str] = ""
    args: Union[dict[str, Any], None] = None


_events_decoder = msgspec.json.Decoder(list[Event])
_counter_decoder = msgspec.json.Decoder(list[CounterEvent])
_top_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_any_decoder = msgspec.json.Decoder()


@dataclass
class ParsedTrace:
    events: list[Event]
    counters: list[CounterEvent]
    metadata: dict[str, Any]
    lenient: bool = False
    notes: list[str] = field(default_factory=list)


def parse_bytes(data: bytes, source: str) -> ParsedTrace:
    """Decode a whole trace document (``{"traceEvents": [...]}`` or a bare array)."""
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
            raise TraceFormatError(source, f"not valid JSON ({exc})") from None
        if "traceEvents" not in top:
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
        raise TraceFormatError(source, f"not valid JSON ({exc})") from None

    counters: list[CounterEvent] = []
    if any(e.ph == "C" for e in events):
        try:
            counters = [c for c in _counter_decoder.decode(raw_events) if c.ph == "C"]
        except msgspec.ValidationError as exc:
            notes.append(f"counter events skipped: {exc}")
    return ParsedTrace(events=events, counters=counters, metadata=metadata, lenient=lenient, notes=notes)


def _lenient_events(raw: bytes | msgspec.Raw, source: str) -> list[Event]:
    try:
        items = _any_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(source, f"not valid JSON ({exc})") from None
    if not isinstance(items, list):
        raise TraceFormatError(source, "'traceEvents' is not a list")
    out = []
    for item in items:
        if isinstance(item, dict):
            out.append(_coerce_event(item))
        else:
            out.append(Event(ph="?"))  # counted as unhandled downstream
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


def _coerce_event(item: dict[str, Any]) -> Event:
    args = item.get("args")
    parsed_args = None
    if isinstance(args, dict):
        kwargs: dict[str, Any] = {}
        for key, attr in _ARG_FIELDS.items():
            if key in args:
                kwargs[attr] = args[key] if attr == "name" and isinstance(args[key], str) else _num(args[key])
        if "name" in kwargs and not isinstance(kwargs["name"], str):
            kwargs.pop("name")
        parsed_args = Args(**kwargs)
    ts = _num(item.get("ts"))
    dur = _num(item.get("dur"))
    flow_id = item.get("id")
    return Event(
        ph=str(item.get("ph", "")),
        name=str(item.get("name", "")),
        cat=str(item.get("cat", "") or ""),
        ts=float(ts) if ts is not None else float("nan"),
        dur=float(dur) if dur is not None else 0.0,
        pid=_ident(item.get("pid")),
        tid=_ident(item.get("tid")),
        id=_ident(flow_id) if flow_id is not None else None,
        args=parsed_args,
    )
