"""What each fix is worth: a replay of a rank's steps, and each finding's fix as an edit of that replay.

The replay is a dependency graph built from the trace, then re-timed:

* **Host**: the launching threads run as recorded, except at *elastic items* on the training thread: waits
  for data (``enumerate(DataLoader)`` spans), synchronising calls (stream/device/event syncs, blocking
  copies, frees) and copy calls that held the host for their copy (pageable memory). An item that ends
  earlier or later moves everything the host does after it by the same amount (a piecewise-constant
  *shift*), launches included.
* **GPU**: each kernel, copy and memset starts at ``max(its launch + a, the previous op on its stream + b)``
  and lasts its recorded duration. ``a`` and ``b`` come from the trace: the constraint that decided the
  recorded start keeps its recorded offset, the other gets a typical one (never larger than recorded), so
  the unchanged graph reproduces every recorded start. Waits on other streams or ranks stay fixed offsets.
* **Syncs** end at ``max(start + own overhead, end of the GPU op they waited for + its recorded tail)``.

A fix edits the graph (a shorter data wait, a sync that no longer waits, a faster copy) and the replay
says where the steps end: a host sped up against a busy GPU simply waits for the GPU at its next sync.
The mean step time after is ``max(host steps, GPU busy per step)``. Fixes the replay cannot express
(CUDA graphs, a straggler's cause, compilation) are estimated from what the trace measured, and say so
(``method``). Everything here is a pure function of the rank trace and the finding.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.timeline import (
    cpu_shares,
    handoff_ns,
    SYNC_RUNTIME_RE,
    gpu_work,
    launches,
    loader_spans,
    main_thread,
    name_mask,
    runtime_calls,
)
from kinetoscope.analyze.model.trace import RankTrace, trace_view

NONE = -(2**60)  # "no constraint" in int64 arithmetic
#: a sync that returns at once still costs its call (measured: 2-10 us)
SYNC_OVERHEAD_NS = 5_000
#: an async (pinned, non_blocking) copy call costs about a kernel launch
ASYNC_COPY_CALL_NS = 10_000
#: tolerance between host and GPU clocks when matching a sync to the op it waited for
CLOCK_TOL_NS = 5_000
#: a typical back-to-back gap between ops on one stream
STREAM_GAP_NS = 1_000
#: host-to-device bandwidth from pinned memory when the trace has no pinned copy to measure it from, by
#: device family (PCIe generation of its usual host link, practical x16 rates)
PINNED_GBPS = ((re.compile(r"H100|H200|H800|B100|B200|GB200|MI300|MI325|L40"), 50.0),
               (re.compile(r"A100|A800|A10|A30|A40|A6000|L4|MI250|MI210|RTX 30|RTX 40"), 24.0))
PINNED_GBPS_DEFAULT = 12.0  # PCIe 3.0 x16
_PCIE3 = re.compile(r"V100|T4|P100|P40|P4|K80|M60|GP100|RTX 20|Quadro")
#: what taking a batch from a DataLoader worker costs the training loop (queue, unpickling, shared memory),
#: where the trace cannot show it (it had no workers): ~1.4 ms per batch on the public V100 ResNet-50 trace
#: with 4 workers (18 MiB batches) and 1.2-2 ms on a 2-core CPU machine (128 KiB batches)
HANDOFF_PRIOR_NS = 1_000_000
#: what a CUDA-graph replay costs the host per step (one launch call)
GRAPH_REPLAY_NS = 20_000


# --- the graph ---------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ReplayGraph:
    #: complete steps of the window (host clock), sorted
    step_start: np.ndarray
    step_end: np.ndarray
    #: GPU ops sorted by recorded start: anchor (host time of the launch call's start, or the op's own
    #: start when no launch is recorded), start, duration, stream code, offsets a (from anchor) and b (from
    #: the previous op on its stream), row label in ``gpu_work``
    op_anchor: np.ndarray
    op_start: np.ndarray
    op_dur: np.ndarray
    op_stream: np.ndarray
    op_device: np.ndarray
    op_a: np.ndarray
    op_b: np.ndarray
    op_label: np.ndarray
    #: an op on another stream whose end this op waited for (an event wait), -1 for none, and the offset
    op_dep: np.ndarray
    op_c: np.ndarray
    #: elastic host items of the training thread, disjoint, sorted by start: start, end, kind ("data" |
    #: "sync" | "copy"), the op index awaited (-1: none), the recorded tail after that op's end, the item's
    #: own minimum duration, the data wait it lies in (-1: none; a wait holding a sync or a copy is split
    #: around it), and a copy item's direction ("HtoD", "DtoH", ...)
    it_start: np.ndarray
    it_end: np.ndarray
    it_kind: np.ndarray
    it_await: np.ndarray
    it_post: np.ndarray
    it_min: np.ndarray
    it_group: np.ndarray
    it_dir: np.ndarray
    #: each data wait of the training thread: start, end (the items of group g are its pieces)
    wait_start: np.ndarray
    wait_end: np.ndarray
    #: the launch latency typical of this rank (ns), used for constraints that did not bind
    typical_launch_ns: int

    @property
    def steps(self) -> int:
        return int(len(self.step_start))

    @property
    def measured_step_ns(self) -> float | None:
        return float(np.mean(self.step_end - self.step_start)) if self.steps else None


def _complete_steps(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    steps = trace.steps
    if len(steps) and "partial" in steps:
        steps = steps[~steps["partial"].to_numpy()]
    return steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)


@trace_view
def replay_graph(trace: RankTrace) -> ReplayGraph:
    s0, s1 = _complete_steps(trace)
    work = gpu_work(trace)
    ts = work["ts_ns"].to_numpy(np.int64)
    dur = np.maximum(work["dur_ns"].to_numpy(np.int64), 0)
    order = np.argsort(ts, kind="stable")
    ts, dur = ts[order], dur[order]
    label = work.index.to_numpy()[order]
    device = work["device"].to_numpy(np.int64)[order]
    stream_key = device * 1_000_000_007 + work["stream"].to_numpy(np.int64)[order]
    _, stream = np.unique(stream_key, return_inverse=True)
    # the launch call of each op (correlation id), graph replays included
    calls = launches(trace)
    calls = calls[calls["correlation"].notna().to_numpy()].drop_duplicates("correlation")
    keys = calls["correlation"].to_numpy(np.int64)
    korder = np.argsort(keys, kind="stable")
    keys, call_ts = keys[korder], calls["ts_ns"].to_numpy(np.int64)[korder]
    corr = work["correlation"].to_numpy(dtype=float, na_value=np.nan)[order]
    has = ~np.isnan(corr)
    corr_i = np.where(has, corr, -1).astype(np.int64)
    anchor = ts.copy()
    if len(keys):
        pos = np.minimum(np.searchsorted(keys, corr_i), len(keys) - 1)
        found = has & (keys[pos] == corr_i)
        anchor[found] = np.minimum(call_ts[pos[found]], ts[found])
    # the previous op on the same stream (recorded order)
    prev_end = np.full(len(ts), NONE, dtype=np.int64)
    if len(ts):
        by_stream = np.lexsort((np.arange(len(ts)), stream))
        ends = (ts + dur)[by_stream]
        same = np.r_[False, stream[by_stream][1:] == stream[by_stream][:-1]]
        pe = np.where(same, np.r_[NONE, ends[:-1]], NONE)
        prev_end[by_stream] = pe
    slack_launch = ts - anchor
    slack_stream = np.where(prev_end > NONE, ts - prev_end, np.iinfo(np.int64).max)
    launch_binds = slack_launch <= slack_stream
    lat = slack_launch[launch_binds & (slack_launch >= 0) & (anchor < ts)]
    typical = int(np.clip(np.median(lat), 0, 50_000)) if len(lat) else 0
    # an op that neither its launch nor its stream explains, right after an op on another stream of its
    # device ended, waited for that op (an event: a copy stream feeding compute, compute feeding NCCL)
    dep, c = _event_waits(ts, dur, device, stream, np.minimum(slack_launch - typical, slack_stream))
    by_dep = dep >= 0
    launch_binds &= ~by_dep
    lat = slack_launch[launch_binds & (slack_launch >= 0) & (anchor < ts)]  # without the event waits
    typical = int(np.clip(np.median(lat), 0, 50_000)) if len(lat) else 0
    stream_binds = ~launch_binds & ~by_dep
    a = np.where(launch_binds, slack_launch, np.minimum(slack_launch, typical))
    b = np.where(prev_end > NONE, np.where(stream_binds, slack_stream, np.minimum(slack_stream, STREAM_GAP_NS)), 0)
    items = _items(trace, ts, dur, anchor, label)
    return ReplayGraph(step_start=s0, step_end=s1, op_anchor=anchor, op_start=ts, op_dur=dur, op_stream=stream,
                       op_device=device, op_a=a.astype(np.int64), op_b=b.astype(np.int64), op_label=label,
                       op_dep=dep, op_c=c, typical_launch_ns=typical, **items)


def _event_waits(ts: np.ndarray, dur: np.ndarray, device: np.ndarray, stream: np.ndarray,
                 unexplained: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ops whose start is unexplained by more than the clock tolerance: the op on another stream of the
    same device that ended last, within the tolerance before it started (-1: none), and the offset."""
    n = len(ts)
    dep = np.full(n, -1, dtype=np.int64)
    c = np.zeros(n, dtype=np.int64)
    want = np.flatnonzero(unexplained > CLOCK_TOL_NS)
    if not len(want):
        return dep, c
    end = ts + dur
    for d in np.unique(device[want]):
        mine = np.flatnonzero(device == d)
        order = mine[np.argsort(end[mine], kind="stable")]
        ends = end[order]
        for j in want[device[want] == d]:
            k = int(np.searchsorted(ends, ts[j], side="right")) - 1
            for _ in range(8):  # the latest ends before it, skipping its own stream
                if k < 0 or ends[k] < ts[j] - CLOCK_TOL_NS:
                    break
                o = order[k]
                if stream[o] != stream[j]:
                    dep[j], c[j] = o, ts[j] - ends[k]
                    break
                k -= 1
    return dep, c


