"""CUDA/HIP graphs: what each captured graph holds, and which graph each replay ran.

A graph is recorded once (stream capture: the launches between ``cudaStreamBeginCapture`` and
``cudaStreamEndCapture`` do not run, Kineto records them as host calls without GPU work) and replayed many times
(``cudaGraphLaunch``). Recent Kineto records a replay's kernels under the launch's correlation id; older Kineto and
ROCm's roctracer often do not. Where the capture is at hand - in the same trace, or in a separate capture trace
(vLLM's and SGLang's ``capture_traces/``) - a replay whose kernels were not recorded still has a known content: the
captured launches, in order. Their durations are not known (the captured kernels never ran).

Matching a replay to its graph: Kineto records no graph id on the replay's launch call nor on the capture, so
the match is by elimination and stated with its basis and confidence, never guessed silently:

- ``only_capture``: the trace (and its capture traces) hold one captured graph;
- ``identical_captures``: several were captured, all with the same launch sequence (calls, host ops, kernels);
- ``batch_size``: the replay runs inside a serving iteration annotated with its batch size (vLLM
  ``execute_…_context_…_generation_…``, SGLang ``step[DECODE bs=N]``), matched to the capture trace of the smallest
  captured batch size that holds it (the servers pad up to it), and to its one capture, or to the capture at the
  replay's position when the iteration replays as many graphs as the file captured (piecewise graphs).

Confidence is "medium" at best: a graph captured before recording began would look the same as none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.schema import GRAPH_CAPTURE_COLUMNS
from kinetoscope.analyze.model.timeline import (
    CAPTURE_BEGIN_RE,
    CAPTURE_END_RE,
    GRAPH_LAUNCH_RE,
    gpu_work,
    kind_mask,
    name_mask,
    runtime_calls,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace, trace_view

#: calls that put work on a stream, and so put a node into a graph when the stream is capturing
CAPTURED_LAUNCH_RE = re.compile(
    r"^(cuda|hip|cu)[A-Za-z0-9]*?(LaunchKernel(ExC|Ex)?|LaunchCooperativeKernel|Memcpy[A-Za-z0-9]*Async"
    r"|Memset[A-Za-z0-9]*Async)(_v2)?(_ptsz|_spt)?$"
)
#: calls after whose return every graph replayed before them has finished
DEVICE_SYNC_RE = re.compile(r"^(cuda|hip)DeviceSynchronize$|^cuCtxSynchronize$")
#: a serving iteration's batch size: vLLM's ``execute_context_{reqs}({tokens})_generation_{reqs}({tokens})`` (its
#: detailed form writes ``(sq{tokens}...``), SGLang's ``step[DECODE bs=N]``; the graph is captured per token count
_VLLM_ITERATION_RE = re.compile(r"^execute_(?:\d+_)?context_\d+\((?:sq)?(\d+)[^)]*\)_generation_\d+\((?:sq)?(\d+)")
_SGLANG_ITERATION_RE = re.compile(r"^step\[[A-Z]+\b[^\]]*\bbs=(\d+)")
#: a capture trace's batch size: its file name (SGLang/ATOM ``bs_{N}_…``) or a ``capture_{N}_{mode}`` annotation
_CAPTURE_FILE_BS_RE = re.compile(r"(?:^|[_/-])bs_?(\d+)(?:[_.-]|$)")
_CAPTURE_ANNOTATION_RE = re.compile(r"^capture_(\d+)_")
THIS_TRACE = "this trace"


@dataclass(frozen=True)
class CapturedGraph:
    """One stream capture: the launches it recorded, in order."""

    #: THIS_TRACE, or the capture trace's file name
    source: str
    #: position among its source's captures, in time order
    capture: int
    batch_size: int | None
    calls: tuple[str, ...]
    #: the host op around each call (None: none recorded)
    ops: tuple[str | None, ...]
    #: the kernel each call launches and its grid, where the call's args name it (None: not written)
    kernels: tuple[str | None, ...]
    grids: tuple[str | None, ...]
    #: where the capture lies in this trace (None for a separate capture trace)
    begin_ns: int | None = None
    end_ns: int | None = None

    @property
    def launches(self) -> int:
        return len(self.calls)

    def content(self) -> tuple[tuple[str | None, ...], ...]:
        return self.calls, self.ops, self.kernels


@dataclass(frozen=True)
class GraphReplay:
    """One graph launch in the window, and what is known of the work it ran."""

    ts_ns: int
    end_ns: int
    tid: str
    #: kernels, copies and memsets the trace recorded under the launch's correlation id
    recorded_work: int
    #: index into ``GraphReplays.graphs``; None: not matched
    graph: int | None
    matched_by: str | None
    confidence: str | None
    #: why a replay without recorded work was not matched (None when matched or recorded)
    unmatched_reason: str | None
    #: the device and stream its thread's last recorded launch before it went to (a replay goes to the thread's
    #: current stream, as ``torch.cuda.CUDAGraph.replay`` does; Kineto does not record the replay's own); None: the
    #: thread launched no recorded work before it
    device: int | None
    stream: int | None
    #: by when it had certainly finished (None: not bounded): the return of the next device-wide sync on its thread
    finished_by_ns: int | None
    #: the earliest start of the recorded work launched to that stream after it, which waited for the replay there
    #: (None: none)
    next_work_ns: int | None

    @property
    def recorded(self) -> bool:
        return self.recorded_work > 0


@dataclass(frozen=True)
class GraphReplays:
    graphs: tuple[CapturedGraph, ...]
    replays: tuple[GraphReplay, ...]
    #: per graph (index), the GPU busy time (union of its work) of each recorded replay whose kernels are the
    #: graph's, by name and count: what a replay of it costs the GPU, where the capture names its kernels
    recorded_alike_ns: dict[int, tuple[int, ...]] = field(default_factory=dict)


OpIndex = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]


def _op_index(ev: pd.DataFrame) -> OpIndex:
    """Per thread, its host ops (aten/custom operators; annotations such as ProfilerStep name no op) by start."""
    ops = ev[kind_mask(ev, ("cpu_op",))]
    tids = ops["tid"].astype(str).to_numpy()
    by_tid = {}
    for tid in np.unique(tids):
        mine = ops[tids == tid]
        order = np.argsort(mine["ts_ns"].to_numpy(), kind="stable")
        by_tid[str(tid)] = (mine["ts_ns"].to_numpy()[order], mine["end_ns"].to_numpy()[order],
                            mine["name"].astype(str).to_numpy()[order])
    return by_tid


def _enclosing_ops(by_tid: OpIndex, calls: pd.DataFrame) -> list[str | None]:
    """The innermost host op of each call's thread that holds it."""
    out: list[str | None] = [None] * len(calls)
    for i, (tid, ts, end) in enumerate(zip(calls["tid"].astype(str), calls["ts_ns"], calls["end_ns"], strict=True)):
        if tid not in by_tid:
            continue
        starts, ends, names = by_tid[tid]
        j = int(np.searchsorted(starts, ts, side="right")) - 1
        while j >= 0:  # the latest-starting op that still holds the call is the innermost
            if ends[j] >= end:
                out[i] = str(names[j])
                break
            j -= 1
    return out


