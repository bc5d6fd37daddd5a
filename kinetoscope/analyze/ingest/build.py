"""Turn decoded columns (``RawColumns``) into the typed tables of a ``RankTrace``.

All of it is vectorised: rows are selected by phase with numpy masks, categorical columns are
re-coded from the decoder's string codes (categories in order of first appearance, as
``pd.factorize`` gives them), and the sparse args fields are scattered into nullable columns.
Only distinct values (categories, identifiers, the rare odd-typed field value) pass through Python.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.ingest.parser import NOT_AN_OBJECT
from kinetoscope.analyze.ingest.raw import INT64_MAX, INT64_MIN, F, RawColumns
from kinetoscope.analyze.model import schema
from kinetoscope.analyze.model.timeline import codes_in, kind_mask
from kinetoscope.analyze.model.trace import RankTrace, TraceMeta

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_STREAM_RE = re.compile(r"(\d+)\s*$")
_MAX_US = 9.0e15  # int64 nanoseconds hold +-9.2e15 us


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
    return number if INT64_MIN <= number <= INT64_MAX else None  # beyond int64: not an id we can use


def _usable(values: np.ndarray) -> np.ndarray:
    return np.isfinite(values) & (np.abs(values) < _MAX_US)


class _Fields:
    """The sparse args fields of a trace, scattered on demand into the rows of one table."""

    def __init__(self, raw: RawColumns, *, consume: bool = False) -> None:
        """``consume``: the raw triples are emptied as they are split (each column dropped as soon as its
        per-field copies exist), so the split never holds both in full: a build's peak memory."""
        order = np.argsort(raw.f_id, kind="stable")
        bounds = np.searchsorted(raw.f_id[order], np.arange(len(F) + 1))

        def split(name: str) -> dict[int, np.ndarray]:
            column = getattr(raw, name)
            if consume:
                setattr(raw, name, column[:0].copy())  # the full column lives only until its split is made
            return {f: column[order[bounds[f]:bounds[f + 1]]] for f in range(len(F))}

        if consume:
            raw.f_id = raw.f_id[:0].copy()
        self._events = split("f_event")
        self._values = split("f_value")
        self._position = np.empty(raw.n, dtype=np.int32 if raw.n < 2**31 else np.int64)
        self._rows: np.ndarray | None = None
        self._odd: dict[int, list[tuple[int, Any]]] = {}
        for event, fid, value in raw.odd:
            self._odd.setdefault(fid, []).append((event, value))

    def get(
        self, name: str, rows: np.ndarray, order: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, valid, present) for ``rows`` (ascending event indices), then put in ``order`` when
        given: present = the key held a non-null value; valid = that value is usable as an int64
        (odd values coerced like ``int()``)."""
        f = F[name]
        value = np.zeros(len(rows), dtype=np.int64)
        valid = np.zeros(len(rows), dtype=bool)
        present = np.zeros(len(rows), dtype=bool)
        if not len(rows):
            return value, valid, present
        position = self._positions(rows)
        for events, values in ((self._events[f], self._values[f]), *self._odd_arrays(f)):
            if not len(events):
                continue
            pos = position[events]
            hit = pos >= 0
            if values.dtype == object:  # odd values: coerce each (rare)
                coerced = [_int_or_none(v) for v in values[hit]]
                ok = np.array([c is not None for c in coerced], dtype=bool)
                value[pos[hit][ok]] = np.array([c for c in coerced if c is not None], dtype=np.int64)
                valid[pos[hit][ok]] = True
            else:
                value[pos[hit]] = values[hit]
                valid[pos[hit]] = True
            present[pos[hit]] = True
        if order is not None:
            return value[order], valid[order], present[order]
        return value, valid, present

    def present_rows(self, names: tuple[str, ...], rows: np.ndarray) -> np.ndarray:
        """Ascending indices into ``rows`` of the events holding any of the fields ``names``."""
        events = np.unique(
            np.concatenate(
                [self._events[F[n]] for n in names]
                + [np.array([e for e, _ in self._odd.get(F[n], [])], dtype=np.int64) for n in names]
            )
        )
        if not len(events):
            return np.empty(0, dtype=np.int64)
        position = self._positions(rows)[events]
        return np.sort(position[position >= 0]).astype(np.int64)

    def _positions(self, rows: np.ndarray) -> np.ndarray:
        """Event index -> its row in ``rows`` (-1: not there); kept for the table being built."""
        if self._rows is not rows:
            self._position.fill(-1)
            self._position[rows] = np.arange(len(rows), dtype=self._position.dtype)
            self._rows = rows
        return self._position

    def _odd_arrays(self, f: int) -> list[tuple[np.ndarray, np.ndarray]]:
        items = self._odd.get(f)
        if not items:
            return []
        events = np.array([e for e, _ in items], dtype=np.int64)
        values = np.empty(len(items), dtype=object)
        values[:] = [v for _, v in items]
        return [(events, values)]


def _nullable(value: np.ndarray, valid: np.ndarray) -> pd.arrays.IntegerArray:
    """A nullable Int64 column over ``value`` (a fresh array of ours: zeroed in place where missing)."""
    missing = ~valid
    value[missing] = 0
    return pd.arrays.IntegerArray(value, missing)


def _first_appearance(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(used codes in order of first appearance, new codes): what ``pd.factorize`` gives, in O(n)."""
    n = len(codes)
    first = np.full(size, n, dtype=np.int64)
    first[codes[::-1]] = np.arange(n - 1, -1, -1, dtype=np.int64)  # the last write wins: the first index
    used = np.flatnonzero(first < n)
    used = used[np.argsort(first[used], kind="stable")]
    lookup = np.full(size, -1, dtype=np.int64)
    lookup[used] = np.arange(len(used))
    return used, lookup[codes]