def _items(trace: RankTrace, ts: np.ndarray, dur: np.ndarray, anchor: np.ndarray, label: np.ndarray) -> dict[str, np.ndarray]:
    """The training thread's elastic items: data waits, syncs (with the op each waited for) and copy calls
    that held the host until their copy ended (pageable memory, synchronous APIs, ``.item()``'s read-back).
    Syncs on other threads are left as recorded: the training thread did not wait in them."""
    waits = loader_spans(trace)
    main = main_thread(trace)
    calls: list[tuple[int, int, str, int, int, int, str]] = []
    if len(ts) and main is not None:
        end = ts + dur
        by_anchor = np.argsort(anchor, kind="stable")
        anchors_sorted = anchor[by_anchor]
        rt = runtime_calls(trace)
        rt = rt[(rt["tid"].astype(str) == main).to_numpy()]
        syncs = rt[name_mask(rt, SYNC_RUNTIME_RE)]
        for s_, e_ in zip(syncs["ts_ns"].to_numpy(), syncs["end_ns"].to_numpy()):
            hi = np.searchsorted(anchors_sorted, s_, side="right")
            cand = by_anchor[max(0, hi - 4096):hi]
            # the op it waited for: launched before it, ended by the time it returned
            cand = cand[(end[cand] <= e_ + CLOCK_TOL_NS) & (ts[cand] <= e_)]
            if not len(cand):
                continue
            j = int(cand[np.argmax(end[cand])])
            if end[j] > s_:  # it waited for op j: it returns a recorded tail after j ends, or after its overhead
                calls.append((int(s_), int(e_), "sync", j, int(e_ - end[j]), int(min(e_ - s_, SYNC_OVERHEAD_NS)), ""))
            else:  # the GPU was done before the call: it cost its own time, and waits if j ends later after a fix
                calls.append((int(s_), int(e_), "sync", j, int(min(e_ - s_, SYNC_OVERHEAD_NS)), int(e_ - s_), ""))
        from kinetoscope.analyze.model.copies import copies

        cp = copies(trace)
        if len(cp):
            pos_of = pd.Series(np.arange(len(label)), index=label)
            launched = rt[rt["correlation"].notna().to_numpy()].drop_duplicates("correlation")
            launched = launched.set_index(launched["correlation"].to_numpy(np.int64))
            for lab, corr, pageable, sync_api, direction in zip(
                    cp.index.to_numpy(), cp["correlation"].to_numpy(dtype=float, na_value=np.nan),
                    cp["pageable"].to_numpy(), cp["synchronous"].to_numpy(), cp["direction"].to_numpy()):
                if np.isnan(corr) or int(corr) not in launched.index or lab not in pos_of.index:
                    continue
                call = launched.loc[int(corr)]
                j = int(pos_of[lab])
                s_, e_ = int(call["ts_ns"]), int(call["end_ns"])
                held = s_ <= ts[j] and e_ >= end[j] - CLOCK_TOL_NS
                if held and (pageable or sync_api or dur[j] >= 20_000):
                    calls.append((s_, e_, "copy", j, int(e_ - end[j]), int(min(e_ - s_, ASYNC_COPY_CALL_NS)),
                                  str(direction)))
    calls.sort(key=lambda r: (r[0], -r[1]))
    outer: list[tuple[int, int, str, int, int, int, str]] = []
    for r in calls:  # a copy inside a sync (cudaMemcpy's own sync) is the outer call's
        if outer and r[0] < outer[-1][1]:
            continue
        outer.append(r)
    # data waits, split around the syncs and copies inside them (a Dataset calling .cuda(), a collate syncing)
    rows: list[tuple[int, int, str, int, int, int, int, str]] = []
    w_start = waits["ts_ns"].to_numpy(np.int64)
    w_end = waits["end_ns"].to_numpy(np.int64)
    order = np.argsort(w_start, kind="stable")
    w_start, w_end = w_start[order], w_end[order]
    keep = np.r_[True, w_start[1:] >= np.maximum.accumulate(w_end)[:-1]] if len(w_start) else np.zeros(0, bool)
    w_start, w_end = w_start[keep], w_end[keep]
    starts = np.asarray([r[0] for r in outer], dtype=np.int64)
    used = np.zeros(len(outer), dtype=bool)
    for g, (ws, we) in enumerate(zip(w_start, w_end)):
        lo, hi = np.searchsorted(starts, ws, side="left"), np.searchsorted(starts, we, side="left")
        cur = int(ws)
        for k in range(lo, hi):
            r = outer[k]
            if r[1] > we:  # sticks out of the wait: not inside it, dropped (the wait is the outer item)
                used[k] = True
                continue
            if r[0] > cur:
                rows.append((cur, r[0], "data", -1, 0, 0, g, ""))
            rows.append((*r[:6], g, r[6]))
            used[k] = True
            cur = r[1]
        if cur < we or cur == ws:
            rows.append((cur, int(we), "data", -1, 0, 0, g, ""))
    wait_rows = [(a_, b_) for a_, b_ in zip(w_start, w_end)]
    for k, r in enumerate(outer):
        if not used[k] and not any(a_ < r[1] and r[0] < b_ for a_, b_ in wait_rows):
            rows.append((*r[:6], -1, r[6]))
    rows.sort(key=lambda r: (r[0], r[1]))
    cols = list(zip(*rows)) if rows else [[]] * 8
    return {"it_start": np.asarray(cols[0], dtype=np.int64), "it_end": np.asarray(cols[1], dtype=np.int64),
            "it_kind": np.asarray(cols[2], dtype=object), "it_await": np.asarray(cols[3], dtype=np.int64),
            "it_post": np.asarray(cols[4], dtype=np.int64), "it_min": np.asarray(cols[5], dtype=np.int64),
            "it_group": np.asarray(cols[6], dtype=np.int64), "it_dir": np.asarray(cols[7], dtype=object),
            "wait_start": w_start, "wait_end": w_end}