def capture_table(trace: RankTrace, source: str) -> pd.DataFrame:
    """The launches of each stream capture in ``trace`` (``schema.GRAPH_CAPTURE_COLUMNS``), for a capture trace
    kept beside an execution trace (``source``: its file name)."""
    graphs = _captures_in(trace, source)
    rows = [(g.source, g.capture, g.batch_size, i, call, op, kernel, grid)
            for g in graphs
            for i, (call, op, kernel, grid) in enumerate(zip(g.calls, g.ops, g.kernels, g.grids, strict=True))]
    frame = pd.DataFrame(rows, columns=[c.name for c in GRAPH_CAPTURE_COLUMNS])
    return frame.astype({c.name: c.dtype for c in GRAPH_CAPTURE_COLUMNS})


def _capture_batch_size(trace: RankTrace, source: str) -> int | None:
    ev = trace.events
    notes = ev[kind_mask(ev, ("annotation",)) & name_mask(ev, _CAPTURE_ANNOTATION_RE)]
    if len(notes):
        m = _CAPTURE_ANNOTATION_RE.match(str(notes["name"].iloc[0]))
        return int(m.group(1)) if m else None
    m = _CAPTURE_FILE_BS_RE.search(source)
    return int(m.group(1)) if m else None


def _captures_in(trace: RankTrace, source: str) -> list[CapturedGraph]:
    """Each Begin..EndCapture on a thread, with the launches made on that thread in between that ran nothing."""
    calls = runtime_calls(trace)
    begins = calls[name_mask(calls, CAPTURE_BEGIN_RE)].sort_values("ts_ns", kind="stable")
    if begins.empty:
        return []
    ends = calls[name_mask(calls, CAPTURE_END_RE)]
    ran = gpu_work(trace)["correlation"].dropna().to_numpy(np.int64)
    launches = calls[name_mask(calls, CAPTURED_LAUNCH_RE)]
    launches = launches[~np.isin(launches["correlation"].fillna(-1).to_numpy(np.int64), ran)]
    batch_size = _capture_batch_size(trace, source) if source != THIS_TRACE else None
    # per thread, in time order: a served model captures hundreds of graphs of thousands of launches
    end_of = {str(t): g.sort_values("ts_ns", kind="stable") for t, g in ends.groupby(ends["tid"].astype(str))}
    launches_of = {str(t): g.sort_values("ts_ns", kind="stable")
                   for t, g in launches.groupby(launches["tid"].astype(str))}
    ops = _op_index(trace.events)
    lk = trace.launch_kernels
    kernels: Mapping[int, tuple[str, str | None]] = {
        int(c): (str(k), None if pd.isna(g) else str(g))
        for c, k, g in zip(lk["correlation"], lk["kernel"].astype(object), lk["grid"].astype(object), strict=True)}
    out: list[CapturedGraph] = []
    for b in begins.itertuples():
        tid = str(b.tid)
        mine_end = end_of.get(tid)
        k = int(np.searchsorted(mine_end["ts_ns"].to_numpy(), b.end_ns, side="left")) if mine_end is not None else 0
        if mine_end is None or k == len(mine_end):
            continue  # never ended in the trace: no graph was made from it here
        stop, stop_end = int(mine_end["ts_ns"].iloc[k]), int(mine_end["end_ns"].iloc[k])
        inside = launches_of.get(tid, launches.iloc[0:0])
        lo, hi = np.searchsorted(inside["ts_ns"].to_numpy(), [b.end_ns, stop], side="left")
        inside = inside.iloc[lo:hi]
        inside = inside[(inside["end_ns"] <= stop).to_numpy()]
        named = [kernels.get(int(c)) if not pd.isna(c) else None for c in inside["correlation"]]
        out.append(CapturedGraph(source=source, capture=len(out), batch_size=batch_size,
                                 calls=tuple(inside["name"].astype(str)),
                                 ops=tuple(_enclosing_ops(ops, inside)),
                                 kernels=tuple(n[0] if n else None for n in named),
                                 grids=tuple(n[1] if n else None for n in named),
                                 begin_ns=int(b.ts_ns), end_ns=stop_end))
    return out