def _categorical(codes: np.ndarray, values: list[Any], order: np.ndarray | None = None) -> pd.Categorical:
    """Codes into ``values`` (text, or ids that may be ints) as a categorical of text; categories in
    order of first appearance in the file, rows then put in ``order`` (when given)."""
    used, new = _first_appearance(codes, len(values))
    if order is not None:
        new = new[order]
    labels = [v if isinstance(v, str) else str(v) for v in (values[c] for c in used)]
    if len(set(labels)) != len(labels):  # 7 and "7" in one column: merge them as text
        return pd.Categorical([labels[c] for c in new])
    return pd.Categorical.from_codes(new, categories=pd.Index(labels, dtype=object))


def _recode(values: pd.Categorical, fn: Callable[[str], str], categories: list[str] | None = None) -> pd.Categorical:
    """Map each category through ``fn`` (once per distinct value) and remap the codes in numpy."""
    mapped = [fn(c) for c in values.categories]
    target = categories if categories is not None else list(dict.fromkeys(mapped))
    position = {c: i for i, c in enumerate(target)}
    lookup = np.array([position.get(m, -1) for m in mapped] + [-1], dtype=np.int64)
    return pd.Categorical.from_codes(lookup[np.asarray(values.codes)], categories=pd.Index(target, dtype=object))


def _with_usable_time(raw: RawColumns, rows: np.ndarray, kind: str, warnings: list[str]) -> np.ndarray:
    """The rows whose timestamp can be placed; the rest are counted in ``warnings``."""
    ok = _usable(raw.ts[rows])
    if not ok.all():
        warnings.append(f"{int((~ok).sum())} {kind} events had no usable timestamp and were not analysed")
        rows = rows[ok]
    return rows