# --- edits and the replay ------------------------------------------------------------------------------
@dataclass
class Edits:
    """Changes to a graph: new durations of host items, items that no longer wait, new op durations."""

    item_dur: dict[int, int] = field(default_factory=dict)
    item_free: set[int] = field(default_factory=set)
    op_dur: dict[int, int] = field(default_factory=dict)
    #: a lower bound on the mean step (ns): what the host's CPUs can do, when the fix adds CPU work
    floor_step_ns: float = 0.0
    #: savings the replay cannot express, estimated from measurements (ns per step), by what they remove: two
    #: estimates of one thing ("launch": CUDA graphs from gpu_idle and launch_bound) count once, the larger
    analytic_ns: dict[str, float] = field(default_factory=dict)
    loader: "LoaderFix | None" = None

    def merge(self, other: "Edits") -> "Edits":
        out = Edits(dict(self.item_dur), set(self.item_free) | other.item_free, dict(self.op_dur),
                    max(self.floor_step_ns, other.floor_step_ns), dict(self.analytic_ns), self.loader or other.loader)
        for k, v in other.item_dur.items():
            out.item_dur[k] = min(v, out.item_dur.get(k, v))
        for k, v in other.op_dur.items():
            out.op_dur[k] = min(v, out.op_dur.get(k, v))
        for k, v in other.analytic_ns.items():
            out.analytic_ns[k] = max(v, out.analytic_ns.get(k, v))
        return out


#: measured savings that remove host time only: the GPU's own work per step still bounds the step
HOST_ONLY = frozenset({"launch", "compile", "host_python", "allocator", "host_cpu"})


@dataclass(frozen=True)
class Replayed:
    step_ns: np.ndarray  # each window step after the edits
    host_step_ns: float
    gpu_step_ns: float  # the busiest device's busy time per step
    mean_step_ns: float
    item_end: np.ndarray
    op_end: np.ndarray


def replay(g: ReplayGraph, edits: Edits | None = None) -> Replayed:
    """Re-time the graph with ``edits``; without edits it reproduces the recorded steps."""
    e = edits or Edits()
    dur = g.op_dur.copy()
    for j, d in e.op_dur.items():
        dur[j] = max(int(d), 0)
    n_items = len(g.it_start)
    item_end = np.empty(n_items, dtype=np.int64)
    shift = np.zeros(n_items, dtype=np.int64)
    op_end = np.full(len(g.op_start), NONE, dtype=np.int64)
    carry = np.full(int(g.op_stream.max()) + 1 if len(g.op_stream) else 0, NONE, dtype=np.int64)
    # ops start in recorded order; a chunk holds the ops that started before the next item ended
    bounds = np.searchsorted(g.op_start, g.it_end, side="right")
    lo = 0
    for i in range(n_items + 1):
        hi = int(bounds[i]) if i < n_items else len(g.op_start)
        if hi > lo:
            _ops(g, dur, lo, hi, g.it_end[:i], shift[:i], carry, op_end)
            lo = hi
        if i == n_items:
            break
        s_new = int(g.it_start[i]) + (int(shift[i - 1]) if i else 0)
        j = int(g.it_await[i])
        if i in e.item_dur:
            end_new = s_new + int(e.item_dur[i])
        elif g.it_kind[i] == "data":
            end_new = s_new + int(g.it_end[i] - g.it_start[i])
        elif i in e.item_free or j < 0 or op_end[j] == NONE:
            end_new = s_new + int(g.it_min[i])
        else:
            end_new = max(s_new + int(g.it_min[i]), int(op_end[j]) + int(g.it_post[i]))
        item_end[i] = end_new
        shift[i] = end_new - int(g.it_end[i])
    s0 = g.step_start + _shift_at(g.it_end, shift, g.step_start)
    s1 = g.step_end + _shift_at(g.it_end, shift, g.step_end)
    step_ns = (s1 - s0).astype(np.float64)
    host = float(step_ns.mean()) if len(step_ns) else math.nan
    gpu = _gpu_per_step(g, op_end, dur) if len(step_ns) else 0.0
    mean = max(host, gpu, e.floor_step_ns)
    if e.analytic_ns:
        mean -= sum(e.analytic_ns.values())
        if HOST_ONLY & set(e.analytic_ns):
            mean = max(mean, gpu)
    return Replayed(step_ns=step_ns, host_step_ns=host, gpu_step_ns=gpu, mean_step_ns=max(mean, 0.0),
                    item_end=item_end, op_end=op_end)