def _from_table(table: pd.DataFrame) -> list[CapturedGraph]:
    out = []
    for (source, capture), g in table.groupby(["source", "capture"], sort=True, observed=True):
        g = g.sort_values("order", kind="stable")
        bs = g["batch_size"].iloc[0]
        out.append(CapturedGraph(source=str(source), capture=int(capture), batch_size=None if pd.isna(bs) else int(bs),
                                 calls=tuple(g["call"].astype(str)), ops=_texts(g["op"]), kernels=_texts(g["kernel"]),
                                 grids=_texts(g["grid"])))
    return out


def _texts(column: pd.Series) -> tuple[str | None, ...]:
    return tuple(None if pd.isna(v) else str(v) for v in column.astype(object))


def _iteration_batch_sizes(trace: RankTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, batch size) of each serving iteration the trace annotates, sorted by start."""
    ev = trace.events
    rows = ev[name_mask(ev, _VLLM_ITERATION_RE) | name_mask(ev, _SGLANG_ITERATION_RE)]
    starts, ends, sizes = [], [], []
    for name, ts, end in zip(rows["name"].astype(str), rows["ts_ns"], rows["end_ns"], strict=True):
        vllm, sglang = _VLLM_ITERATION_RE.match(name), _SGLANG_ITERATION_RE.match(name)
        if vllm is not None:
            size = int(vllm.group(1)) + int(vllm.group(2))  # context tokens + decode tokens: the graph's size
        elif sglang is not None:
            size = int(sglang.group(1))
        else:
            continue
        starts.append(int(ts))
        ends.append(int(end))
        sizes.append(size)
    order = np.argsort(np.asarray(starts, dtype=np.int64), kind="stable")
    return (np.asarray(starts, np.int64)[order], np.asarray(ends, np.int64)[order], np.asarray(sizes, np.int64)[order])


@trace_view
def graph_replays(trace: RankTrace) -> GraphReplays:
    """Every graph launch in the window, matched to its captured graph where the evidence allows."""
    own = _captures_in(trace, THIS_TRACE)
    external = _from_table(trace.graph_captures) if len(trace.graph_captures) else []
    graphs = tuple(own + external)
    w = window(trace)
    calls = runtime_calls(trace)
    launches = calls[name_mask(calls, GRAPH_LAUNCH_RE) & (calls["end_ns"] > w.start_ns).to_numpy()
                     & (calls["ts_ns"] < w.end_ns).to_numpy()].sort_values("ts_ns", kind="stable")
    if launches.empty:
        return GraphReplays(graphs=graphs, replays=())
    work = gpu_work(trace)
    per_corr = work["correlation"].dropna().astype(np.int64).value_counts()
    # each thread's launches of recorded work, in time order, with the device and stream that work ran on
    placed = work.dropna(subset=["correlation"]).drop_duplicates("correlation")  # sorted by start: its first op
    placed = pd.DataFrame({"correlation": placed["correlation"].astype(np.int64).to_numpy(),
                           "device": placed["device"].to_numpy(np.int64),
                           "stream": placed["stream"].to_numpy(np.int64),
                           "start_ns": placed["ts_ns"].to_numpy(np.int64)})
    launched = calls[calls["correlation"].notna().to_numpy()]
    launched = pd.DataFrame({"tid": launched["tid"].astype(str).to_numpy(), "ts_ns": launched["ts_ns"].to_numpy(),
                             "correlation": launched["correlation"].astype(np.int64).to_numpy()})
    launched = launched.merge(placed, on="correlation").sort_values("ts_ns", kind="stable")
    by_thread = {str(tid): (g["ts_ns"].to_numpy(), g["device"].to_numpy(), g["stream"].to_numpy())
                 for tid, g in launched.groupby("tid", sort=False)}
    # per stream, by launch: the earliest start of the work launched at or after each launch (a stream runs its
    # work in launch order, so work launched after a replay to its stream waited for it)
    after_launch = {(int(d), int(st)): (g["ts_ns"].to_numpy(),
                                         np.minimum.accumulate(g["start_ns"].to_numpy()[::-1])[::-1])
                    for (d, st), g in launched.groupby(["device", "stream"], sort=False)}
    syncs = calls[name_mask(calls, DEVICE_SYNC_RE)]
    syncs_of = {str(t): (g["ts_ns"].to_numpy(), np.minimum.accumulate(g["end_ns"].to_numpy()[::-1])[::-1])
                for t, g in syncs.sort_values("ts_ns", kind="stable").groupby(syncs["tid"].astype(str))}
    matcher = _Matcher(graphs, external, launches, _iteration_batch_sizes(trace))

    replays: list[GraphReplay] = []
    for row in launches.itertuples():
        tid = str(row.tid)
        ts, end = int(row.ts_ns), int(row.end_ns)
        recorded = int(per_corr.get(int(row.correlation), 0)) if not pd.isna(row.correlation) else 0
        device = stream = None
        if tid in by_thread:
            l_ts, l_dev, l_stream = by_thread[tid]
            k = int(np.searchsorted(l_ts, ts, side="left")) - 1
            if k >= 0:
                device, stream = int(l_dev[k]), int(l_stream[k])
        graph = matched_by = reason = None
        if not recorded:
            graph, matched_by, reason = matcher.match(ts, tid)
        finished_by = None
        if tid in syncs_of:  # the earliest return of a sync called after the launch returned
            s_ts, s_first_end = syncs_of[tid]
            k = int(np.searchsorted(s_ts, end, side="left"))
            finished_by = int(s_first_end[k]) if k < len(s_ts) else None
        next_work = None
        if device is not None and stream is not None:
            l_ts, first_start = after_launch[(device, stream)]
            k = int(np.searchsorted(l_ts, ts, side="right"))
            next_work = int(first_start[k]) if k < len(l_ts) else None
        replays.append(GraphReplay(ts_ns=ts, end_ns=end, tid=tid, recorded_work=recorded, graph=graph,
                                   matched_by=matched_by, confidence="medium" if matched_by else None,
                                   unmatched_reason=reason, device=device, stream=stream, finished_by_ns=finished_by,
                                   next_work_ns=next_work))
    return GraphReplays(graphs=graphs, replays=tuple(replays),
                        recorded_alike_ns=_recorded_alike(graphs, launches, replays, work))


def _kernel_names(graph: CapturedGraph) -> tuple[str, ...] | None:
    """The graph's kernels by name, sorted (its copies and memsets left out), where the capture names every one."""
    launched = [k for c, k in zip(graph.calls, graph.kernels, strict=True) if "LaunchKernel" in c
                or "LaunchCooperativeKernel" in c]
    if not launched or any(k is None for k in launched):
        return None
    return tuple(sorted(str(k) for k in launched))