def _ident_ints(idents: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per identifier code: its value as an int64 and whether it is one (an int pid/tid)."""
    ok = np.array([isinstance(v, int) and INT64_MIN <= v <= INT64_MAX for v in idents], dtype=bool)
    return np.array([v if good else 0 for v, good in zip(idents, ok, strict=False)], dtype=np.int64), ok


def _tid_streams(idents: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per identifier code: the stream a GPU event's tid names ("stream 7" -> 7), when no args.stream."""
    out = []
    for v in idents:
        if isinstance(v, int):
            out.append(v if INT64_MIN <= v <= INT64_MAX else None)
        else:
            m = _STREAM_RE.search(v) if isinstance(v, str) else None
            out.append(_int_or_none(m.group(1)) if m else None)
    ok = np.array([o is not None for o in out], dtype=bool)
    return np.array([o if o is not None else 0 for o in out], dtype=np.int64), ok


def _in_order(rows: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    return rows if order is None else rows[order]


def _field_else_ident(raw: RawColumns, rows: np.ndarray, order: np.ndarray | None, fields: _Fields, name: str,
                      ident_column: np.ndarray, per_ident: tuple[np.ndarray, np.ndarray],
                      is_gpu: np.ndarray) -> pd.arrays.IntegerArray:
    """args.<name> where the event has it, else a value read from its pid or tid; GPU events only."""
    value, ok, present = fields.get(name, rows, order)
    fallback, fallback_ok = per_ident
    codes = ident_column[_in_order(rows, order)]
    return _nullable(np.where(present, value, fallback[codes]), np.where(present, ok, fallback_ok[codes]) & is_gpu)


def _external_column(rows: np.ndarray, order: np.ndarray | None, fields: _Fields) -> pd.arrays.IntegerArray:
    """External id, from the old lower-case key where the new one is absent."""
    ext, ext_ok, ext_present = fields.get("external_id", rows, order)
    legacy, legacy_ok, _ = fields.get("external_id_legacy", rows, order)
    return _nullable(np.where(ext_present, ext, legacy), np.where(ext_present, ext_ok, legacy_ok))


def build_events(raw: RawColumns, rows: np.ndarray, fields: _Fields
                 ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    warnings: list[str] = []
    ts, dur = raw.ts[rows], raw.dur[rows]
    # no time, or a time/duration int64 nanoseconds cannot hold (|t| >= ~106 days of us): unusable
    bad = ~_usable(ts) | ~_usable(dur)
    if bad.any():
        warnings.append(f"{int(bad.sum())} complete events had no usable timestamp and were not analysed")
        rows, ts, dur = rows[~bad], ts[~bad], dur[~bad]
    neg = dur < 0
    if neg.any():
        warnings.append(f"{int(neg.sum())} events had a negative duration; clamped to 0")
        dur = np.where(neg, 0.0, dur)
    ts_ns = schema.us_to_ns(ts)
    # time order, settled on the row numbers before any column exists (stable: file order breaks
    # ties); categories keep their order of first appearance in the file
    file_rows, order = rows, None
    if len(ts_ns) > 1 and (ts_ns[1:] < ts_ns[:-1]).any():
        order = np.argsort(ts_ns, kind="stable")
        rows, ts_ns, dur = rows[order], ts_ns[order], dur[order]
    dur_ns = np.rint(dur * 1000.0).astype(np.int64)
    del dur, ts
    cat = _recode(_categorical(raw.cat[file_rows], raw.strings, order), schema.normalise_category)
    kind = _recode(cat, lambda c: schema.CATEGORY_KIND.get(c, "other"), categories=list(schema.KINDS))
    gpu_kinds = [list(schema.KINDS).index(k) for k in ("kernel", "memcpy", "memset", "gpu_annotation", "sync")]
    is_gpu = codes_in(np.asarray(kind.codes), gpu_kinds)
    columns = {
        "ts_ns": ts_ns,
        "dur_ns": dur_ns,
        "end_ns": ts_ns + dur_ns,
        "name": _categorical(raw.name[file_rows], raw.strings, order),
        "cat": cat,
        "kind": kind,
        "pid": _categorical(raw.pid[file_rows], raw.idents, order),
        "tid": _categorical(raw.tid[file_rows], raw.idents, order),
        # each built and finished in turn, so the temporaries of one die before the next
        # device: args.device, else an integer pid; stream: args.stream, else the tid (an int, or the
        # trailing number of "stream 7")
        "device": _field_else_ident(raw, file_rows, order, fields, "device", raw.pid, _ident_ints(raw.idents), is_gpu),
        "stream": _field_else_ident(raw, file_rows, order, fields, "stream", raw.tid, _tid_streams(raw.idents), is_gpu),
        "correlation": _nullable(*fields.get("correlation", file_rows, order)[:2]),
        "external_id": _external_column(file_rows, order, fields),
        "bytes": _nullable(*fields.get("bytes", file_rows, order)[:2]),
    }
    df = pd.DataFrame(columns, copy=False)  # every column is a fresh array of ours: no copy, no consolidation
    comm = build_comm_args(raw, file_rows, order, fields)
    marks = build_marks(raw, df, file_rows, order)
    shapes = build_shapes(raw, df, file_rows, order)
    return df, comm, marks, shapes, warnings


def build_shapes(raw: RawColumns, events: pd.DataFrame, file_rows: np.ndarray, order: np.ndarray | None
                 ) -> pd.DataFrame:
    """The recorded inputs of the events table's host ops (``raw.shapes``, by event), sorted by row."""
    if not raw.shapes:
        return schema.empty_frame(schema.SHAPE_COLUMNS)
    source = _in_order(file_rows, order)  # event index of each table row
    event = np.fromiter((e for e, _ in raw.shapes), dtype=np.int64, count=len(raw.shapes))
    ranks = np.argsort(source, kind="stable")
    at = np.minimum(np.searchsorted(source[ranks], event), max(len(source) - 1, 0))
    kept = (source[ranks[at]] == event) if len(source) else np.zeros(len(event), dtype=bool)
    rows = ranks[at][kept].astype(np.int64)  # an op without a usable time is no row of the table
    fields = [f for (_, f), k in zip(raw.shapes, kept.tolist(), strict=True) if k]
    frame = pd.DataFrame({
        "row": rows,
        "input_dims": pd.Categorical([f[0] for f in fields]),
        "input_types": pd.Categorical([f[1] for f in fields]),
        "concrete_inputs": pd.Categorical([f[2] for f in fields]),
    })
    return frame.sort_values("row", kind="stable", ignore_index=True)


_MARK_TYPES: dict[str, type] = {c.name: {"Int64": int, "boolean": bool, "category": str}[c.dtype]
                                for c in schema.MARK_COLUMNS if c.name not in ("row", "name")}


def build_marks(raw: RawColumns, events: pd.DataFrame, file_rows: np.ndarray, order: np.ndarray | None) -> pd.DataFrame:
    """The loop marks of the events table (kind "mark") with their args: each value kept only when of its column's
    type (an int that is not a bool, a bool, a string), else <NA>. Few rows: built in Python."""
    rows = np.flatnonzero(kind_mask(events, ("mark",)))
    if not len(rows):
        return schema.empty_frame(schema.MARK_COLUMNS)
    by_event = dict(raw.marks)
    source = _in_order(file_rows, order)[rows]
    values: dict[str, list[Any]] = {name: [] for name in _MARK_TYPES}
    for event in source.tolist():
        args = by_event.get(event) or {}
        for name, kind in _MARK_TYPES.items():
            v = args.get(name)
            ok = isinstance(v, kind) and (kind is not int or not isinstance(v, bool))
            values[name].append(v if ok and (not isinstance(v, int) or INT64_MIN <= v <= INT64_MAX) else None)
    columns: dict[str, Any] = {"row": rows.astype(np.int64),
                               "name": pd.Categorical([str(n) for n in events["name"].to_numpy()[rows]])}
    for c in schema.MARK_COLUMNS[2:]:
        columns[c.name] = (pd.Categorical(values[c.name]) if c.dtype == "category"
                           else pd.array(values[c.name], dtype=c.dtype))
    return pd.DataFrame(columns)


_COMM_INT = ("in_nelems", "out_nelems", "group_size", "seq")
_COMM_STR = ("coll_name", "pg_name", "pg_ranks")


def build_comm_args(raw: RawColumns, rows: np.ndarray, order: np.ndarray | None, fields: _Fields) -> pd.DataFrame:
    """Collective metadata of the events table's rows (``rows`` in file order, ``order`` the table's
    time order); only events that carry some, so a trace without collectives costs nothing."""
    at = fields.present_rows(_COMM_STR + _COMM_INT, rows)  # indices into rows (file order)
    if not len(at):
        return schema.empty_frame(schema.COMM_ARG_COLUMNS)
    sub = rows[at]
    if order is None:
        final = at
    else:
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order))
        final = inverse[at]
    columns: dict[str, Any] = {"row": final}
    strings = np.array(raw.strings, dtype=object)
    for name in _COMM_STR:
        code, ok, _ = fields.get(name, sub)
        # numpy's stubs reject None as a value to choose; an object array holds it
        values = np.where(ok, strings[np.where(ok, code, 0)], None)  # type: ignore[call-overload]
        columns[name] = pd.Categorical(values)
    for name in _COMM_INT:
        columns[name] = _nullable(*fields.get(name, sub)[:2])
    df = pd.DataFrame(columns, copy=False)
    return df.sort_values("row", kind="stable", ignore_index=True)


def build_memory(raw: RawColumns, rows: np.ndarray, fields: _Fields, warnings: list[str]) -> pd.DataFrame:
    rows = _with_usable_time(raw, rows, "memory", warnings)
    if not len(rows):
        return schema.empty_frame(schema.MEMORY_COLUMNS)
    mem_bytes, mem_ok, _ = fields.get("mem_bytes", rows)
    dtype, dtype_ok, _ = fields.get("device_type", rows)
    dev_id, dev_id_ok, _ = fields.get("device_id", rows)
    df = pd.DataFrame(
        {
            "ts_ns": schema.us_to_ns(raw.ts[rows]),
            "bytes": np.where(mem_ok, mem_bytes, 0),
            "total_allocated_bytes": _nullable(*fields.get("total_allocated", rows)[:2]),
            "total_reserved_bytes": _nullable(*fields.get("total_reserved", rows)[:2]),
            "device_type": np.where(dtype_ok, dtype, 0),
            "device_id": np.where(dev_id_ok, dev_id, -1),
            "addr": _nullable(*fields.get("addr", rows)[:2]),
            "tid": _categorical(raw.tid[rows], raw.idents),
        },
        copy=False,  # every column is a fresh array of ours: no copy, no consolidation
    )
    return df.sort_values("ts_ns", kind="stable", ignore_index=True)


def build_counters(raw: RawColumns) -> pd.DataFrame:
    keep = np.abs(raw.c_ts) < _MAX_US  # NaN (no timestamp) compares False
    if not keep.any():
        return schema.empty_frame(schema.COUNTER_COLUMNS)
    strings = np.array(raw.strings, dtype=object)
    pids = np.array([str(v) for v in raw.idents], dtype=object)
    df = pd.DataFrame(
        {
            "ts_ns": schema.us_to_ns(raw.c_ts[keep]),
            "name": pd.Categorical(strings[raw.c_name[keep]]),
            "series": pd.Categorical(strings[raw.c_series[keep]]),
            "value": raw.c_value[keep],
            "pid": pd.Categorical(pids[raw.c_pid[keep]]),
        },
        copy=False,  # every column is a fresh array of ours: no copy, no consolidation
    )
    return df.sort_values("ts_ns", kind="stable", ignore_index=True)


def build_flows(raw: RawColumns, rows: np.ndarray, fields: _Fields, warnings: list[str]) -> pd.DataFrame:
    rows = _with_usable_time(raw, rows, "flow", warnings)
    if not len(rows):
        return schema.empty_frame(schema.FLOW_COLUMNS)
    return pd.DataFrame(
        {
            "ts_ns": schema.us_to_ns(raw.ts[rows]),
            "id": _nullable(*fields.get("id", rows)[:2]),
            "phase": _categorical(raw.ph[rows], raw.strings),
            "cat": _recode(_categorical(raw.cat[rows], raw.strings), schema.normalise_category),
            "pid": _categorical(raw.pid[rows], raw.idents),
            "tid": _categorical(raw.tid[rows], raw.idents),
        },
        copy=False,  # every column is a fresh array of ours: no copy, no consolidation
    )


def build_instants(raw: RawColumns, rows: np.ndarray, warnings: list[str]) -> pd.DataFrame:
    rows = _with_usable_time(raw, rows, "instant", warnings)
    return pd.DataFrame(
        {
            "ts_ns": schema.us_to_ns(raw.ts[rows]) if len(rows) else np.array([], dtype=np.int64),
            "name": _categorical(raw.name[rows], raw.strings),
            "cat": _recode(_categorical(raw.cat[rows], raw.strings), schema.normalise_category),
            "pid": _categorical(raw.pid[rows], raw.idents),
            "tid": _categorical(raw.tid[rows], raw.idents),
        },
        copy=False,  # every column is a fresh array of ours: no copy, no consolidation
    )


_LOADER_RE = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#")
#: an inferred first iteration this many times the median of the others is start-up, not a step
_COLD_FIRST_FACTOR = 3.0


def _steps_frame(step: np.ndarray, start: np.ndarray, end: np.ndarray, tid: np.ndarray, partial: np.ndarray,
                 inferred: bool = False) -> pd.DataFrame:
    return pd.DataFrame({
        "step": np.asarray(step, dtype=np.int64),
        "start_ns": np.asarray(start, dtype=np.int64),
        "end_ns": np.asarray(end, dtype=np.int64),
        "dur_ns": (np.asarray(end, dtype=np.int64) - np.asarray(start, dtype=np.int64)),
        "tid": np.asarray(tid, dtype=object),
        "partial": np.asarray(partial, dtype=bool),
        "inferred": np.full(len(step), inferred, dtype=bool),
    })


def build_steps(events: pd.DataFrame, notes: list[str] | None = None) -> pd.DataFrame:
    """ProfilerStep#N spans recorded on the host (GPU-side copies are ignored), clipped to the profiler's
    recording span (a step never closed runs past it: it is partial). Without ProfilerStep spans, the
    training loop's iterations are inferred from its DataLoader waits (one step from each wait to the
    next, on the thread that waits most); a cold first iteration is left out as start-up."""
    notes = notes if notes is not None else []
    names = events["name"].cat
    step_of = np.array([int(m.group(1)) if (m := _STEP_RE.match(c)) else -1 for c in names.categories] + [-1],
                       dtype=np.int64)
    number = step_of[np.asarray(names.codes)]
    hit = np.flatnonzero((number >= 0) & kind_mask(events, ("annotation", "cpu_op", "other")))
    if not len(hit):
        return _inferred_steps(events, notes)
    spans = events.iloc[hit][["ts_ns", "end_ns", "tid"]].copy()
    spans["step"] = number[hit]
    spans = spans.sort_values(["step", "ts_ns"]).drop_duplicates("step", keep="first")
    spans = spans.sort_values("ts_ns", ignore_index=True)
    start, end = spans["ts_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    partial = np.zeros(len(spans), dtype=bool)
    recording = events[kind_mask(events, ("trace",))]
    if len(recording):
        lo, hi = int(recording["ts_ns"].min()), int(recording["end_ns"].max())
        over = (end > hi) | (start < lo)
        if over.any():
            for i in np.flatnonzero(over):
                notes.append(
                    f"ProfilerStep#{int(spans['step'].iloc[i])} runs {(end[i] - hi) / 1e6:.1f} ms past the end of "
                    "the recording (never closed): clipped to the recording, and marked partial"
                )
            start, end = np.clip(start, lo, hi), np.clip(end, lo, hi)
            partial = over
    return _steps_frame(spans["step"].to_numpy(), start, end, spans["tid"].astype(str).to_numpy(object), partial)


def _inferred_steps(events: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    names = events["name"].cat
    is_loader = np.array([bool(_LOADER_RE.match(c)) for c in names.categories] + [False])[np.asarray(names.codes)]
    loader = events[is_loader & ~kind_mask(events, ("gpu_annotation",))]
    empty = _steps_frame(np.empty(0), np.empty(0), np.empty(0), np.empty(0), np.empty(0))
    if len(loader) < 3:
        return empty
    # the training loop is the thread that launches GPU work (or, CPU-only, runs most ops): a prefetch
    # thread calling next() is not it, however often it does
    launching = events[kind_mask(events, ("runtime", "driver"))]
    pool = launching if len(launching) else events[kind_mask(events, ("cpu_op",))]
    if pool.empty:
        return empty
    tid = pool["tid"].astype(str).value_counts().index[0]
    starts = np.sort(loader["ts_ns"].to_numpy(np.int64)[(loader["tid"].astype(str) == tid).to_numpy()])
    if len(starts) < 3:
        return empty
    # one iteration from each wait for data to the next: n waits give n - 1 complete iterations
    begin, finish = starts[:-1], starts[1:]
    numbers = np.arange(len(begin))
    dur = finish - begin
    first = 0
    if len(dur) >= 3 and dur[0] > _COLD_FIRST_FACTOR * np.median(dur[1:]):
        notes.append(f"no ProfilerStep spans: steps inferred from the training loop's DataLoader waits; the first "
                     f"iteration ({dur[0] / 1e6:.1f} ms, {dur[0] / np.median(dur[1:]):.0f}x the median) is start-up "
                     "and left out of the window")
        first = 1
    else:
        notes.append("no ProfilerStep spans: steps inferred from the training loop's DataLoader waits")
    n = len(begin) - first
    return _steps_frame(
        numbers[first:], begin[first:], finish[first:], np.full(n, tid, dtype=object), np.zeros(n, bool), inferred=True
    )


def _metadata_names(
    raw: RawColumns, rows: np.ndarray, fields: _Fields
) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    processes: dict[str, str] = {}
    threads: dict[tuple[str, str], str] = {}
    label, has_label, _ = fields.get("name", rows)
    for i in np.flatnonzero(has_label):
        text = raw.strings[label[i]]
        if not text:
            continue
        row = rows[i]
        kind = raw.strings[raw.name[row]]
        pid = str(raw.idents[raw.pid[row]])
        if kind == "process_name":
            processes[pid] = text
        elif kind == "thread_name":
            threads[(pid, str(raw.idents[raw.tid[row]]))] = text
    return processes, threads


#: phases and what becomes of them
_PHASES = {"X": "X", "i": "i", "I": "i", "n": "i", "s": "flow", "f": "flow", "t": "flow", "M": "M",
           "C": "counter", NOT_AN_OBJECT: "skipped"}
#: the phase groups whose events become rows of a table (counters come from their own columns)
_TABLES = ("X", "i", "flow", "M")


def build_rank_trace(raw: RawColumns, *, source: str, rank: int, rank_source: str, bytes_read: int,
                     consume: bool = False) -> RankTrace:
    """The rank's tables from its raw columns. ``consume``: the caller is done with ``raw``, whose sparse args
    fields are emptied as they are split (~30% of the raw columns on an event-dense trace): the build's peak."""
    # each phase code to the table its events build (one pass over the events); others are counted
    counts = np.bincount(raw.ph, minlength=len(raw.strings))
    table_of = np.full(len(raw.strings), -1, dtype=np.int8)
    unhandled: Counter[str] = Counter()
    for code in np.flatnonzero(counts):
        ph = raw.strings[code]
        group = _PHASES.get(ph)
        if group is None:
            unhandled[f"ph={ph or '?'}"] += int(counts[code])
        elif group in _TABLES:
            table_of[code] = _TABLES.index(group)
    event_table = table_of[raw.ph]

    def rows_of(group: str) -> np.ndarray:
        return np.flatnonzero(event_table == _TABLES.index(group))

    fields = _Fields(raw, consume=consume)
    instant_rows = rows_of("i")
    memory_code = raw.strings.index("[memory]") if "[memory]" in raw.strings else -1
    is_memory = raw.name[instant_rows] == memory_code
    events, comm_args, marks, shapes, warnings = build_events(raw, rows_of("X"), fields)
    warnings = list(raw.notes) + warnings
    memory = build_memory(raw, instant_rows[is_memory], fields, warnings)
    flows = build_flows(raw, rows_of("flow"), fields, warnings)
    instants = build_instants(raw, instant_rows[~is_memory], warnings)
    counters = build_counters(raw)
    if unhandled:
        listed = ", ".join(f"{k}: {v}" for k, v in sorted(unhandled.items()))
        warnings.append(f"events of phases this version does not analyse were kept out of the analysis ({listed})")
    steps = build_steps(events, warnings)
    meta_in = raw.metadata
    dist = meta_in.get("distributedInfo") if isinstance(meta_in.get("distributedInfo"), dict) else None
    processes, threads = _metadata_names(raw, rows_of("M"), fields)
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
        n_events=raw.n,
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
        steps=steps,
        comm_args=comm_args,
        marks=marks,
        shapes=shapes,
    )
