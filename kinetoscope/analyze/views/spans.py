"""Slices of a trace for display (the app's timeline), chosen here so renderers never compute.

The timeline is drawn at the resolution of the screen: a span shorter than a pixel cannot be seen, so
spans under a pixel are merged, per row and kind, into one block per pixel that says how many spans it
holds and how long they ran ("level of detail"). Nothing in the range is dropped; zooming in (a
narrower range) shows them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.timeline import (
    LOADER_RE,
    SYNC_OP_NAMES,
    SYNC_RUNTIME_RE,
    gpu_work,
    kind_mask,
    main_thread,
    name_mask,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace, trace_view
from kinetoscope.analyze.whatif.critpath import critical_path

#: host event kinds drawn on the thread lanes
HOST_KINDS = ("cpu_op", "runtime", "driver", "annotation", "python", "sync")
#: what each span is drawn as, in fixed colours (the same on every trace)
KIND_COLOURS = {
    "step": "#c7c7c7",
    "kernel": "#4c78a8",
    "memcpy": "#f58518",
    "memset": "#eeca3b",
    "cpu op": "#54a24b",
    "runtime call": "#b279a2",
    "sync": "#e45756",
    "data wait": "#ff9da6",
    "annotation": "#72b7b2",
    "python": "#9d755d",
}
_HOST_KIND_LABEL = {"cpu_op": "cpu op", "runtime": "runtime call", "driver": "runtime call", "annotation": "annotation",
                    "python": "python", "sync": "sync"}
#: how each kind of critical-path segment is drawn (a colour of KIND_COLOURS)
PATH_KIND_LABEL = {"host": "cpu op", "data": "data wait", "sync": "sync", "copy": "sync", "launch": "runtime call",
                   "kernel": "kernel", "collective": "kernel", "memcpy": "memcpy", "memset": "memset",
                   "stream_gap": "step"}
#: the row of the critical path, under the steps
PATH_ROW = "critical path"
#: overlaps this short are rounding, not nesting (see host_depth)
NEST_TOLERANCE_NS = 1000
#: nesting rows per thread; deeper spans share the last row
MAX_DEPTH = 12
#: the chart's width in pixels the level of detail is computed for
WIDTH_PX = 1600
#: the width a step label needs ("step 123" at 11 px), in pixels of WIDTH_PX
LABEL_PX = 60
#: marks a browser chart draws smoothly; past this, spans are merged at a coarser resolution
MAX_MARKS = 30_000
SPAN_COLUMNS = ["row", "name", "kind", "start_ms", "end_ms", "dur_ms", "busy_fraction", "spans", "correlation", "link",
                "link_id"]


@dataclass(frozen=True)
class TimelineView:
    #: one mark per row: ``row`` (label, in ``rows`` order), name, kind (a key of KIND_COLOURS), start/end in ms from
    #: the window start (as drawn: a block is at least a pixel wide), ``dur_ms`` (the time its spans ran: the union of
    #: their intervals), ``busy_fraction`` (dur_ms over end - start: 1 for a span drawn alone; the share of the block
    #: its spans cover, which it is drawn with as its opacity, so a block is never darker than the time it holds),
    #: ``spans`` (1, or how many spans a merged block holds), correlation (launch<->kernel,
    #: -1 where none), ``link`` (the other end of a launch, in words) and ``link_id`` (the correlation where there is
    #: one, else a value of the span's own: hovering one end of a launch highlights both ends and nothing else)
    spans: pd.DataFrame
    #: the rows top to bottom: the steps, each GPU stream, each host thread's nesting levels
    rows: list[str]
    #: step labels: step, start_ms, end_ms
    steps: pd.DataFrame
    start_ms: float
    end_ms: float
    #: spans in the range, and how many of them were merged into blocks under a pixel
    total_spans: int
    merged_spans: int
    #: the resolution spans were merged at (ms per block)
    resolution_ms: float
    #: kernels in the range, and how many of them are drawn one by one (not merged)
    kernels: int = 0
    kernels_drawn: int = 0


@trace_view
def host_depth(trace: RankTrace) -> pd.DataFrame:
    """Host spans (``HOST_KINDS``) with their nesting depth on their thread: ts_ns, end_ns, tid, depth, row (the
    event's position in ``trace.events``). Depth = how many spans of the same thread, started earlier, are still
    open when it starts (vectorised: a span's position in start order less the spans that ended before it)."""
    ev = trace.events
    sel = np.flatnonzero(kind_mask(ev, HOST_KINDS))
    ts = ev["ts_ns"].to_numpy()[sel]
    end = np.maximum(ev["end_ns"].to_numpy()[sel], ts + 1)  # an instant span is 1 ns long: it sorts after its parent
    tid = np.asarray(ev["tid"].cat.codes)[sel]
    order = np.lexsort((-end, ts, tid))
    depth = np.zeros(len(sel), dtype=np.int64)
    bounds = np.flatnonzero(np.diff(tid[order])) + 1
    for part in np.split(order, bounds):
        if not len(part):
            continue
        s, e = ts[part], end[part]
        # a span that ends within NEST_TOLERANCE_NS after the next one starts did not hold it: Kineto rounds both
        # to the microsecond, and one ProfilerStep then "starts" a nanosecond before the previous one ends
        # (each end moved NEST_TOLERANCE_NS earlier, never to or before its own start: a span never closes itself)
        closed = np.searchsorted(np.sort(np.maximum(e - NEST_TOLERANCE_NS, s + 1)), s, side="right")
        depth[part] = np.maximum(np.arange(len(part)) - closed, 0)
    return pd.DataFrame({"row": sel, "ts_ns": ts, "end_ns": end, "tid": ev["tid"].to_numpy()[sel], "depth": depth})


def _thread_order(trace: RankTrace, tids: pd.Series) -> list[str]:
    """The training thread first, then the others by how many spans they hold in the range."""
    main = main_thread(trace)
    counts = tids.astype(str).value_counts()
    return sorted(counts.index, key=lambda t: (t != main, -counts[t], t))


def step_range_ms(trace: RankTrace, first: int, last: int) -> tuple[float, float]:
    """Where the steps at positions ``first`` to ``last`` of the steps table begin and end, in ms from the window
    start (positions, not step numbers: a trace may number two steps alike)."""
    sel = trace.steps.iloc[first:last + 1]
    origin = window(trace).start_ns
    return (int(sel["start_ns"].min()) - origin) / 1e6, (int(sel["end_ns"].max()) - origin) / 1e6


def timeline_view(trace: RankTrace, start_ms: float | None = None, end_ms: float | None = None,
                  width_px: int = WIDTH_PX, max_marks: int = MAX_MARKS, with_path: bool = False) -> TimelineView:
    """The spans of ``[start_ms, end_ms)`` (ms from the window start; the whole window by default): a steps row,
    (``with_path``) the critical path's row, a row per GPU stream, rows per host thread and nesting depth; spans
    under a pixel merged."""
    w = window(trace)
    origin = w.start_ns
    lo = origin + int(round((start_ms or 0.0) * 1e6))
    hi = origin + int(round(end_ms * 1e6)) if end_ms is not None else w.end_ns
    hi = max(hi, lo + 1)
    parts: list[pd.DataFrame] = []
    rows: list[str] = ["steps"]
    steps = trace.steps
    st = steps[(steps["end_ns"] > lo) & (steps["start_ns"] < hi)] if len(steps) else steps
    lab = st
    if len(lab) > width_px // 60:  # a label needs ~60 px: every k-th step labelled, the others drawn unlabelled
        lab = lab.iloc[::int(np.ceil(len(lab) / max(width_px // 60, 1)))]
    if len(lab):  # a label that would run past the range's end (a step starting near it) would be cut: none
        room_ns = hi - np.maximum(lab["start_ns"].to_numpy(), lo)
        lab = lab[room_ns >= LABEL_PX * (hi - lo) / max(width_px, 1)]
    step_labels = pd.DataFrame(
        {
            "step": lab["step"].astype(np.int64).to_numpy() if len(lab) else np.zeros(0, np.int64),
            "start_ms": (np.maximum(lab["start_ns"].to_numpy(), lo) - origin) / 1e6 if len(lab) else np.zeros(0),
            "end_ms": (np.minimum(lab["end_ns"].to_numpy(), hi) - origin) / 1e6 if len(lab) else np.zeros(0),
        }
    )
    if len(st):
        parts.append(pd.DataFrame({"row": "steps", "name": [f"ProfilerStep#{s}" for s in st["step"]], "kind": "step",
                                   "ts_ns": st["start_ns"].to_numpy(), "end_ns": st["end_ns"].to_numpy(),
                                   "correlation": -1, "gpu": False}))
    if with_path:
        rows.append(PATH_ROW)
        parts.append(_path_spans(trace, lo, hi))
    # GPU streams, device by device
    gpu = gpu_work(trace)
    gpu = gpu[((gpu["end_ns"] > lo) & (gpu["ts_ns"] < hi)).to_numpy()]
    if len(gpu):
        lane = ("GPU " + gpu["device"].astype(str) + " · stream " + gpu["stream"].astype(str)).to_numpy(object)
        keys = sorted(set(zip(gpu["device"], gpu["stream"], strict=False)))
        rows += [f"GPU {d} · stream {s}" for d, s in keys]
        corr = gpu["correlation"].fillna(-1).to_numpy(np.int64)
        parts.append(pd.DataFrame({"row": lane, "name": gpu["name"].astype(str).to_numpy(object),
                                   "kind": gpu["kind"].astype(str).to_numpy(object),
                                   "ts_ns": gpu["ts_ns"].to_numpy(), "end_ns": gpu["end_ns"].to_numpy(),
                                   "correlation": corr, "gpu": True}))
    # host threads, one row per nesting depth
    hd = host_depth(trace)
    hd = hd[((hd["end_ns"] > lo) & (hd["ts_ns"] < hi)).to_numpy()]
    if len(hd):
        ev = trace.events.iloc[hd["row"].to_numpy()]
        main = main_thread(trace)
        depth = np.minimum(hd["depth"].to_numpy(), MAX_DEPTH - 1)
        tids = hd["tid"].astype(str).to_numpy(object)
        for t in _thread_order(trace, hd["tid"]):
            top = int(depth[tids == t].max())
            name = f"thread {t}" + (" (training)" if t == main else "")
            rows += [name if d == 0 else f"{name} · {d}" + ("+" if d == MAX_DEPTH - 1 else "") for d in range(top + 1)]
        row = np.array([f"thread {t}" + (" (training)" if t == main else "") for t in tids], dtype=object)
        row = np.where(depth == 0, row, row + " · " + depth.astype(str) + np.where(depth == MAX_DEPTH - 1, "+", ""))
        kind = np.array([_HOST_KIND_LABEL.get(k, "annotation") for k in ev["kind"].astype(str)], dtype=object)
        kind[name_mask(ev, LOADER_RE)] = "data wait"
        kind[(kind_mask(ev, ("runtime", "driver")) & name_mask(ev, SYNC_RUNTIME_RE))
             | (kind_mask(ev, ("cpu_op",)) & name_mask(ev, names=SYNC_OP_NAMES))] = "sync"
        corr = ev["correlation"].fillna(-1).to_numpy(np.int64)
        parts.append(pd.DataFrame({"row": row, "name": ev["name"].astype(str).to_numpy(object), "kind": kind,
                                   "ts_ns": hd["ts_ns"].to_numpy(), "end_ns": hd["end_ns"].to_numpy(),
                                   "correlation": corr, "gpu": False}))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["row", "name", "kind", "ts_ns", "end_ns", "correlation", "gpu"])
    frame["ts_ns"] = np.maximum(frame["ts_ns"].to_numpy(np.int64), lo)
    frame["end_ns"] = np.minimum(frame["end_ns"].to_numpy(np.int64), hi)
    total = len(frame)
    px = max((hi - lo) / max(width_px, 1), 1.0)
    spans, merged = _merge_small(frame, lo, px)
    while len(spans) > max_marks:  # still too many to draw: coarser blocks
        px *= 2
        spans, merged = _merge_small(frame, lo, px)
    # the other end of each launch, for the spans drawn one by one
    corr = spans["correlation"].to_numpy(np.int64)
    is_gpu = spans["gpu"].to_numpy(bool)
    link = np.full(len(spans), "", dtype=object)
    link[is_gpu] = _kernel_links(trace, corr[is_gpu], origin)
    link[~is_gpu] = _launch_links(trace, corr[~is_gpu], origin)
    spans = spans.assign(link=link, link_id=np.where(corr >= 0, corr, -1 - np.arange(len(spans))))
    drawn = np.maximum(spans["end_ns"].to_numpy(np.int64) - spans["ts_ns"].to_numpy(np.int64), 1)
    spans = spans.assign(start_ms=(spans["ts_ns"] - origin) / 1e6, end_ms=(spans["end_ns"] - origin) / 1e6,
                         dur_ms=spans["busy_ns"] / 1e6,
                         busy_fraction=np.minimum(spans["busy_ns"].to_numpy(np.float64) / drawn, 1.0))
    return TimelineView(spans=spans[SPAN_COLUMNS].reset_index(drop=True), rows=rows, steps=step_labels,
                        start_ms=(lo - origin) / 1e6, end_ms=(hi - origin) / 1e6, total_spans=total,
                        merged_spans=merged, resolution_ms=px / 1e6,
                        kernels=int((frame["kind"] == "kernel").sum()),
                        kernels_drawn=int(((spans["kind"] == "kernel") & (spans["spans"] == 1)).sum()))


def _path_spans(trace: RankTrace, lo: int, hi: int) -> pd.DataFrame:
    """The critical path's segments in ``[lo, hi)``, named by kind and what they are ("kernel: K1")."""
    segs = [seg for step in critical_path(trace).steps if step.end_ns > lo and step.start_ns < hi
            for seg in step.segments if seg.start_ns + seg.dur_ns > lo and seg.start_ns < hi]
    return pd.DataFrame({"row": PATH_ROW, "name": [f"{s.kind}: {s.name}" for s in segs],
                         "kind": [PATH_KIND_LABEL[s.kind] for s in segs],
                         "ts_ns": np.array([s.start_ns for s in segs], dtype=np.int64),
                         "end_ns": np.array([s.start_ns + s.dur_ns for s in segs], dtype=np.int64),
                         "correlation": -1, "gpu": False})


def _merge_small(frame: pd.DataFrame, lo: int, px: float) -> tuple[pd.DataFrame, int]:
    """Spans under ``px`` ns merged per (row, kind, pixel): one block from the first start to the last end,
    ``spans`` = how many, ``busy_ns`` = the union of their intervals (spans of one row may overlap: nested host
    calls deeper than MAX_DEPTH share a row), named by the first one and the count."""
    dur = frame["end_ns"].to_numpy(np.int64) - frame["ts_ns"].to_numpy(np.int64)
    small = dur < px
    big = frame[~small].assign(spans=1, busy_ns=dur[~small])
    if not small.any():
        return big, 0
    tiny = frame[small].assign(bin=((frame["ts_ns"].to_numpy(np.int64)[small] - lo) // px).astype(np.int64))
    tiny = tiny.assign(busy_ns=_union_in_groups(tiny, ["row", "kind", "bin"]))
    g = tiny.groupby(["row", "kind", "bin"], sort=False, observed=True)
    agg = g.agg(name=("name", "first"), ts_ns=("ts_ns", "min"), end_ns=("end_ns", "max"), spans=("name", "size"),
                busy_ns=("busy_ns", "sum"), correlation=("correlation", "first"), gpu=("gpu", "first")).reset_index()
    many = agg["spans"].to_numpy() > 1
    agg.loc[many, "name"] = [
        f"{n:,} spans ({k}), {b / 1e6:,.3f} ms busy, first: {f}"
        for n, k, b, f in zip(
            agg["spans"][many], agg["kind"][many], agg["busy_ns"][many], agg["name"][many], strict=False
        )
    ]
    agg.loc[many, "correlation"] = -1
    # a block narrower than a pixel is drawn a pixel wide, or the browser would not draw it at all
    agg["end_ns"] = np.maximum(agg["end_ns"].to_numpy(np.int64), agg["ts_ns"].to_numpy(np.int64) + int(px))
    return pd.concat([big, agg.drop(columns=["bin"])], ignore_index=True), int(small.sum())


def _union_in_groups(frame: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """For each span, the time it adds to the union of its group's intervals taken in start order (so the group's
    sum is the measure of that union): its end past the furthest end of the spans before it, or 0."""
    ordered = frame.sort_values(keys + ["ts_ns"], kind="stable")
    ts = ordered["ts_ns"].to_numpy(np.int64)
    end = ordered["end_ns"].to_numpy(np.int64)
    group = ordered.groupby(keys, sort=False, observed=True).ngroup().to_numpy()
    reach = pd.Series(end).groupby(group).cummax().to_numpy()
    before = np.empty_like(reach)  # the furthest end of the group's earlier spans (-inf for the first)
    before[1:] = reach[:-1]
    first = np.ones(len(ts), dtype=bool)
    first[1:] = group[1:] != group[:-1]
    before[first] = np.iinfo(np.int64).min
    added = np.maximum(end - np.maximum(ts, before), 0)
    out = pd.Series(added, index=ordered.index).reindex(frame.index).to_numpy()
    return out


def _launch_index(trace: RankTrace) -> tuple[np.ndarray, pd.DataFrame]:
    from kinetoscope.analyze.model.timeline import launches

    calls = launches(trace)
    calls = calls[calls["correlation"].notna().to_numpy()].drop_duplicates("correlation")
    order = np.argsort(calls["correlation"].to_numpy(np.int64), kind="stable")
    calls = calls.iloc[order]
    return calls["correlation"].to_numpy(np.int64), calls


def _kernel_links(trace: RankTrace, corr: np.ndarray, origin: int) -> np.ndarray:
    """For each GPU span: the call that launched it, when, on which thread."""
    keys, calls = _launch_index(trace)
    out = np.full(len(corr), "", dtype=object)
    if not len(keys) or not len(corr):
        return out
    pos = np.minimum(np.searchsorted(keys, corr), len(keys) - 1)
    found = (corr >= 0) & (keys[pos] == corr)
    names = calls["name"].astype(str).to_numpy(object)
    ts = calls["ts_ns"].to_numpy()
    tids = calls["tid"].astype(str).to_numpy(object)
    for i in np.flatnonzero(found):
        p = pos[i]
        out[i] = f"launched by {names[p]} at {(ts[p] - origin) / 1e6:,.3f} ms on thread {tids[p]}"
    return out


def _launch_links(trace: RankTrace, corr: np.ndarray, origin: int) -> np.ndarray:
    """For each host span that launched GPU work: what it launched, where and when it ran."""
    out = np.full(len(corr), "", dtype=object)
    has = np.flatnonzero(corr >= 0)
    if not len(has):
        return out
    work = gpu_work(trace)
    work = work[work["correlation"].notna().to_numpy()].drop_duplicates("correlation")
    order = np.argsort(work["correlation"].to_numpy(np.int64), kind="stable")
    work = work.iloc[order]
    keys = work["correlation"].to_numpy(np.int64)
    if not len(keys):
        return out
    pos = np.minimum(np.searchsorted(keys, corr[has]), len(keys) - 1)
    found = keys[pos] == corr[has]
    names = work["name"].astype(str).to_numpy(object)
    ts = work["ts_ns"].to_numpy()
    stream = work["stream"].to_numpy()
    device = work["device"].to_numpy()
    for i, p, ok in zip(has, pos, found, strict=False):
        if ok:
            out[i] = f"runs {names[p][:80]} on GPU {device[p]} · stream {stream[p]} at {(ts[p] - origin) / 1e6:,.3f} ms"
    return out
