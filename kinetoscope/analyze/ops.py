"""Operator and kernel views (what the TensorBoard profiler plugin's Operator and Kernel pages showed): the
host ops and GPU kernels of the window by name, with total and self time. Computed on demand (the app's
page asks), never by ``analyze``: self time needs each op's children, a walk over every op."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kinetoscope.analyze.analyzers.anatomy import PHASES, _phase_lookup, host_phases
from kinetoscope.analyze.timeline import CONTAINER_RE, gpu_work, kind_mask, name_mask, window
from kinetoscope.analyze.trace import RankTrace, trace_view

#: kernel names that say they run on Tensor Cores (MMA instruction shapes, cuBLAS/CUTLASS tensor-op kernels);
#: a name that says nothing is "unknown", not "no"
TENSOR_CORE_RE = re.compile(r"884|1688|16816|16832|hmma|xmma|wgmma|imma|tensorop|_s16816|_h16816|gemmSm90|sm90_",
                            re.IGNORECASE)


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
    starts, ends, labels = _phase_lookup(host_phases(trace))
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
    out["tensor_cores"] = np.where(names.str.contains(TENSOR_CORE_RE), True, None)
    out = out.reset_index().sort_values("total_ms", ascending=False, kind="stable")
    return out[cols].reset_index(drop=True)
