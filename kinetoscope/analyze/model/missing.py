"""GPU work a trace cannot show: graph replays whose kernels were not recorded (unless their graph is known from a
capture: ``graphs``), stream capture, kernels queued behind unrecorded work, stretches cut out of the file. Above
``timeline`` (whose views it reads) and ``graphs`` (which judges replays from their capture)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.graphs import graph_replays, replay_span
from kinetoscope.analyze.model.timeline import (
    CAPTURE_BEGIN_RE,
    CAPTURE_END_RE,
    GRAPH_LAUNCH_RE,
    Window,
    _tid_mask,
    device_busy,
    gpu_work,
    launch_queue,
    name_mask,
    runtime_calls,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace, trace_view


@dataclass(frozen=True)
class MissingActivity:
    """GPU work the trace cannot show: graph replays whose kernels were not recorded, and stream
    capture (recording a graph: the launches inside do not run)."""

    graph_launches: int
    graph_launches_unrecorded: int
    capture_ns: int
    #: launched kernels that waited on a GPU the trace shows idle (queued behind unrecorded work)
    pending_ns: int
    #: stretches cut out of the trace (correlation ids jump across a silence)
    holes_ns: int
    #: time in the window for which the GPU's activity is unknown
    blind: iv.Intervals
    #: unrecorded replays whose graph is known from a capture and whose span is bounded (``graphs.replay_span``)
    graph_launches_from_capture: int = 0
    #: per device, where those replays ran their captured graphs: neither idle nor unknown
    replay_spans: dict[int, iv.Intervals] | None = None

    def blind_ns(self) -> int:
        return iv.measure(self.blind)


@trace_view
def missing_activity(trace: RankTrace) -> MissingActivity:
    w = window(trace)
    calls = runtime_calls(trace)
    calls = calls[(calls["end_ns"] > w.start_ns) & (calls["ts_ns"] < w.end_ns)]
    graphs = calls[name_mask(calls, GRAPH_LAUNCH_RE)]
    recorded = np.isin(graphs["correlation"].fillna(-1).to_numpy(np.int64),
                       gpu_work(trace)["correlation"].dropna().to_numpy(np.int64))
    unrecorded = graphs[~recorded | graphs["correlation"].isna().to_numpy()]

    spans: dict[int, list[tuple[int, int]]] = {}
    judged_at: set[int] = set()
    for r in graph_replays(trace).replays if len(unrecorded) else ():
        span = replay_span(r)
        if span is not None and r.device is not None:
            spans.setdefault(r.device, []).append(span)
            judged_at.add(r.ts_ns)
    judged = np.isin(unrecorded["ts_ns"].to_numpy(), np.fromiter(judged_at, np.int64, len(judged_at)))
    unrecorded_blind = unrecorded[~judged]
    # capture phases: from each BeginCapture to the next EndCapture on the same thread
    begin = calls[name_mask(calls, CAPTURE_BEGIN_RE)]
    end = calls[name_mask(calls, CAPTURE_END_RE)]
    cap_s: list[int] = []
    cap_e: list[int] = []
    for tid, b in begin.groupby(begin["tid"].astype(str), observed=True):
        e = np.sort(end["end_ns"].to_numpy()[_tid_mask(end, {tid})])
        nxt = np.searchsorted(e, b["ts_ns"].to_numpy())
        for t, i in zip(b["ts_ns"].to_numpy(), nxt, strict=False):
            cap_s.append(int(t))
            cap_e.append(int(e[i]) if i < len(e) else w.end_ns)  # never ended: blind to the window's end
    capture = iv.clip(iv.union(np.array(cap_s, np.int64), np.array(cap_e, np.int64)), w.start_ns, w.end_ns)
    # an unrecorded replay runs for an unknown time on an unknown stream: nothing after it can be judged
    # until the next recorded GPU work
    blind = capture
    if len(unrecorded_blind):
        starts = gpu_work(trace)["ts_ns"].to_numpy()
        first = unrecorded_blind["ts_ns"].to_numpy()
        nxt = np.searchsorted(np.sort(starts), first, side="right")
        sorted_starts = np.sort(starts)
        ends = np.where(nxt < len(sorted_starts), sorted_starts[np.minimum(nxt, len(sorted_starts) - 1)], w.end_ns)
        replay = iv.clip(iv.union(first, np.maximum(ends, unrecorded_blind["end_ns"].to_numpy())), w.start_ns, w.end_ns)
        blind = iv.union(np.concatenate((blind[0], replay[0])), np.concatenate((blind[1], replay[1])))
    replay_spans = {d: iv.clip(iv.union(np.array([a for a, _ in v], np.int64), np.array([b for _, b in v], np.int64)),
                               w.start_ns, w.end_ns) for d, v in spans.items()}
    pending = _pending_on_idle(trace, w, replay_spans)
    holes = _holes(trace, w)
    for extra in (pending, holes):
        if extra[0].size:
            blind = iv.union(np.concatenate((blind[0], extra[0])), np.concatenate((blind[1], extra[1])))
    return MissingActivity(graph_launches=int(len(graphs)), graph_launches_unrecorded=int(len(unrecorded)),
                           capture_ns=iv.measure(capture), pending_ns=iv.measure(pending),
                           holes_ns=iv.measure(holes), blind=blind, graph_launches_from_capture=int(judged.sum()),
                           replay_spans=replay_spans)


#: runtime-call correlation ids count every API call; a jump of this many between two calls in time
#: order, across a silence of at least HOLE_MIN_NS, means the calls in between were cut from the trace
HOLE_MIN_ID_JUMP = 100
HOLE_MIN_NS = 1_000_000


def _holes(trace: RankTrace, w: Window) -> iv.Intervals:
    """Stretches cut out of the trace (trimmed by hand, or dropped by the profiler): between two runtime
    calls whose correlation ids jump by hundreds, with nothing recorded in between."""
    calls = runtime_calls(trace)
    calls = calls[calls["correlation"].notna().to_numpy()]
    if len(calls) < 2:
        return iv.EMPTY
    order = np.argsort(calls["ts_ns"].to_numpy(), kind="stable")
    corr = calls["correlation"].to_numpy(np.int64)[order]
    ts = calls["ts_ns"].to_numpy()[order]
    ends = np.maximum.accumulate(calls["end_ns"].to_numpy()[order])
    gap_s, gap_e = ends[:-1], ts[1:]
    hole = ((corr[1:] - corr[:-1]) >= HOLE_MIN_ID_JUMP) & ((gap_e - gap_s) >= HOLE_MIN_NS)
    return iv.clip(iv.union(gap_s[hole], gap_e[hole]), w.start_ns, w.end_ns)


#: a launched kernel that has not started this long after its launch returned, on a GPU the trace shows
#: idle, was queued behind work the trace did not record (launched before recording began)
PENDING_MIN_NS = 1_000_000


def _pending_on_idle(trace: RankTrace, w: Window, replays: dict[int, iv.Intervals]) -> iv.Intervals:
    """Times at which a launched kernel was waiting to start while its device shows no work: an idle
    GPU starts a kernel within microseconds, so the device was busy with work the trace lacks. ``replays``: where
    each device ran a graph known from its capture (work the trace lacks, but knows of)."""
    q = launch_queue(trace)
    q = q[(q["delay_ns"] >= PENDING_MIN_NS).to_numpy()]
    if q.empty:
        return iv.EMPTY
    busy = device_busy(trace)
    parts_s, parts_e = [], []
    for device, group in q.groupby("device"):
        waiting = iv.clip(iv.union(group["ts_ns"].to_numpy() - group["delay_ns"].to_numpy(), group["ts_ns"].to_numpy()),
                          w.start_ns, w.end_ns)
        unexplained = iv.subtract(iv.subtract(waiting, busy.get(int(device), iv.EMPTY)),
                                  replays.get(int(device), iv.EMPTY))
        keep = (unexplained[1] - unexplained[0]) >= PENDING_MIN_NS
        parts_s.append(unexplained[0][keep])
        parts_e.append(unexplained[1][keep])
    return iv.union(np.concatenate(parts_s), np.concatenate(parts_e))
