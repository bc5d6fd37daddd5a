"""The replay graph of a rank's steps: host items, GPU ops and the constraints between them, built from the trace
(the constants the graph and the fixes share live here too)."""


from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.timeline import (
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
PCIE3 = re.compile(r"V100|T4|P100|P40|P4|K80|M60|GP100|RTX 20|Quadro")
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


def _items(
    trace: RankTrace, ts: np.ndarray, dur: np.ndarray, anchor: np.ndarray, label: np.ndarray
) -> dict[str, np.ndarray]:
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
        for s_, e_ in zip(syncs["ts_ns"].to_numpy(), syncs["end_ns"].to_numpy(), strict=False):
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
                    cp["pageable"].to_numpy(), cp["synchronous"].to_numpy(), cp["direction"].to_numpy(), strict=False):
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
    for g, (ws, we) in enumerate(zip(w_start, w_end, strict=False)):
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
    wait_rows = [(a_, b_) for a_, b_ in zip(w_start, w_end, strict=False)]
    for k, r in enumerate(outer):
        if not used[k] and not any(a_ < r[1] and r[0] < b_ for a_, b_ in wait_rows):
            rows.append((*r[:6], -1, r[6]))
    rows.sort(key=lambda r: (r[0], r[1]))
    cols: list[Sequence[Any]] = list(zip(*rows, strict=False)) if rows else [[]] * 8
    return {"it_start": np.asarray(cols[0], dtype=np.int64), "it_end": np.asarray(cols[1], dtype=np.int64),
            "it_kind": np.asarray(cols[2], dtype=object), "it_await": np.asarray(cols[3], dtype=np.int64),
            "it_post": np.asarray(cols[4], dtype=np.int64), "it_min": np.asarray(cols[5], dtype=np.int64),
            "it_group": np.asarray(cols[6], dtype=np.int64), "it_dir": np.asarray(cols[7], dtype=object),
            "wait_start": w_start, "wait_end": w_end}


