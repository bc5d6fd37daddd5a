"""Operator and kernel views (what the TensorBoard profiler plugin's Operator and Kernel pages showed): the
host ops and GPU kernels of the window by name, with total and self time. Computed on demand (the app's
page asks), never by ``analyze``: self time needs each op's children, a walk over every op."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from kinetoscope.analyze.model.phases import PHASES, host_phases, phase_lookup
from kinetoscope.analyze.model.timeline import CONTAINER_RE, gpu_work, kind_mask, name_mask, window
from kinetoscope.analyze.model.trace import RankTrace, trace_view
from kinetoscope.analyze.views.gpuinfo import TENSOR_CORE_RE  # names that say Tensor Cores; others say nothing


def _self_ns(ts: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Each op's own time: its duration less its direct children's (ops of its thread nested inside it)."""
    order = np.lexsort((-end, ts, tid))
    own = (end - ts).astype(np.int64)
    children = np.zeros(len(ts), dtype=np.int64)
    stack: list[int] = []
    last_tid = None
    for i in order:
        if tid[i] != last_tid:
            stack, last_tid = [], tid[i]
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            parent = stack[-1]
            children[parent] += min(end[i], end[parent]) - ts[i]
        stack.append(i)
    return np.maximum(own - children, 0)


@trace_view
def op_table(trace: RankTrace) -> pd.DataFrame:
    """Host ops (``cpu_op``, record_function containers left out) starting in the window, by name: calls,
    total and self time (ms), mean (ms), the threads they ran on and the step phase most of their time fell in."""
    w = window(trace)
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & ~name_mask(ev, CONTAINER_RE)]
    ops = ops[(ops["ts_ns"] >= w.start_ns) & (ops["ts_ns"] < w.end_ns)]
    cols = ["name", "calls", "total_ms", "self_ms", "mean_ms", "threads", "phase"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    ts, end = ops["ts_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    tid = ops["tid"].astype(str).to_numpy(object)
    self_ns = _self_ns(ts, end, tid)
    starts, ends, labels = phase_lookup(host_phases(trace))
    if starts.size:
        k = np.searchsorted(starts, ts, side="right") - 1
        inside = (k >= 0) & (ts < ends[np.maximum(k, 0)])
        phase = np.asarray(PHASES, dtype=object)[np.where(inside, labels[np.maximum(k, 0)], PHASES.index("other"))]
    else:
        phase = np.full(len(ts), "other", dtype=object)
    frame = pd.DataFrame({"name": ops["name"].astype(str).to_numpy(object), "dur": end - ts, "self": self_ns,
                          "tid": tid, "phase": phase})
    g = frame.groupby("name", sort=False)
    top_phase = frame.groupby(["name", "phase"], sort=False)["dur"].sum().reset_index() \
        .sort_values("dur", ascending=False).drop_duplicates("name").set_index("name")["phase"]
    out = pd.DataFrame({
        "calls": g.size(),
        "total_ms": g["dur"].sum() / 1e6,
        "self_ms": g["self"].sum() / 1e6,
        "threads": g["tid"].agg(lambda t: ", ".join(sorted(set(t)))),
    })
    out["mean_ms"] = out["total_ms"] / out["calls"]
    out["phase"] = top_phase.reindex(out.index).to_numpy()
    out = out.reset_index().sort_values(["self_ms", "total_ms"], ascending=False, kind="stable")
    return out[cols].reset_index(drop=True)


@trace_view
def kernel_table(trace: RankTrace) -> pd.DataFrame:
    """GPU kernels starting in the window, by name: count, total, mean and max time (ms), the streams they
    ran on, their share of all kernel time, and Tensor Core use as far as the name says (True or None)."""
    w = window(trace)
    work = gpu_work(trace)
    k = work[kind_mask(work, ("kernel",))]
    k = k[(k["ts_ns"] >= w.start_ns) & (k["ts_ns"] < w.end_ns)]
    cols = ["name", "count", "total_ms", "mean_ms", "max_ms", "streams", "share_of_kernel_time", "tensor_cores"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    frame = pd.DataFrame({"name": k["name"].astype(str).to_numpy(object), "dur": k["dur_ns"].to_numpy(np.int64),
                          "stream": k["stream"].to_numpy(np.int64)})
    g = frame.groupby("name", sort=False)
    out = pd.DataFrame({
        "count": g.size(),
        "total_ms": g["dur"].sum() / 1e6,
        "max_ms": g["dur"].max() / 1e6,
        "streams": g["stream"].agg(lambda s: ", ".join(str(x) for x in sorted(set(s)))),
    })
    out["mean_ms"] = out["total_ms"] / out["count"]
    total = float(frame["dur"].sum())
    out["share_of_kernel_time"] = out["total_ms"] * 1e6 / total if total else np.nan
    names = out.index.to_series()
    # numpy's stubs reject None as a value to choose; an object array holds it
    out["tensor_cores"] = np.where(names.str.contains(TENSOR_CORE_RE), True, None)  # type: ignore[call-overload]
    out = out.reset_index().sort_values("total_ms", ascending=False, kind="stable")
    return out[cols].reset_index(drop=True)


def _innermost(op_ts: np.ndarray, op_end: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each time in ``t`` (sorted), the index into the ops (one thread's, sorted by start, longest first at
    equal starts) of the innermost op running then, or -1: a walk with a stack of open ops."""
    out = np.full(len(t), -1, dtype=np.int64)
    stack: list[int] = []
    i = 0
    n = len(op_ts)
    for j, tj in enumerate(t):
        while i < n and op_ts[i] <= tj:
            while stack and op_end[stack[-1]] <= op_ts[i]:
                stack.pop()
            stack.append(i)
            i += 1
        while stack and op_end[stack[-1]] <= tj:
            stack.pop()
        if stack:
            out[j] = stack[-1]
    return out


#: the row that takes frees of blocks the window did not see allocated (before it, or no address to match)
EARLIER = "(allocated before the window, or unmatched)"


@trace_view
def _allocations(trace: RankTrace) -> pd.DataFrame:
    """The allocator's [memory] events of the window, each charged to the innermost host op running on its thread
    when it happened (TensorBoard's memory view did the same; "(no op)" outside any op), each free matched to the
    allocation of the same block (device and address) before it in the window: t_ns, bytes (signed), op, device,
    and, for a free, ``alloc`` (the position of its allocation, -1 where none was seen); for an allocation,
    ``freed_ns`` (when the window freed it, -1 where it did not)."""
    w = window(trace)
    mem = trace.memory
    mem = mem[((mem["ts_ns"] >= w.start_ns) & (mem["ts_ns"] < w.end_ns)).to_numpy()]
    mem = mem.iloc[np.argsort(mem["ts_ns"].to_numpy(), kind="stable")]
    n = len(mem)
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & ~name_mask(ev, CONTAINER_RE)]
    names = np.full(n, "(no op)", dtype=object)
    mem_tid = mem["tid"].astype(str).to_numpy(object)
    op_tid = ops["tid"].astype(str).to_numpy(object)
    t_all = mem["ts_ns"].to_numpy(np.int64)
    for tid in np.unique(mem_tid) if n else ():
        mine = np.flatnonzero(mem_tid == tid)
        sel = ops[op_tid == tid]
        if sel.empty:
            continue
        order = np.lexsort((-sel["end_ns"].to_numpy(), sel["ts_ns"].to_numpy()))
        o_ts, o_end = sel["ts_ns"].to_numpy()[order], sel["end_ns"].to_numpy()[order]
        o_name = sel["name"].astype(str).to_numpy(object)[order]
        hit = _innermost(o_ts, o_end, t_all[mine])  # mine is in time order already
        found = hit >= 0
        names[mine[found]] = o_name[hit[found]]
    b = mem["bytes"].to_numpy(np.int64)
    device = np.where(
        mem["device_type"].to_numpy() == 1, "cuda:" + mem["device_id"].astype(str).to_numpy(object), "cpu"
    )
    addr = mem["addr"].to_numpy(dtype=np.float64, na_value=np.nan)
    alloc_of = np.full(n, -1, dtype=np.int64)
    freed_ns = np.full(n, -1, dtype=np.int64)
    live: dict[tuple[str, float], int] = {}
    for i in range(n):
        if addr[i] != addr[i]:  # no address recorded: nothing to match
            continue
        key = (device[i], addr[i])
        if b[i] > 0:
            live[key] = i
        elif b[i] < 0:
            j = live.pop(key, -1)
            alloc_of[i] = j
            if j >= 0:
                freed_ns[j] = t_all[i]
    return pd.DataFrame({"t_ns": t_all, "bytes": b, "op": names, "device": device, "alloc": alloc_of,
                         "freed_ns": freed_ns})


@trace_view
def allocations_by_op(trace: RankTrace) -> pd.DataFrame:
    """Per op and device (``_allocations``' charging): allocations, MiB allocated, MiB of those freed within the
    window, MiB they still hold at its end (``held_mib``: allocated less freed, never more than what the op
    allocated), the largest single allocation. Frees of blocks the window did not see allocated are charged to
    the ``EARLIER`` row (its held is negative: memory given back). Per device, the rows' held adds up to the change
    of allocated memory over the window."""
    a = _allocations(trace)
    cols = ["op", "device", "allocations", "allocated_mib", "freed_mib", "held_mib", "largest_mib"]
    if a.empty:
        return pd.DataFrame(columns=cols)
    b = a["bytes"].to_numpy(np.int64)
    is_alloc = b > 0
    owner = a["op"].to_numpy(object).copy()
    free = np.flatnonzero(b < 0)
    matched = a["alloc"].to_numpy()[free]
    owner[free] = np.where(matched >= 0, a["op"].to_numpy(object)[np.maximum(matched, 0)], EARLIER)
    frame = pd.DataFrame({"op": owner, "device": a["device"].to_numpy(object), "alloc": np.where(is_alloc, b, 0),
                          "free": np.where(b < 0, -b, 0), "is_alloc": is_alloc})
    g = frame.groupby(["op", "device"], sort=False)
    out = pd.DataFrame({"allocations": g["is_alloc"].sum(), "allocated_mib": g["alloc"].sum() / 2**20,
                        "freed_mib": g["free"].sum() / 2**20, "largest_mib": g["alloc"].max() / 2**20}).reset_index()
    out["held_mib"] = out["allocated_mib"] - out["freed_mib"]
    out["allocations"] = out["allocations"].astype(np.int64)
    return out.sort_values(["held_mib", "allocated_mib"], ascending=False, kind="stable")[cols].reset_index(drop=True)


def allocation_events(trace: RankTrace, start_ms: float | None = None, end_ms: float | None = None) -> pd.DataFrame:
    """Every allocation of the window (or of ``[start_ms, end_ms)``, ms from the window start): when (ms from the
    window start), MiB, the op and device, when the window freed it and how long it lived (ms; blank where the
    window did not free it)."""
    a = _allocations(trace)
    origin = window(trace).start_ns
    allocs = a[a["bytes"].to_numpy() > 0]
    t_ms = (allocs["t_ns"].to_numpy(np.int64) - origin) / 1e6
    keep = np.ones(len(allocs), dtype=bool)
    if start_ms is not None:
        keep &= t_ms >= start_ms
    if end_ms is not None:
        keep &= t_ms < end_ms
    allocs, t_ms = allocs[keep], t_ms[keep]
    freed = allocs["freed_ns"].to_numpy(np.int64)
    freed_ms = np.where(freed >= 0, (freed - origin) / 1e6, np.nan)
    return pd.DataFrame({"time_ms": t_ms, "size_mib": allocs["bytes"].to_numpy(np.int64) / 2**20,
                         "op": allocs["op"].to_numpy(object), "device": allocs["device"].to_numpy(object),
                         "freed_at_ms": freed_ms, "lifetime_ms": freed_ms - t_ms})


class _ShapeArgs(msgspec.Struct, gc=False):
    dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw(b""))


class _ShapeEvent(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    args: _ShapeArgs | None = None


class _ShapeDoc(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw] = []  # noqa: N815 (the trace's key)


def op_shapes(data: bytes, trace: RankTrace) -> pd.DataFrame:
    """Host ops of the window grouped by name and input shapes (``args["Input Dims"]``, written by
    ``record_shapes=True``): calls, total and mean time (ms). The loader does not keep shapes (they are a large
    share of a trace's bytes), so this reads the trace's JSON ``data`` again, on demand. Shapes are shown as
    written; an op recorded without them has "" (not recorded)."""
    w = window(trace)
    cols = ["name", "input_shapes", "calls", "total_ms", "mean_ms"]
    try:
        doc = msgspec.json.decode(data, type=_ShapeDoc)
    except msgspec.DecodeError:
        doc = _ShapeDoc(traceEvents=msgspec.json.decode(data, type=list[msgspec.Raw]))
    decode = msgspec.json.Decoder(_ShapeEvent)
    names, shapes, durs = [], [], []
    compact: dict[bytes, str] = {}
    lo, hi = w.start_ns / 1000.0, w.end_ns / 1000.0
    for raw in doc.traceEvents:
        try:
            e = decode.decode(raw)
        except msgspec.DecodeError:
            continue  # not an op event (metadata, odd values): never an op of the table
        if e.ph != "X" or e.cat.lower() not in ("cpu_op", "operator") or not (lo <= e.ts < hi):
            continue
        names.append(e.name)
        raw_dims = bytes(e.args.dims) if e.args is not None else b""
        shape = compact.get(raw_dims)
        if shape is None:  # as written, without the layout's whitespace: [[64, 1024], []]
            try:
                shape = json.dumps(msgspec.json.decode(raw_dims)) if raw_dims else ""
            except msgspec.DecodeError:
                shape = ""
            compact[raw_dims] = shape
        shapes.append(shape)
        durs.append(e.dur)
    if not names:
        return pd.DataFrame(columns=cols)
    frame = pd.DataFrame({"name": names, "input_shapes": shapes, "dur": durs})
    frame = frame[~frame["name"].str.match(CONTAINER_RE)]
    g = frame.groupby(["name", "input_shapes"], sort=False)["dur"]
    out = pd.DataFrame({"calls": g.size(), "total_ms": g.sum() / 1000.0}).reset_index()
    out["mean_ms"] = out["total_ms"] / out["calls"]
    return out.sort_values("total_ms", ascending=False, kind="stable")[cols].reset_index(drop=True)


# --- device time per operator, call stacks, modules --------------------------------------------------------------
@trace_view
def launch_device_ns(trace: RankTrace) -> pd.DataFrame:
    """Each host call that launched recorded GPU work: its thread, start, and the GPU time of what it launched
    (the kernels, copies and memsets of its correlation id, their durations added), sorted by thread then start."""
    from kinetoscope.analyze.model.timeline import launches

    calls = launches(trace)
    calls = calls[calls["correlation"].notna().to_numpy()]
    work = gpu_work(trace)
    work = work[work["correlation"].notna().to_numpy()]
    per_corr = work.groupby(work["correlation"].astype(np.int64))["dur_ns"].sum()
    corr = calls["correlation"].astype(np.int64).to_numpy()
    gpu_ns = per_corr.reindex(corr).fillna(0).to_numpy(np.int64)
    out = pd.DataFrame({"tid": calls["tid"].astype(str).to_numpy(object), "ts_ns": calls["ts_ns"].to_numpy(np.int64),
                        "gpu_ns": gpu_ns})
    return out.sort_values(["tid", "ts_ns"], kind="stable").reset_index(drop=True)


def _device_inside(ts: np.ndarray, end: np.ndarray, tid: np.ndarray, calls: pd.DataFrame) -> np.ndarray:
    """For each interval (its thread, start, end): the GPU time launched by the calls of its thread inside it."""
    out = np.zeros(len(ts), dtype=np.int64)
    c_tid = calls["tid"].to_numpy(object)
    for t in np.unique(tid) if len(ts) else ():
        mine = np.flatnonzero(tid == t)
        sel = c_tid == t
        c_ts = calls["ts_ns"].to_numpy(np.int64)[sel]
        if not len(c_ts):
            continue
        cum = np.concatenate(([0], np.cumsum(calls["gpu_ns"].to_numpy(np.int64)[sel])))
        out[mine] = (
            cum[np.searchsorted(c_ts, end[mine], side="left")] - cum[np.searchsorted(c_ts, ts[mine], side="left")]
        )
    return out


@trace_view
def op_device_time(trace: RankTrace) -> pd.DataFrame:
    """Per host op name (``op_table``'s ops): the GPU time of the work it launched, directly (``device_self_ms``:
    launches whose innermost op it is) and with the ops it calls (``device_total_ms``), through the launches'
    correlation ids."""
    w = window(trace)
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & ~name_mask(ev, CONTAINER_RE)]
    ops = ops[((ops["ts_ns"] >= w.start_ns) & (ops["ts_ns"] < w.end_ns)).to_numpy()]
    cols = ["name", "device_self_ms", "device_total_ms"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    calls = launch_device_ns(trace)
    ts, end = ops["ts_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    tid = ops["tid"].astype(str).to_numpy(object)
    names = ops["name"].astype(str).to_numpy(object)
    total = _device_inside(ts, end, tid, calls)
    own = np.zeros(len(ops), dtype=np.int64)
    c_tid = calls["tid"].to_numpy(object)
    for t in np.unique(tid):
        mine = np.flatnonzero(tid == t)
        order = mine[np.lexsort((-end[mine], ts[mine]))]
        sel = c_tid == t
        hit = _innermost(ts[order], end[order], calls["ts_ns"].to_numpy(np.int64)[sel])
        found = hit >= 0
        np.add.at(own, order[hit[found]], calls["gpu_ns"].to_numpy(np.int64)[sel][found])
    frame = pd.DataFrame({"name": names, "self": own, "total": total})
    g = frame.groupby("name", sort=False)
    return pd.DataFrame({"device_self_ms": g["self"].sum() / 1e6, "device_total_ms": g["total"].sum() / 1e6}) \
        .reset_index()[cols]


def _enclosing(inner_ts: np.ndarray, inner_tid: np.ndarray, outer: pd.DataFrame) -> list[list[int]]:
    """For each inner moment (its thread, time): the positions in ``outer`` of the spans of its thread that hold it,
    outermost first."""
    out: list[list[int]] = [[] for _ in range(len(inner_ts))]
    o_tid = outer["tid"].astype(str).to_numpy(object)
    o_ts, o_end = outer["ts_ns"].to_numpy(np.int64), outer["end_ns"].to_numpy(np.int64)
    for t in np.unique(inner_tid) if len(inner_ts) else ():
        mine = np.flatnonzero(inner_tid == t)
        cand = np.flatnonzero(o_tid == t)
        if not len(cand):
            continue
        cand = cand[np.lexsort((-o_end[cand], o_ts[cand]))]
        order = mine[np.argsort(inner_ts[mine], kind="stable")]
        stack: list[int] = []
        i = 0
        for j in order:
            tj = inner_ts[j]
            while i < len(cand) and o_ts[cand[i]] <= tj:
                while stack and o_end[stack[-1]] <= o_ts[cand[i]]:
                    stack.pop()
                stack.append(cand[i])
                i += 1
            while stack and o_end[stack[-1]] <= tj:
                stack.pop()
            out[j] = list(stack)
    return out


#: python_function events of nn.Module forward calls (with_stack / with_modules)
MODULE_PREFIX = "nn.Module: "
#: the innermost frames of a call stack shown (the rest said to be there)
STACK_FRAMES = 12


def _python_frames(trace: RankTrace) -> pd.DataFrame:
    ev = trace.events
    return ev[kind_mask(ev, ("python",))]


@trace_view
def op_call_stacks(trace: RankTrace) -> pd.DataFrame:
    """Host ops of the window by name and the Python call stack they ran under (the python_function frames of
    their thread holding them, innermost first, module frames left out; ``with_stack=True``): calls, total ms.
    Empty where the trace records no Python frames."""
    w = window(trace)
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & ~name_mask(ev, CONTAINER_RE)]
    ops = ops[((ops["ts_ns"] >= w.start_ns) & (ops["ts_ns"] < w.end_ns)).to_numpy()]
    frames = _python_frames(trace)
    frames = frames[~frames["name"].astype(str).str.startswith(MODULE_PREFIX).to_numpy()]
    cols = ["name", "call_stack", "calls", "total_ms"]
    if ops.empty or frames.empty:
        return pd.DataFrame(columns=cols)
    held = _enclosing(ops["ts_ns"].to_numpy(np.int64), ops["tid"].astype(str).to_numpy(object), frames)
    frame_names = frames["name"].astype(str).to_numpy(object)
    stacks = [
        " ← ".join([frame_names[k] for k in reversed(h)][:STACK_FRAMES]) + (" ← …" if len(h) > STACK_FRAMES else "")
        for h in held
    ]
    frame = pd.DataFrame({"name": ops["name"].astype(str).to_numpy(object), "call_stack": stacks,
                          "dur": ops["dur_ns"].to_numpy(np.int64)})
    frame = frame[frame["call_stack"] != ""]
    g = frame.groupby(["name", "call_stack"], sort=False)["dur"]
    out = pd.DataFrame({"calls": g.size(), "total_ms": g.sum() / 1e6}).reset_index()
    return out.sort_values("total_ms", ascending=False, kind="stable")[cols].reset_index(drop=True)


def _module_paths(trace: RankTrace) -> tuple[pd.DataFrame, list[str]]:
    """The window's nn.Module calls and each one's path in the module hierarchy ("Net_0 / Linear_1")."""
    w = window(trace)
    frames = _python_frames(trace)
    mods = frames[frames["name"].astype(str).str.startswith(MODULE_PREFIX).to_numpy()]
    mods = mods[((mods["end_ns"] > w.start_ns) & (mods["ts_ns"] < w.end_ns)).to_numpy()]
    names = [n[len(MODULE_PREFIX):] for n in mods["name"].astype(str)]
    held = _enclosing(mods["ts_ns"].to_numpy(np.int64), mods["tid"].astype(str).to_numpy(object), mods)
    paths = []
    for i, h in enumerate(held):
        chain = [names[k] for k in h if k != i]  # a module holds itself at its own start: left out
        paths.append(" / ".join(chain + [names[i]]))
    return mods, paths


@trace_view
def module_tree(trace: RankTrace) -> pd.DataFrame:
    """The nn.Module hierarchy of the window (python_function events ``nn.Module: Name_k``, recorded with
    ``with_stack=True``), one row per module path in call order: depth, module, calls, host time (ms: the calls'
    durations; self: less the modules they call) and device time (ms: the GPU time of what was launched inside,
    through correlation ids). Empty where the trace records no module events."""
    mods, paths = _module_paths(trace)
    cols = ["path", "depth", "module", "calls", "host_ms", "host_self_ms", "device_ms"]
    if mods.empty:
        return pd.DataFrame(columns=cols)
    ts, end = mods["ts_ns"].to_numpy(np.int64), mods["end_ns"].to_numpy(np.int64)
    tid = mods["tid"].astype(str).to_numpy(object)
    device = _device_inside(ts, end, tid, launch_device_ns(trace))
    dur = end - ts
    parent_of = {p: p.rsplit(" / ", 1)[0] if " / " in p else None for p in paths}
    frame = pd.DataFrame({"path": paths, "dur": dur, "device": device, "first": ts})
    g = frame.groupby("path", sort=False)
    out = pd.DataFrame({"calls": g.size(), "host": g["dur"].sum(), "device": g["device"].sum(),
                        "first": g["first"].min()})
    children = out["host"].groupby(pd.Series([parent_of[p] for p in out.index], index=out.index)).sum()
    out["self"] = out["host"] - children.reindex(out.index).fillna(0).to_numpy(np.int64)
    out = out.reset_index()
    # depth-first in call order: a module's children right after it (each path sorted by when each of its
    # ancestors was first called)
    first = dict(zip(out["path"], out["first"], strict=False))
    parts = [p.split(" / ") for p in out["path"]]
    keys = [[(int(first.get(" / ".join(q[:k + 1]), 0)), q[k]) for k in range(len(q))] for q in parts]
    out = out.iloc[sorted(range(len(out)), key=lambda i: keys[i])]
    return pd.DataFrame({"path": out["path"].to_numpy(object),
                         "depth": [p.count(" / ") for p in out["path"]],
                         "module": [p.rsplit(" / ", 1)[-1] for p in out["path"]],
                         "calls": out["calls"].to_numpy(np.int64), "host_ms": out["host"].to_numpy() / 1e6,
                         "host_self_ms": out["self"].to_numpy() / 1e6, "device_ms": out["device"].to_numpy() / 1e6},
                        columns=cols).reset_index(drop=True)


@trace_view
def op_modules(trace: RankTrace) -> pd.DataFrame:
    """Host ops of the window by the innermost nn.Module they ran in (its path; "(outside any module)": the
    backward pass, the optimizer) and name: calls, total ms."""
    w = window(trace)
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & ~name_mask(ev, CONTAINER_RE)]
    ops = ops[((ops["ts_ns"] >= w.start_ns) & (ops["ts_ns"] < w.end_ns)).to_numpy()]
    mods, paths = _module_paths(trace)
    cols = ["module", "name", "calls", "total_ms"]
    if ops.empty or mods.empty:
        return pd.DataFrame(columns=cols)
    held = _enclosing(ops["ts_ns"].to_numpy(np.int64), ops["tid"].astype(str).to_numpy(object), mods)
    where = [paths[h[-1]] if h else "(outside any module)" for h in held]
    frame = pd.DataFrame({"module": where, "name": ops["name"].astype(str).to_numpy(object),
                          "dur": ops["dur_ns"].to_numpy(np.int64)})
    g = frame.groupby(["module", "name"], sort=False)["dur"]
    out = pd.DataFrame({"calls": g.size(), "total_ms": g.sum() / 1e6}).reset_index()
    return out.sort_values("total_ms", ascending=False, kind="stable")[cols].reset_index(drop=True)


class _StackArgs(msgspec.Struct, gc=False):
    stack: Any = msgspec.field(name="Call stack", default=None)


class _StackEvent(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    args: _StackArgs | None = None


def op_call_stacks_from_args(data: bytes, trace: RankTrace) -> pd.DataFrame:
    """``op_call_stacks`` from the ``Call stack`` argument older PyTorch versions wrote on each op (``frame;frame;
    ...``, innermost first), read from the trace's JSON ``data`` again (the loader does not keep it)."""
    w = window(trace)
    lo, hi = w.start_ns / 1000.0, w.end_ns / 1000.0
    cols = ["name", "call_stack", "calls", "total_ms"]
    try:
        doc = msgspec.json.decode(data, type=_ShapeDoc)
    except msgspec.DecodeError:
        doc = _ShapeDoc(traceEvents=msgspec.json.decode(data, type=list[msgspec.Raw]))
    decode = msgspec.json.Decoder(_StackEvent)
    rows: dict[tuple[str, str], list[float]] = {}
    for raw in doc.traceEvents:
        try:
            e = decode.decode(raw)
        except msgspec.DecodeError:
            continue
        if (e.ph != "X" or e.cat.lower() not in ("cpu_op", "operator") or e.args is None
                or not isinstance(e.args.stack, str) or not (lo <= e.ts < hi) or CONTAINER_RE.match(e.name)):
            continue
        frames = [f for f in e.args.stack.split(";") if f]
        stack = " ← ".join(frames[:STACK_FRAMES]) + (" ← …" if len(frames) > STACK_FRAMES else "")
        got = rows.setdefault((e.name, stack), [0, 0.0])
        got[0] += 1
        got[1] += e.dur / 1000.0
    out = pd.DataFrame([(n, s, c, t) for (n, s), (c, t) in rows.items()], columns=cols)
    return out.sort_values("total_ms", ascending=False, kind="stable").reset_index(drop=True)
