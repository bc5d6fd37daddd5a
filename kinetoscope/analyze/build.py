"""Turn decoded events into the typed tables of a ``RankTrace``."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable

import numpy as np
import pandas as pd

from kinetoscope.analyze import schema
from kinetoscope.analyze.parser import Args, Event, ParsedTrace
from kinetoscope.analyze.trace import RankTrace, TraceMeta

_EMPTY_ARGS = Args()
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_STREAM_RE = re.compile(r"(\d+)\s*$")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if _INT64_MIN <= number <= _INT64_MAX else None  # beyond int64: not an id we can use


def _nullable(values: Iterable[Any]) -> pd.arrays.IntegerArray:
    """A nullable Int64 column. Fast path for the usual ints and None; odd values go one by one."""
    objects = np.array(list(values), dtype=object)
    missing = np.equal(objects, None)
    try:
        filled = np.where(missing, 0, objects).astype(np.int64)
        exact = np.equal(filled, np.where(missing, 0, objects)).all()
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact:  # strings ("0x0"), floats, huge numbers: coerce each value
        return pd.array([_int_or_none(v) for v in objects], dtype="Int64")
    return pd.arrays.IntegerArray(filled, missing)


def _categorical(values: list[Any]) -> pd.Categorical:
    """Values (ids may be ints or labels) as a categorical of text.

    ``pd.factorize`` hashes the Python objects in C: ~5x faster than ``pd.Categorical(list)``,
    which infers a string dtype element by element.
    """
    codes, uniques = pd.factorize(np.asarray(values, dtype=object))
    labels = [u if isinstance(u, str) else str(u) for u in uniques]
    if len(set(labels)) != len(labels):  # 7 and "7" in one column: merge them as text
        return pd.Categorical([v if isinstance(v, str) else str(v) for v in values])
    return pd.Categorical.from_codes(codes, categories=pd.Index(labels, dtype=object))


def _recode(values: pd.Categorical, fn: Any, categories: list[str] | None = None) -> pd.Categorical:
    """Map each category through ``fn`` (once per distinct value) and remap the codes in numpy."""
    mapped = [fn(c) for c in values.categories]
    target = categories if categories is not None else list(dict.fromkeys(mapped))
    position = {c: i for i, c in enumerate(target)}
    lookup = np.array([position.get(m, -1) for m in mapped] + [-1], dtype=np.int64)
    return pd.Categorical.from_codes(lookup[np.asarray(values.codes)], categories=pd.Index(target, dtype=object))


_MAX_US = 9.0e15  # int64 nanoseconds hold +-9.2e15 us


def _usable(values: np.ndarray) -> np.ndarray:
    return np.isfinite(values) & (np.abs(values) < _MAX_US)


def _with_usable_time(events: list[Event], kind: str, warnings: list[str]) -> tuple[list[Event], np.ndarray]:
    """The events whose timestamp can be placed, and their times; the rest are counted in ``warnings``."""
    ts, _ = _times(events)
    ok = _usable(ts)
    if not ok.all():
        warnings.append(f"{int((~ok).sum())} {kind} events had no usable timestamp and were not analysed")
        events = [e for e, keep in zip(events, ok) if keep]
        ts = ts[ok]
    return events, ts


def _times(events: list[Event]) -> tuple[np.ndarray, np.ndarray]:
    ts = np.fromiter((e.ts for e in events), dtype=np.float64, count=len(events))
    dur = np.fromiter((e.dur for e in events), dtype=np.float64, count=len(events))
    return ts, dur


def _stream_of(e: Event, a: Args) -> int | None:
    if a.stream is not None:
        return _int_or_none(a.stream)
    if isinstance(e.tid, int):
        return e.tid
    m = _STREAM_RE.search(e.tid) if isinstance(e.tid, str) else None
    return int(m.group(1)) if m else None


def build_events(events: list[Event]) -> tuple[pd.DataFrame, list[str]]:
    warnings: list[str] = []
    ts, dur = _times(events)
    # no time, or a time/duration int64 nanoseconds cannot hold (|t| >= ~106 days of us): unusable
    bad = ~_usable(ts) | ~_usable(dur)
    if bad.any():
        warnings.append(f"{int(bad.sum())} complete events had no usable timestamp and were not analysed")
        keep = np.flatnonzero(~bad)
        events = [events[i] for i in keep]
        ts, dur = ts[~bad], dur[~bad]
    neg = dur < 0
    if neg.any():
        warnings.append(f"{int(neg.sum())} events had a negative duration; clamped to 0")
        dur = np.where(neg, 0.0, dur)
    ts_ns = schema.us_to_ns(ts)
    dur_ns = np.rint(dur * 1000.0).astype(np.int64)
    cat = _recode(_categorical([e.cat for e in events]), schema.normalise_category)
    kind = _recode(cat, lambda c: schema.CATEGORY_KIND.get(c, "other"), categories=list(schema.KINDS))
    args = [e.args or _EMPTY_ARGS for e in events]
    is_gpu = np.isin(np.asarray(kind.codes), [list(schema.KINDS).index(k) for k in ("kernel", "memcpy", "memset", "gpu_annotation", "sync")])
    device = [
        (_int_or_none(a.device) if a.device is not None else (e.pid if isinstance(e.pid, int) else None)) if g else None
        for e, a, g in zip(events, args, is_gpu)
    ]
    stream = [_stream_of(e, a) if g else None for e, a, g in zip(events, args, is_gpu)]
    external = [a.external_id if a.external_id is not None else a.external_id_legacy for a in args]
    df = pd.DataFrame(
        {
            "ts_ns": ts_ns,
            "dur_ns": dur_ns,
            "end_ns": ts_ns + dur_ns,
            "name": _categorical([e.name for e in events]),
            "cat": cat,
            "kind": kind,
            "pid": _categorical([e.pid for e in events]),
            "tid": _categorical([e.tid for e in events]),
            "device": _nullable(device),
            "stream": _nullable(stream),
            "correlation": _nullable(a.correlation for a in args),
            "external_id": _nullable(external),
            "bytes": _nullable(a.bytes for a in args),
        }
    )
    df = df.sort_values("ts_ns", kind="stable", ignore_index=True)
    return df, warnings


def build_memory(events: list[Event], warnings: list[str]) -> pd.DataFrame:
    events, ts = _with_usable_time(events, "memory", warnings)
    if not events:
        return schema.empty_frame(schema.MEMORY_COLUMNS)
    args = [e.args or _EMPTY_ARGS for e in events]
    df = pd.DataFrame(
        {
            "ts_ns": schema.us_to_ns(ts),
            "bytes": np.array([_int_or_none(a.mem_bytes) or 0 for a in args], dtype=np.int64),
            "total_allocated_bytes": _nullable(a.total_allocated for a in args),
            "total_reserved_bytes": _nullable(a.total_reserved for a in args),
            "device_type": np.array([_int_or_none(a.device_type) or 0 for a in args], dtype=np.int64),
            "device_id": np.array(
                [-1 if a.device_id is None else _int_or_none(a.device_id) for a in args], dtype=np.int64
            ),
            "addr": _nullable(a.addr for a in args),
            "tid": _categorical([e.tid for e in events]),
        }
    )
    return df.sort_values("ts_ns", kind="stable", ignore_index=True)


def build_counters(parsed: ParsedTrace) -> pd.DataFrame:
    rows: list[tuple[float, str, str, float, str]] = []
    for c in parsed.counters:
        for key, value in (c.args or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(c.ts) < _MAX_US:
                rows.append((c.ts, c.name, key, float(value), str(c.pid)))
    if not rows:
        return schema.empty_frame(schema.COUNTER_COLUMNS)
    ts = np.array([r[0] for r in rows], dtype=np.float64)
    df = pd.DataFrame(
        {
            "ts_ns": schema.us_to_ns(ts),
            "name": pd.Categorical([r[1] for r in rows]),
            "series": pd.Categorical([r[2] for r in rows]),
            "value": np.array([r[3] for r in rows], dtype=np.float64),
            "pid": pd.Categorical([r[4] for r in rows]),
        }
    )
    return df.sort_values("ts_ns", kind="stable", ignore_index=True)


def build_flows(events: list[Event], warnings: list[str]) -> pd.DataFrame:
    events, ts = _with_usable_time(events, "flow", warnings)
    if not events:
        return schema.empty_frame(schema.FLOW_COLUMNS)
    return pd.DataFrame(
        {
            "ts_ns": schema.us_to_ns(ts),
            "id": _nullable(e.id if not isinstance(e.id, str) else _int_or_none(e.id) for e in events),
            "phase": _categorical([e.ph for e in events]),
            "cat": _recode(_categorical([e.cat for e in events]), schema.normalise_category),
            "pid": _categorical([e.pid for e in events]),
            "tid": _categorical([e.tid for e in events]),
        }
    )


def build_instants(events: list[Event], warnings: list[str]) -> pd.DataFrame:
    events, ts = _with_usable_time(events, "instant", warnings)
    return pd.DataFrame(
        {
            "ts_ns": schema.us_to_ns(ts) if len(ts) else np.array([], dtype=np.int64),
            "name": _categorical([e.name for e in events]),
            "cat": _recode(_categorical([e.cat for e in events]), schema.normalise_category),
            "pid": _categorical([e.pid for e in events]),
            "tid": _categorical([e.tid for e in events]),
        }
    )


def build_steps(events: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N spans recorded on the host (GPU-side copies are ignored)."""
    host = events[events["kind"].isin(("annotation", "cpu_op", "other"))]
    names = host["name"].astype(str)
    match = names.str.extract(_STEP_RE, expand=False)
    spans = host.loc[match.notna(), ["ts_ns", "end_ns", "tid"]].copy()
    spans["step"] = match[match.notna()].astype(np.int64)
    spans = spans.sort_values(["step", "ts_ns"]).drop_duplicates("step", keep="first")
    spans = spans.sort_values("ts_ns", ignore_index=True)
    return pd.DataFrame(
        {
            "step": spans["step"].to_numpy(np.int64),
            "start_ns": spans["ts_ns"].to_numpy(np.int64),
            "end_ns": spans["end_ns"].to_numpy(np.int64),
            "dur_ns": (spans["end_ns"] - spans["ts_ns"]).to_numpy(np.int64),
            "tid": spans["tid"].astype(str).to_numpy(object),
        }
    )