def _recorded_alike(graphs: tuple[CapturedGraph, ...], launches: pd.DataFrame, replays: list[GraphReplay],
                    work: pd.DataFrame) -> dict[int, tuple[int, ...]]:
    keys: dict[tuple[str, ...], list[int]] = {}
    for i, g in enumerate(graphs):
        key = _kernel_names(g)
        if key is not None:
            keys.setdefault(key, []).append(i)
    if not keys or not any(r.recorded for r in replays):
        return {}
    kernels = work[kind_mask(work, ("kernel",))]
    out: dict[int, list[int]] = {}
    for corr, r in zip(launches["correlation"], replays, strict=True):
        if not r.recorded or pd.isna(corr):
            continue
        ran = work[(work["correlation"] == corr).to_numpy()]
        key = tuple(sorted(kernels["name"][(kernels["correlation"] == corr).to_numpy()].astype(str)))
        for i in keys.get(key, []):
            out.setdefault(i, []).append(iv.measure(iv.union(ran["ts_ns"].to_numpy(), ran["end_ns"].to_numpy())))
    return {i: tuple(v) for i, v in out.items()}


class _Matcher:
    """Matches one graph's replays after another to the captured graphs (the work done once per trace)."""

    def __init__(self, graphs: tuple[CapturedGraph, ...], external: list[CapturedGraph], launches: pd.DataFrame,
                 iterations: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.graphs = graphs
        self.it_start, self.it_end, self.it_size = iterations
        self.sizes = sorted({g.batch_size for g in external if g.batch_size is not None})
        self.launch_ts = {str(t): np.sort(g["ts_ns"].to_numpy())
                          for t, g in launches.groupby(launches["tid"].astype(str))}
        # candidates without a batch size to choose by: every capture trace's graph, and this trace's graphs that
        # ended before the replay; per number of this trace's graphs ended, how many distinct contents and the last
        contents: dict[tuple[tuple[str | None, ...], ...], int] = {}
        last = -1
        for i, g in enumerate(graphs):
            if g.source != THIS_TRACE:
                contents.setdefault(g.content(), i)
                last = i
        own = [i for i, g in enumerate(graphs) if g.source == THIS_TRACE]
        own.sort(key=lambda i: graphs[i].end_ns or 0)
        self.own_end = np.array([graphs[i].end_ns or 0 for i in own], dtype=np.int64)
        self.distinct, self.count, self.last = [len(contents)], [len(graphs) - len(own)], [last]
        for i in own:
            contents.setdefault(graphs[i].content(), i)
            self.distinct.append(len(contents))
            self.count.append(self.count[-1] + 1)
            self.last.append(last if last >= 0 and graphs[last].source != THIS_TRACE else i)

    def match(self, ts: int, tid: str) -> tuple[int | None, str | None, str | None]:
        """(graph index, basis, why not) for one replay whose work was not recorded."""
        if not self.graphs:
            return None, None, "no capture in the trace or beside it"
        k = int(np.searchsorted(self.it_start, ts, side="right")) - 1
        for _ in range(8):  # the innermost annotation holding the replay (a server may annotate a step twice, nested)
            if k < 0 or ts < self.it_end[k]:
                break
            k -= 1
        if self.sizes and k >= 0 and ts < self.it_end[k]:  # a serving iteration's batch size picks the capture trace
            return self._by_batch_size(ts, tid, k)
        p = int(np.searchsorted(self.own_end, ts, side="right"))
        if not self.count[p]:
            return None, None, "the trace's captures all come after this replay"
        if self.distinct[p] > 1:
            return None, None, (f"{self.count[p]} captured graphs with different launches and nothing to tell them "
                                "apart")
        return self.last[p], "only_capture" if self.count[p] == 1 else "identical_captures", None

    def _by_batch_size(self, ts: int, tid: str, k: int) -> tuple[int | None, str | None, str | None]:
        size = int(self.it_size[k])
        fits = [s for s in self.sizes if s >= size]
        if not fits:
            return None, None, f"the iteration's batch size {size} exceeds every captured one ({max(self.sizes)})"
        chosen = [i for i, g in enumerate(self.graphs) if g.source != THIS_TRACE and g.batch_size == fits[0]]
        sources = {self.graphs[i].source for i in chosen}
        if len(sources) > 1:
            return None, None, f"{len(sources)} capture traces for batch size {fits[0]}"
        if len(chosen) == 1:
            return chosen[0], "batch_size", None
        mine = self.launch_ts.get(tid, np.empty(0, np.int64))
        lo, hi = np.searchsorted(mine, [self.it_start[k], self.it_end[k]], side="left")
        if hi - lo == len(chosen):  # piecewise graphs: one replay per captured piece, in capture order
            return chosen[int(np.searchsorted(mine[lo:hi], ts, side="left"))], "batch_size", None
        return None, None, (f"the capture trace for batch size {fits[0]} holds {len(chosen)} graphs and the "
                            f"iteration replays {hi - lo}")


def replay_span(r: GraphReplay) -> tuple[int, int] | None:
    """Where a replay whose work was not recorded ran its captured graph, when that can be bounded: from its launch
    to the next recorded work on its stream or the next device-wide sync on its thread, whichever comes first; None
    when it is recorded, unmatched, on an unknown stream or unbounded."""
    if r.recorded or r.graph is None or r.device is None:
        return None
    bounds = [b for b in (r.finished_by_ns, r.next_work_ns) if b is not None]
    if not bounds:
        return None
    return r.ts_ns, max(min(bounds), r.end_ns)