def _shift_at(ends: np.ndarray, shift: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The host's shift at times ``t``: that of the last item that ended by then (0 before any)."""
    if not len(ends):
        return np.zeros(len(t), dtype=np.int64)
    k = np.searchsorted(ends, t, side="right") - 1
    return np.where(k >= 0, shift[np.maximum(k, 0)], 0)


def _ops(g: ReplayGraph, dur: np.ndarray, lo: int, hi: int, ends: np.ndarray, shift: np.ndarray,
         carry: np.ndarray, op_end: np.ndarray) -> None:
    """Ends of ops lo..hi: per stream, E_j = max(L_j + a_j, D_j + c_j, E_{j-1} + b_j) + d_j (D: the end of the
    op it waited for on another stream), solved as a running max; split where an op waits for one in the same
    stretch, so that one is timed first."""
    while lo < hi:
        dep = g.op_dep[lo:hi]
        inner = np.flatnonzero(dep >= lo)
        cut = lo + int(inner[0]) if len(inner) and inner[0] > 0 else (lo + 1 if len(inner) else hi)
        _ops_run(g, dur, lo, cut, ends, shift, carry, op_end)
        lo = cut


#: stretches this short are timed op by op: numpy's per-call cost would exceed the work (a trace whose event
#: waits split it into thousands of tiny stretches spent most of its replay there)
SCALAR_RUN = 8


def _ops_run(g: ReplayGraph, dur: np.ndarray, lo: int, hi: int, ends: np.ndarray, shift: np.ndarray,
             carry: np.ndarray, op_end: np.ndarray) -> None:
    if hi - lo <= SCALAR_RUN:
        for j in range(lo, hi):  # the same recurrence, one op at a time
            anchor = int(g.op_anchor[j])
            k = int(np.searchsorted(ends, anchor, side="right")) - 1
            start = anchor + (int(shift[k]) if k >= 0 else 0) + int(g.op_a[j])
            dep = int(g.op_dep[j])
            if dep >= 0:
                start = max(start, int(op_end[dep]) + int(g.op_c[j]))
            s_ = int(g.op_stream[j])
            if carry[s_] > NONE:
                start = max(start, int(carry[s_]) + int(g.op_b[j]))
            op_end[j] = carry[s_] = start + int(dur[j])
        return
    idx = np.arange(lo, hi)
    launch = g.op_anchor[idx] + _shift_at(ends, shift, g.op_anchor[idx])
    start = launch + g.op_a[idx]
    dep = g.op_dep[idx]
    has = dep >= 0
    if has.any():
        start[has] = np.maximum(start[has], op_end[dep[has]] + g.op_c[idx][has])
    x = start + dur[idx]
    y = g.op_b[idx] + dur[idx]
    streams = g.op_stream[idx]
    if len(idx) == 1 or (streams == streams[0]).all():
        groups = [(int(streams[0]), np.arange(len(idx)))]
    else:
        order = np.argsort(streams, kind="stable")
        cut = np.flatnonzero(np.diff(streams[order])) + 1
        groups = [(int(streams[p[0]]), p) for p in np.split(order, cut)]
    for s_, p in groups:
        q = np.cumsum(y[p])
        best = np.maximum.accumulate(x[p] - q)
        if carry[s_] > NONE:
            best = np.maximum(best, carry[s_])
        ends_s = q + best
        op_end[idx[p]] = ends_s
        carry[s_] = ends_s[-1]


def _gpu_per_step(g: ReplayGraph, op_end: np.ndarray, dur: np.ndarray) -> float:
    """The busiest device's busy time (union of its ops) per step, for ops recorded inside the window."""
    inside = (g.op_start >= g.step_start[0]) & (g.op_start < g.step_end[-1])
    if not inside.any():
        return 0.0
    best = 0
    for d in np.unique(g.op_device[inside]):
        m = inside & (g.op_device == d)
        best = max(best, iv.measure(iv.union(op_end[m] - dur[m], op_end[m])))
    return best / g.steps


# --- the loader fix: a DataLoader's queue with k workers ---------------------------------------------------
@dataclass(frozen=True)
class LoaderFix:
    #: the data items the training loop waits on, inside the window (graph item indices), in order
    items: np.ndarray
    #: each batch's loading time in one worker (ns), in order
    load_ns: np.ndarray
    workers: int
    prefetch: int
    #: a ready batch's hand-over to the training process (ns)
    handoff_ns: int


def simulate_loader(fix: LoaderFix, compute_ns: np.ndarray, rounds: int = 8) -> np.ndarray:
    """Each step's wait for data in steady state: batch b goes to worker b % k, which starts it when free
    and when fewer than k * prefetch batches are outstanding; the loop takes batch b after the step's
    compute. The recorded batches repeat ``rounds`` times; the last round's waits are returned."""
    n = len(fix.load_ns)
    total = n * rounds
    k, depth = max(1, fix.workers), max(1, fix.workers * fix.prefetch)
    free = np.zeros(k)
    taken = np.zeros(total)  # when the loop took each batch
    waits = np.zeros(total)
    t = 0.0
    ready = np.zeros(total)
    started = 0
    for b in range(total):
        # batch s may start once batch s - depth has been taken (its slot in the queue is free)
        while started < total and started - depth < b:
            w = started % k
            gate = taken[started - depth] if started >= depth else 0.0
            ready[started] = max(free[w], gate) + fix.load_ns[started % n]
            free[w] = ready[started]
            started += 1
        if started <= b:  # the first batches: nothing taken yet, every slot free
            w = b % k
            ready[b] = free[w] + fix.load_ns[b % n]
            free[w] = ready[b]
            started = b + 1
        got = max(t, ready[b]) + fix.handoff_ns
        waits[b] = got - t
        taken[b] = got
        t = got + compute_ns[b % n]
    return waits[-n:]


def stalled(waits: np.ndarray, handoff: float) -> np.ndarray:
    """Waits for a batch still being prepared, as opposed to the hand-over's own jitter."""
    return waits > 2.0 * handoff + 500_000.0


def infer_worker_loads(asked: np.ndarray, taken: np.ndarray, k: int, prefetch: int) -> np.ndarray:
    """Each batch's loading time in its worker, inverted from the training loop's waits under the same queue
    model as ``simulate_loader``: batch b is ready when the loop got it (if it had to wait) and its worker
    could start it when its previous batch (b - k) was done and batch b - k * prefetch had been taken. A
    batch that was ready before the loop asked for it loaded in at most the time it had (taken as 0).
    In a steadily stalled loader this is exactly k steps per batch."""
    n = len(asked)
    depth = max(1, k * prefetch)
    waits = taken - asked
    handoff = handoff_ns(waits)
    waited = stalled(waits, handoff)
    ready = np.where(waited, taken - handoff, asked).astype(float)  # a batch not waited for: ready by then at most
    load = np.full(n, np.nan)
    for b in range(n):
        free = ready[b - k] if b >= k else np.nan
        gate = float(taken[b - depth]) if b >= depth else np.nan
        start = np.nanmax([free, gate]) if not (np.isnan(free) and np.isnan(gate)) else np.nan
        if not np.isnan(start):
            # a batch ready before it was asked for loaded in somewhere between 0 and the time it had; the trace
            # cannot say where: taken as 0 (optimistic; a stalled loader's batches are all waited for)
            load[b] = max(ready[b] - start, 0.0) if waited[b] else 0.0
    # the first batches of the window (their worker's previous batch is before it): like the others of their kind
    known_waited = load[~np.isnan(load) & waited]
    fill_waited = float(np.median(known_waited)) if len(known_waited) else float(k * np.mean(np.diff(taken))) if n > 1 else 0.0
    return np.where(np.isnan(load), np.where(waited, fill_waited, 0.0), load)


# --- estimates per finding ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    edits: Edits
    method: str
    assumptions: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    #: "upper" where an assumption the trace cannot check can only make the estimate optimistic (workers that
    #: take no cores or memory bandwidth from the training, on a host whose cores are not recorded); else None
    bound: str | None = None


def _window_items(g: ReplayGraph, kind: str) -> np.ndarray:
    if not g.steps:
        return np.zeros(0, dtype=np.int64)
    m = (g.it_kind == kind) & (g.it_start >= g.step_start[0]) & (g.it_start < g.step_end[-1])
    return np.flatnonzero(m)


def _window_waits(g: ReplayGraph) -> np.ndarray:
    """The training thread's data waits that start inside the window (indices into ``wait_start``)."""
    if not g.steps:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero((g.wait_start >= g.step_start[0]) & (g.wait_start < g.step_end[-1]))


def _wait_edits(g: ReplayGraph, waits: np.ndarray, new_ns: np.ndarray) -> dict[int, int]:
    """Item durations that make each wait last about ``new_ns``: its loading (the data pieces) shrinks by what
    the wait loses; syncs or copies inside it (a Dataset calling .cuda()) stay items of their own."""
    pieces: dict[int, list[int]] = {}
    for i, grp in enumerate(g.it_group):
        if grp >= 0:
            pieces.setdefault(int(grp), []).append(i)
    out: dict[int, int] = {}
    for grp, w in zip(waits, new_ns):
        mine = pieces.get(int(grp), [])
        data = [i for i in mine if g.it_kind[i] == "data"]
        if not data:
            continue
        recorded = int(g.wait_end[grp] - g.wait_start[grp])
        loading = sum(int(g.it_end[i] - g.it_start[i]) for i in data)
        left = max(0, loading - (recorded - int(w)))
        scale = left / loading if loading else 0.0
        for i in data:  # each piece keeps its share of the loading: the items between them keep their places
            out[i] = int(round((g.it_end[i] - g.it_start[i]) * scale))
    return out


def _facts(trace: RankTrace) -> tuple[dict[str, Any], dict[str, Any]]:
    cap = trace.meta.capture or {}
    return dict(cap.get("host") or {}), dict(cap.get("dataloader") or {})


def _workers_cpu_per_step(trace: RankTrace) -> float | None:
    """The DataLoader workers' CPU time per step (ns, the mean over the run's steps after the first: CPU work adds
    up, and the workers' batches land on alternate steps, so a median misses the expensive ones), from the
    capture's reading of their /proc schedstat; None where not recorded."""
    rs = trace.run_steps
    if rs is None or "workers_cpu_ns" not in rs:
        return None
    values = rs["workers_cpu_ns"].to_numpy(float)[1:]
    values = values[~np.isnan(values)]
    return float(np.mean(values)) if len(values) else None


def _cores_together(host: dict[str, Any], cpus: int) -> tuple[float, str]:
    """(how many cores' worth of compute the host's CPUs do when all are busy, what the estimate says of it): the
    capture's probe (``cores_effective``; the loader keeps only numbers) where it ran and gave 1 to ``cpus``, else
    the CPU count."""
    measured = host.get("cores_effective")
    if measured is None:
        return float(cpus), ("all busy, they do as much as their count (not measured: cores that share a physical "
                             "core do less)")
    if not 1.0 <= measured <= cpus:
        return float(cpus), (f"all busy, they do as much as their count (the capture's measure, {measured}, is "
                             f"outside 1-{cpus} and was ignored)")
    return float(measured), f"all busy, they do {measured:.2f} cores' work (measured by the capture)"


def plan_loader(trace: RankTrace, g: ReplayGraph, params: dict[str, Any]) -> Plan | None:
    items = _window_waits(g)
    if not len(items) or not g.steps:
        return None
    names = set(loader_spans(trace)["name"].astype(str))
    single = any("SingleProcess" in n for n in names) and not any("MultiProcessing" in n for n in names)
    host, dl = _facts(trace)
    cpus, threads = host.get("cpus"), host.get("torch_threads")
    waits = (g.wait_end[items] - g.wait_start[items]).astype(float)
    steps_ns = (g.step_end - g.step_start).astype(float)
    n = g.steps
    per_step_wait = float(waits.sum()) / n
    compute = max(float(steps_ns.mean()) - per_step_wait, 1.0)
    assumptions = []
    before = 0 if single else dl.get("num_workers")
    prefetch = int(params.get("prefetch_factor") or dl.get("prefetch_factor") or 2)
    load_cpu, comp_cpu = cpu_shares(trace)
    if single:
        load = waits  # loading runs inline: each wait is one batch's loading
        assumptions.append("num_workers=0 before: each recorded wait is one batch's full loading time")
    elif isinstance(before, int) and before > 0:
        before_prefetch = int(dl.get("prefetch_factor") or 2)
        load = infer_worker_loads(g.wait_start[items], g.wait_end[items], before, before_prefetch)
        assumptions.append(f"num_workers={before}, prefetch_factor={before_prefetch} before (capture manifest): each "
                           f"batch's loading time inferred from when it became ready and when its worker could start "
                           f"it (mean {load.mean() / 1e6:.1f} ms per batch per worker; batches ready before the loop "
                           "asked for them count as free: their loading is not in the trace)")
    else:
        load = None
        assumptions.append("num_workers unknown (no capture manifest naming the DataLoader's configuration): assumes "
                           "enough workers to hide loading")
    target = params.get("num_workers")
    if load is not None and target is None and not single:
        target = 2 * int(before)  # type: ignore[arg-type]
        assumptions.append(f"num_workers={target} after (twice as many)")
    elif load is not None and target is None:
        need = int(math.ceil(float(load.mean()) / compute)) + 1
        # loading that mostly waits (storage, network) needs no core of its own: only CPU-heavy loading is
        # capped by the cores the training leaves free (and when its CPU use is unknown, to be safe)
        cpu_bound = load_cpu is None or load_cpu >= 0.5
        free = (cpus - (threads or 1)) if cpus and cpu_bound else None
        target = max(1, min(need, free)) if free and free > 0 else need
        assumptions.append(f"num_workers={target} after (" + (f"{cpus} CPUs, {threads or 1} for training"
                           if free and free > 0 else "enough to hide loading") + ")")
    elif target is not None:
        assumptions.append(f"num_workers={target} after, prefetch_factor={prefetch}")
    if target is not None and int(target) == 0:
        return None
    # a batch prepared in a worker still has to reach the training process (collate + shared memory)
    handoff = int(handoff_ns(waits)) if not single else HANDOFF_PRIOR_NS
    if params.get("handoff_ms") is not None:
        handoff = int(float(params["handoff_ms"]) * 1e6)
        assumptions.append(f"a batch from a worker costs the loop {handoff / 1e6:.2f} ms to take (given)")
    elif single:
        assumptions.append(f"a batch from a worker costs the loop {HANDOFF_PRIOR_NS / 1e6:.1f} ms to take (typical "
                           "DataLoader hand-over; this trace had no workers to measure it)")
    if load is None:
        fix = LoaderFix(items=items, load_ns=np.zeros(len(items)), workers=1, prefetch=prefetch, handoff_ns=handoff)
    else:
        fix = LoaderFix(items=items, load_ns=load, workers=int(target), prefetch=prefetch, handoff_ns=handoff)
    floor = 0.0
    if single and cpus and load_cpu is not None and comp_cpu is not None:
        # the loading's CPU work moves beside the training's (which also takes each batch over): together they
        # cannot outrun the CPUs, which do fewer cores' work when all are busy. Work in cores' worth: what ran on
        # more cores than they are worth together (a multi-threaded training) already ran at that rate, so it
        # counts at most that many (its part of the floor never exceeds what was recorded)
        cores, said = _cores_together(host, cpus)
        work = (compute * min(comp_cpu, cores) + float(load.mean() if load is not None else 0) * min(load_cpu, cores)
                + handoff)
        floor = work / cores
        assumptions.append(f"{cpus} CPUs shared: loading uses {load_cpu:.2f} cores while it runs, the training "
                           f"{comp_cpu:.2f} (process CPU time per step, capture), taking a batch over is CPU work; "
                           + said)
    elif cpus and comp_cpu is not None and (wcpu := _workers_cpu_per_step(trace)) is not None:
        # workers already: their CPU per batch (one batch per step) stays, spread over more of them. These CPU times
        # were recorded with the workers and the training side by side, sharing the cores as they will after the
        # fix, and the training's includes taking batches over: over the CPU count, with nothing added
        floor = (compute * comp_cpu + wcpu) / cpus
        assumptions.append(f"{cpus} CPUs shared: the workers use {wcpu / 1e6:.1f} ms of CPU per batch, the training "
                           f"{comp_cpu:.2f} cores while it computes (capture: process and worker CPU time)")
    elif load is not None:
        assumptions.append("the workers get CPU cores of their own, and the training's host work keeps its recorded "
                           "speed beside them (" + ("the host's cores are not recorded" if not cpus
                                                    else "the workers' CPU use is not recorded")
                           + "; workers competing with it for cores or memory bandwidth slow it)")
    assumptions.append("the per-batch loading cost stays what it was in the training process")
    # workers that cost the training nothing (cores, memory bandwidth) and enough of them: what the trace cannot check
    # makes the estimate only more optimistic
    upper = floor == 0.0 and (load is None or not single or not cpus or comp_cpu is None)
    return Plan(Edits(loader=fix, floor_step_ns=floor), "replay: DataLoader queue simulation", tuple(assumptions),
                {"num_workers": int(target) if target is not None else None, "prefetch_factor": prefetch,
                 "cpus": int(cpus) if cpus else None},
                bound="upper" if upper else None)


def _pinned_gbps(trace: RankTrace) -> tuple[float, str]:
    from kinetoscope.analyze.model.copies import h2d_copies

    h = h2d_copies(trace)
    big = h[h["pinned"].to_numpy() & (h["bytes"].fillna(0).to_numpy() >= 1 << 20)]
    if len(big) and big["dur_ns"].sum() > 0:
        return float(big["bytes"].sum() / big["dur_ns"].sum()), "measured on this trace's pinned copies"
    names = " ".join(str(p.get("name", "")) for p in trace.meta.device_properties)
    for pattern, gbps in PINNED_GBPS + ((_PCIE3, PINNED_GBPS_DEFAULT),):
        found = pattern.search(names)
        if found:
            return gbps, f"typical for {found.group(0)}'s host link"
    return PINNED_GBPS_DEFAULT, "PCIe 3.0 x16 assumed: device family unknown"


def _h2d_ops(trace: RankTrace, g: ReplayGraph, pageable_only: bool) -> tuple[np.ndarray, pd.DataFrame]:
    from kinetoscope.analyze.model.copies import h2d_copies

    h = h2d_copies(trace)
    if pageable_only:
        h = h[(h["pageable"] | (h["host_memory"].eq("unknown") & h["blocking"])).to_numpy()]
    pos_of = pd.Series(np.arange(len(g.op_label)), index=g.op_label)
    idx = pos_of.reindex(h.index).dropna().to_numpy(np.int64)
    return idx, h


def _copy_items(g: ReplayGraph, ops: np.ndarray) -> set[int]:
    return {int(i) for i in np.flatnonzero(np.isin(g.it_await, ops) & (g.it_kind == "copy"))}


def plan_pageable(trace: RankTrace, g: ReplayGraph, params: dict[str, Any]) -> Plan | None:
    ops, h = _h2d_ops(trace, g, pageable_only=True)
    if not len(ops):
        return None
    gbps, why = _pinned_gbps(trace)
    gbps = float(params.get("pinned_gbps") or gbps)
    nbytes = h["bytes"].reindex(g.op_label[ops]).fillna(0).to_numpy(float)
    new = {int(j): int(min(g.op_dur[j], b / gbps)) if b > 0 else int(g.op_dur[j]) for j, b in zip(ops, nbytes)}
    free = _copy_items(g, ops)
    return Plan(Edits(item_free=free, op_dur=new), "replay: pinned copies",
                (f"pinned host memory copies at {gbps:.1f} GB/s ({why})",
                 "the copy call returns at once (non_blocking=True): the host no longer waits for it",
                 "the copy keeps its place in its stream (later kernels still wait for it)"))


def plan_overlap(trace: RankTrace, g: ReplayGraph, params: dict[str, Any]) -> Plan | None:
    ops, _ = _h2d_ops(trace, g, pageable_only=False)
    if not len(ops):
        return None
    return Plan(Edits(item_free=_copy_items(g, ops), op_dur={int(j): 0 for j in ops}), "replay: side-stream prefetch",
                ("each step's input copy runs on a side stream during the previous step (pinned, non_blocking), "
                 "so the compute stream no longer waits for it",
                 "the copy engine and host link have room for it beside the step's own traffic"))


def plan_syncs(trace: RankTrace, g: ReplayGraph, params: dict[str, Any]) -> Plan | None:
    every = int(params.get("every") or 10)
    copies_back = _window_items(g, "copy")
    copies_back = copies_back[g.it_dir[copies_back] == "DtoH"]  # .item(), .cpu(): a read-back the host waits for
    items = np.sort(np.concatenate([_window_items(g, "sync"), copies_back]))
    if not len(items):
        return Plan(Edits(), "replay: syncs removed",
                    ("no host-device sync in the window waits for the GPU (a CPU run, or syncs the GPU had finished "
                     "before): removing them saves nothing here",), {"every": every})
    step = np.searchsorted(g.step_start, g.it_start[items], side="right") - 1
    keep = (step % every) == every - 1
    return Plan(Edits(item_free={int(i) for i in items[~keep]}), "replay: syncs removed",
                (f"host-device syncs in the loop kept only every {every} steps (metrics read then)",
                 "the values they read are not needed to launch the next work (no data-dependent control flow)"),
                {"every": every})


def plan_respawn(trace: RankTrace, g: ReplayGraph, finding: Finding) -> Plan | None:
    items = _window_waits(g)
    if not len(items):
        return None
    waits = g.wait_end[items] - g.wait_start[items]
    typical = int(np.median(waits))
    long = waits >= max(2_000_000, 3 * typical)
    if not long.any():
        return None
    # shutting the old workers down and starting new ones also runs outside next(): untraced host time in the
    # steps where the start-up waits fall; what those steps spend outside their waits beyond a typical step goes
    steps_ns = (g.step_end - g.step_start).astype(float)
    step_of = np.clip(np.searchsorted(g.step_start, g.wait_start[items], side="right") - 1, 0, g.steps - 1)
    wait_in_step = np.bincount(step_of, weights=waits.astype(float), minlength=g.steps)
    outside = steps_ns - wait_in_step
    typical_outside = float(np.median(outside))
    hit = sorted({int(x) for x in step_of[long]})
    extra = sum(max(outside[s_] - typical_outside, 0.0) for s_ in hit) / g.steps
    edits = Edits(item_dur=_wait_edits(g, items[long], np.full(int(long.sum()), typical)), analytic_ns={"respawn": extra})
    return Plan(edits, "replay: persistent workers",
                (f"each worker start-up wait becomes a typical wait ({typical / 1e6:.2f} ms, the median)",
                 f"the time those {len(hit)} step(s) spend outside their waits beyond a typical step (worker shutdown "
                 f"and start, {extra * g.steps / 1e6:.1f} ms in all) goes too"))


def plan_from_measure(key: str, saving_ns_per_step: float, method: str, assumptions: tuple[str, ...],
                      bound: str | None = None) -> Plan:
    return Plan(Edits(analytic_ns={key: max(0.0, saving_ns_per_step)}), method, assumptions, bound=bound)


def plan_for(trace: RankTrace, g: ReplayGraph, finding: Finding, params: dict[str, Any] | None = None) -> Plan | None:
    """The edit that fixes ``finding``, or None where this finding is not a time cost (or nothing to edit)."""
    p = params or {}
    fid = finding.id
    n = max(g.steps, 1)
    if fid == "loader_stall":
        return plan_loader(trace, g, p)
    if fid == "h2d_pageable":
        return plan_pageable(trace, g, p)
    if fid == "h2d_not_overlapped":
        return plan_overlap(trace, g, p)
    if fid in ("sync_in_loop", "sync_point"):
        return plan_syncs(trace, g, p)
    if fid == "worker_respawn":
        return plan_respawn(trace, g, finding)
    if fid == "gpu_idle":
        by_cause = finding.evidence.get("idle_by_cause_us") or {}
        cause = max(by_cause, key=lambda c: by_cause[c] or 0) if by_cause else None
        if cause == "data_wait":
            return plan_loader(trace, g, p)
        if cause == "sync":
            return plan_syncs(trace, g, p)
        if cause == "host_python" and by_cause.get("host_python"):
            return plan_from_measure("host_python", by_cause["host_python"] * 1000 / n,
                                     "measured: GPU idle while the training thread ran Python",
                                     ("the Python work the GPU waited for runs off the training thread (DataLoader "
                                      "workers, a background thread), overlapped with the GPU's work",), bound="upper")
        if cause == "host_launch" and by_cause.get("host_launch"):
            return plan_from_measure("launch", by_cause["host_launch"] * 1000 / n - GRAPH_REPLAY_NS,
                                     "measured: GPU idle waiting for launches",
                                     ("the GPU's idle time while the host launched work goes (CUDA graphs, fused "
                                      "ops), less one graph replay call per step",
                                      "the step can be captured as a graph or fused (static shapes, no host logic "
                                      "between its kernels): not something the trace can check"), bound="upper")
        return None
    if fid == "launch_bound":
        idle = finding.evidence.get("gpu_idle_waiting_for_launches_us")
        if idle is None:
            return None
        return plan_from_measure("launch", float(idle) * 1000 / n - GRAPH_REPLAY_NS, "measured: launch-bound idle",
                                 ("under CUDA graphs the host launches each step's kernels in one call: the GPU's "
                                  "idle time waiting for launches goes, less one replay call per step",
                                  "the step's shapes are static (a graph replays fixed shapes)"), bound="upper")
    if fid == "host_oversubscribed":
        lost = finding.evidence.get("lost_us")
        if not lost:
            return None
        return plan_from_measure("host_cpu", float(lost) * 1000 / n, "measured: busy time without a core",
                                 ("the training process gets a core whenever its thread is busy: its operators run "
                                  "at the speed a core gives (what the other threads or processes then lose is not "
                                  "counted)",), bound="upper")
    if fid == "allocator_churn":
        held = finding.evidence.get("recurring_time_us")
        if not held:
            return None
        return plan_from_measure("allocator", float(held) * 1000 / n, "measured: host time in device mallocs and frees",
                                 ("the caching allocator keeps the memory between steps: the runtime calls, and the "
                                  "device syncs the frees make, go",))
    if fid == "exposed_comm":
        exposed = finding.evidence.get("exposed_us")
        if exposed is None:
            return None
        return plan_from_measure("comm", float(exposed) * 1000 / n, "measured: exposed communication",
                                 ("the collectives' exposed time overlaps compute (bucketing, prefetching, pipelining "
                                  "the step); what they spend waiting for other ranks, and what the next work needs "
                                  "from them before it can start, would stay: not something one rank's trace shows",),
                                 bound="upper")
    if fid == "recompile":
        ns = float(finding.evidence.get("compile_time_us") or 0) * 1000
        return plan_from_measure("compile", ns / n, "measured: compile time",
                                 ("compilation inside the window no longer happens (shapes made static or dynamic)",))
    if fid == "straggler":
        ev = finding.evidence
        excess = ev.get("cause_excess_us_per_step")
        known = ev.get("cause") != "unknown" and excess is not None
        return plan_from_measure("straggler", straggler_saving_us(ev) * 1000, "measured: collective waits",
                                 (f"rank {ev.get('rank')}'s cause ({ev.get('cause')}) removed: the others' waits for it "
                                  "at collectives shrink by its lateness"
                                  + (", at most its measured excess" if known else
                                     " (its cause is not in the trace: the others' whole wait, at most)"),),
                                 bound=None if known else "upper")
    return None


def straggler_saving_us(evidence: dict[str, Any]) -> float:
    """What removing the straggler's cause gives the others per step (us): their wait for it, at most the
    straggler's measured excess in that cause."""
    wait = float(evidence.get("others_wait_us_per_step") or 0)
    excess = evidence.get("cause_excess_us_per_step")
    if evidence.get("cause") == "unknown" or excess is None:  # what explains it is not in the trace: its whole wait
        return wait
    return min(wait, float(excess))


#: findings that are not a time cost: their estimate says so instead of a number
NO_TIME_COST = {
    "memory_growth": "no time saving: the fix keeps the job alive (steps until out of memory below)",
    "reserved_memory_growth": "no time saving: the fix keeps the job alive (steps until out of memory below)",
    "zero_grad_missing": "a correctness fix: no time saving expected",
    "optimizer_step_mismatch": "a correctness fix: no time saving expected",
    "no_backward": "a correctness fix: no time saving expected",
}


def estimate(trace: RankTrace, finding: Finding, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """``{"step_us_after", "saving_us_per_step", "saving_fraction", "fraction_of", "method", "assumptions"}``
    for the rank's mean step after this fix alone; None where it cannot be estimated."""
    g = replay_graph(trace)
    if not g.steps:
        return None
    base = baseline(trace)
    if finding.id in NO_TIME_COST:
        out = _estimate_dict(base.mean_step_ns, base.mean_step_ns, "none", (NO_TIME_COST[finding.id],))
        oom = finding.evidence.get("steps_to_out_of_memory")
        if oom is not None:
            out["steps_to_out_of_memory"] = oom
        return out
    if finding.one_off_us is not None:
        return _one_off(trace, base.mean_step_ns, g.steps, finding.one_off_us)
    plan = plan_for(trace, g, finding, params)
    if plan is None:
        return None
    after = apply(trace, g, plan.edits)
    out = _estimate_dict(base.mean_step_ns, after.mean_step_ns, plan.method, plan.assumptions)
    out.update({k: v for k, v in plan.extra.items() if v is not None})
    if plan.bound is not None:
        out["bound"] = plan.bound
    return out


@trace_view
def baseline(trace: RankTrace) -> Replayed:
    return replay(replay_graph(trace))


def apply(trace: RankTrace, g: ReplayGraph, edits: Edits, iterations: int = 3) -> Replayed:
    """Replay with ``edits``; a loader fix is solved with the replay: the queue simulation needs each step's
    time outside the data wait, which the rest of the edits (and the GPU) decide."""
    if edits.loader is None:
        return replay(g, edits)
    fix = edits.loader
    steps_ns = (g.step_end - g.step_start).astype(float)
    own = (g.wait_end[fix.items] - g.wait_start[fix.items]).astype(float)
    step_of = np.clip(np.searchsorted(g.step_start, g.wait_start[fix.items], side="right") - 1, 0, g.steps - 1)
    compute = np.maximum(steps_ns[step_of] - own, 0.0)
    result = None
    for _ in range(iterations):
        waits = simulate_loader(fix, compute) if fix.load_ns.any() else np.full(len(fix.items), float(fix.handoff_ns))
        waits = np.minimum(waits, own)  # a fix never makes a wait longer (it would not be applied)
        e = Edits(dict(edits.item_dur), set(edits.item_free), dict(edits.op_dur), edits.floor_step_ns,
                  dict(edits.analytic_ns))
        e.item_dur.update(_wait_edits(g, fix.items, waits))
        result = replay(g, e)
        new = np.maximum(result.step_ns[step_of] - waits, 0.0)
        if np.allclose(new, compute, rtol=1e-3):
            break
        compute = new
    return result  # type: ignore[return-value]


def _one_off(trace: RankTrace, mean_step_ns: float, window_steps: int, total_us: float) -> dict[str, Any]:
    """A cost paid once (a first compilation of a shape): what it is worth per step over every step the capture
    timed (else over the profiled steps, said so), beside its total."""
    rs = trace.run_steps
    timed = int(len(rs)) if rs is not None and len(rs) else 0
    steps = timed or max(window_steps, 1)
    over = f"the {steps} steps timed by the capture" if timed else \
        f"the {steps} profiled steps (the run's length is not known: no step timings beside the trace)"
    out = _estimate_dict(mean_step_ns, mean_step_ns - total_us * 1000 / steps, "one-off",
                         (f"a one-off cost of {total_us / 1000:,.1f} ms in all, amortised over {over}",))
    out.update({"one_off_total_us": round(total_us, 3), "amortised_over_steps": steps})
    return out


def _estimate_dict(before_ns: float, after_ns: float, method: str, assumptions: tuple[str, ...]) -> dict[str, Any]:
    # every fix modelled here only removes work or waiting: a replay that ends later is the model's artefact
    # (an edit moving work against a bottleneck it cannot see), never a prediction that the fix slows the step
    after_ns = min(max(after_ns, 0.0), before_ns)
    saving = max(before_ns - after_ns, 0.0)
    return {"step_us_after": round(after_ns / 1000, 3), "saving_us_per_step": round(saving / 1000, 3),
            "saving_fraction": round(saving / before_ns, 4) if before_ns > 0 else None,
            "fraction_of": "the rank's mean step time (replayed)", "method": method, "assumptions": list(assumptions)}


def replay_entry(trace: RankTrace) -> dict[str, Any] | None:
    """The rank's replayed mean step against the measured one (the replay's error on unchanged input)."""
    g = replay_graph(trace)
    measured = g.measured_step_ns
    if not measured:
        return None
    r = baseline(trace)
    return {"step_us": round(r.mean_step_ns / 1000, 3), "measured_step_us": round(measured / 1000, 3),
            "error": round(abs(r.mean_step_ns - measured) / measured, 4), "error_of": "measured mean step time",
            "steps": g.steps, "host_items": int(len(g.it_start)), "gpu_ops": int(len(g.op_start))}


def params_for(fid: str, params: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """A fix's parameters; gpu_idle stands for the fix of its main cause, so it takes that fix's too."""
    params = params or {}
    if fid == "gpu_idle":
        return {**params.get("sync_in_loop", {}), **params.get("sync_point", {}), **params.get("loader_stall", {}),
                **params.get("gpu_idle", {})}
    return dict(params.get(fid, {}))


#: what each fix edits: two findings whose fixes edit the same thing are one fix (the first named wins)
_EDITS_OF = {"loader_stall": "loader", "sync_in_loop": "syncs", "sync_point": "syncs", "launch_bound": "launch",
             "worker_respawn": "respawn"}


def combined(trace: RankTrace, findings: list[Finding], params: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The rank's mean step with several fixes at once (one replay: the gains do not simply add)."""
    g = replay_graph(trace)
    if not g.steps:
        return None
    edits, methods, assumptions, seen = Edits(), [], [], set()
    # named fixes before gpu_idle, which stands for one of them
    for f in sorted(findings, key=lambda f: f.id == "gpu_idle"):
        plan = plan_for(trace, g, f, params_for(f.id, params))
        if plan is None:
            continue
        what = _EDITS_OF.get(f.id) or ("loader" if plan.edits.loader is not None else
                                       "syncs" if plan.method == "replay: syncs removed" else f.id)
        if what in seen:
            continue
        seen.add(what)
        edits = edits.merge(plan.edits)
        methods.append(f"{f.id}: {plan.method}")
        assumptions += list(plan.assumptions)
    after = apply(trace, g, edits)
    return _estimate_dict(baseline(trace).mean_step_ns, after.mean_step_ns, "; ".join(methods) or "none",
                          tuple(assumptions))


#: parameters a fix takes: name -> (kind, smallest allowed value, what it means)
PARAMS: dict[str, dict[str, tuple[type, float, str]]] = {
    "loader_stall": {"num_workers": (int, 1, "DataLoader workers after the fix"),
                     "prefetch_factor": (int, 1, "batches each worker prepares ahead"),
                     "handoff_ms": (float, 0.0, "what taking a ready batch costs the loop")},
    "sync_in_loop": {"every": (int, 1, "keep one sync every this many steps")},
    "sync_point": {"every": (int, 1, "keep one sync every this many steps")},
    "h2d_pageable": {"pinned_gbps": (float, 1e-3, "host-to-device bandwidth from pinned memory")},
}
PARAMS["gpu_idle"] = {**PARAMS["loader_stall"], **PARAMS["sync_in_loop"]}


def check_params(params: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with fix parameters (unknown fix or key, not a finite number, a fraction where a count
    is needed, below the smallest allowed value); empty when they are fine."""
    problems = []
    for fid, values in params.items():
        known = PARAMS.get(fid)
        if known is None:
            problems.append(f"{fid} takes no parameters (these do: {', '.join(sorted(PARAMS))})")
            continue
        for key, value in values.items():
            if key not in known:
                problems.append(f"{fid}.{key}: unknown (known: {', '.join(sorted(known))})")
                continue
            kind, low, _ = known[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                problems.append(f"{fid}.{key}={value!r}: not a finite number")
            elif kind is int and value != int(value):
                problems.append(f"{fid}.{key}={value!r}: must be a whole number")
            elif value < low:
                problems.append(f"{fid}.{key}={value!r}: must be at least {low:g}")
    return problems