def _metadata_names(meta_events: list[Event]) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    processes: dict[str, str] = {}
    threads: dict[tuple[str, str], str] = {}
    for e in meta_events:
        label = e.args.name if e.args else None
        if not label:
            continue
        if e.name == "process_name":
            processes[str(e.pid)] = label
        elif e.name == "thread_name":
            threads[(str(e.pid), str(e.tid))] = label
    return processes, threads


def build_rank_trace(
    parsed: ParsedTrace,
    *,
    source: str,
    rank: int,
    rank_source: str,
    bytes_read: int,
) -> RankTrace:
    by_phase: dict[str, list[Event]] = {"X": [], "M": [], "mem": [], "flow": [], "i": []}
    unhandled: Counter[str] = Counter()
    for e in parsed.events:
        ph = e.ph
        if ph == "X":
            by_phase["X"].append(e)
        elif ph in ("i", "I", "n"):
            (by_phase["mem"] if e.name == "[memory]" else by_phase["i"]).append(e)
        elif ph in ("s", "f", "t"):
            by_phase["flow"].append(e)
        elif ph == "M":
            by_phase["M"].append(e)
        elif ph == "C":
            pass  # decoded in the counter pass
        elif ph == "<not an object>":
            pass  # reported by the parser
        else:
            unhandled[f"ph={ph or '?'}"] += 1

    events, warnings = build_events(by_phase["X"])
    warnings = list(parsed.notes) + warnings
    memory = build_memory(by_phase["mem"], warnings)
    flows = build_flows(by_phase["flow"], warnings)
    instants = build_instants(by_phase["i"], warnings)
    counters = build_counters(parsed)
    if unhandled:
        listed = ", ".join(f"{k}: {v}" for k, v in sorted(unhandled.items()))
        warnings.append(f"events of phases this version does not analyse were kept out of the analysis ({listed})")
    meta_in = parsed.metadata
    dist = meta_in.get("distributedInfo") if isinstance(meta_in.get("distributedInfo"), dict) else None
    processes, threads = _metadata_names(by_phase["M"])
    known = {"schemaVersion", "traceName", "baseTimeNanoseconds", "deviceProperties", "distributedInfo"}
    props = meta_in.get("deviceProperties")
    meta = TraceMeta(
        source=source,
        rank_source=rank_source,
        world_size=_int_or_none(dist.get("world_size")) if dist else None,
        schema_version=_int_or_none(meta_in.get("schemaVersion")),
        trace_name=meta_in.get("traceName") if isinstance(meta_in.get("traceName"), str) else None,
        base_time_ns=_int_or_none(meta_in.get("baseTimeNanoseconds")),
        device_properties=tuple(p for p in props if isinstance(p, dict)) if isinstance(props, list) else (),
        distributed_info=dist,
        process_names=processes,
        thread_names=threads,
        other={k: v for k, v in meta_in.items() if k not in known},
        unhandled_events=dict(unhandled),
        warnings=tuple(warnings),
        n_events=len(parsed.events),
        bytes_read=bytes_read,
    )
    return RankTrace(
        rank=rank,
        meta=meta,
        events=events,
        memory=memory,
        counters=counters,
        flows=flows,
        instants=instants,
        steps=build_steps(events),
    )
