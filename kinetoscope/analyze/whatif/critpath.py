"""The critical path of each step, from the replay graph: the chain of host work, launches, GPU ops and waits that
ends the step, and how much the rest could slip (its slack) before it would end the step instead.

The unchanged replay reproduces the recorded times, and each of its times is the max of a few constraints (an op
starts at ``max(launch + a, previous op on its stream + b, awaited op on another stream + c)``, a sync ends at
``max(start + own cost, awaited op's end + tail)``). Walking back from a step's end through the constraint that
decided each time gives a chain of segments that tiles the step exactly: their durations add up to the step.

Slack (total float) comes from one backward pass over the same graph: how long an op, or the host at a point,
could be delayed without any window step ending later. A step's ``gpu_slack`` is the most slack of its GPU ops (how
much longer one stretch of GPU work could run before the GPU bounds the step; 0 where it does), its ``host_slack``
the same for the host (how much CPU work could be added at one place: time the host spent waiting in syncs the GPU
decided). A fix that shortens a stretch of the path gains at most the slack of the work beside it: that is why
removing a wait can gain less than the wait. Pure functions of the graph and its replay."""


from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.collectives import COLLECTIVE_RE
from kinetoscope.analyze.model.phases import PHASES, host_phases, phase_lookup
from kinetoscope.analyze.model.results import CriticalPathSummary, MedianStepPath, PathKind, PathName, PathSegment
from kinetoscope.analyze.model.timeline import gpu_work, main_thread, name_mask, runtime_calls
from kinetoscope.analyze.model.trace import RankTrace, trace_view
from kinetoscope.analyze.whatif.graph import NONE, ReplayGraph, replay_graph
from kinetoscope.analyze.whatif.replay import Edits, Replayed, baseline

#: segment kinds, in the order reports list them
KINDS = ("host", "data", "sync", "copy", "launch", "kernel", "collective", "memcpy", "memset", "stream_gap")
#: kinds that are GPU work
GPU_KINDS = frozenset({"kernel", "collective", "memcpy", "memset"})
#: segments of a step listed one by one in the report, the rest summed (their number and time are given)
LISTED_SEGMENTS = 40
#: names listed per rank (the path's time by kind and name, mean per step)
LISTED_NAMES = 10


@dataclass(frozen=True)
class Segment:
    kind: str
    name: str
    start_ns: int
    dur_ns: int
    #: the host item (index into the graph's items) or GPU op (index into its ops) it belongs to; -1: none
    item: int = -1
    op: int = -1


@dataclass(frozen=True)
class StepPath:
    start_ns: int
    end_ns: int
    segments: tuple[Segment, ...]
    #: the most slack of a GPU op that started in the step (ns): how much longer one stretch of its GPU work could
    #: run before a window step ends later (0: the GPU bounds it); None: no GPU op, or none any step end awaits
    gpu_slack_ns: float | None
    #: the same for the host at its launches, its syncs' and waits' starts and the step's start: how much CPU work
    #: could be added at one place before a step ends later (0: the host bounds it)
    host_slack_ns: float | None

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, eq=False)
class CriticalPath:
    steps: tuple[StepPath, ...]
    #: each GPU op's slack (ns; inf: no step end awaits it)
    op_slack_ns: np.ndarray

    def item_on_path_ns(self) -> dict[int, int]:
        """Time each host item spent on the path, summed over steps."""
        out: dict[int, int] = defaultdict(int)
        for s in self.steps:
            for seg in s.segments:
                if seg.item >= 0:
                    out[seg.item] += seg.dur_ns
        return dict(out)


def _decoded(column: pd.Series) -> np.ndarray:
    """A categorical column as an object array, decoded once per category (not per row)."""
    cats = np.asarray(column.cat.categories.astype(str), dtype=object)
    codes = column.cat.codes.to_numpy()
    return np.where(codes >= 0, cats[np.maximum(codes, 0)] if len(cats) else "", "")


def _op_kinds(trace: RankTrace, g: ReplayGraph) -> tuple[np.ndarray, np.ndarray]:
    if not len(g.op_label):
        return np.zeros(0, dtype=object), np.zeros(0, dtype=object)
    ops = gpu_work(trace).loc[g.op_label]
    coll = name_mask(ops, COLLECTIVE_RE, search=True)
    return _decoded(ops["name"]), np.where(coll, "collective", _decoded(ops["kind"]))


def _item_names(trace: RankTrace, g: ReplayGraph) -> list[str]:
    """A name per host item: the runtime call a sync or copy item is (as recorded), ``DataLoader`` for data waits."""
    main = main_thread(trace)
    by_start: dict[int, str] = {}
    if main is not None:
        rt = runtime_calls(trace)
        rt = rt[(rt["tid"].astype(str) == main).to_numpy()]
        for ts, name in zip(rt["ts_ns"].to_numpy(np.int64), _decoded(rt["name"]), strict=False):
            by_start.setdefault(int(ts), name)
    out = []
    for s, k in zip(g.it_start, g.it_kind, strict=False):
        out.append("DataLoader" if k == "data" else by_start.get(int(s), str(k)))
    return out


def _prev_on_stream(g: ReplayGraph) -> np.ndarray:
    n = len(g.op_start)
    prev = np.full(n, -1, dtype=np.int64)
    if n:
        order = np.lexsort((np.arange(n), g.op_stream))
        same = np.r_[False, g.op_stream[order][1:] == g.op_stream[order][:-1]]
        prev[order[same]] = order[np.flatnonzero(same) - 1]
    return prev


def _shift_at(ends: np.ndarray, shift: np.ndarray, t: np.ndarray) -> np.ndarray:
    if not len(ends):
        return np.zeros(len(t), dtype=np.int64)
    k = np.searchsorted(ends, t, side="right") - 1
    return np.where(k >= 0, shift[np.maximum(k, 0)], 0)


@dataclass(frozen=True)
class _Times:
    """The replayed times of the graph's nodes (the unchanged replay: the recorded ones)."""

    op_start: np.ndarray
    op_end: np.ndarray
    anchor: np.ndarray
    it_start: np.ndarray
    it_end: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray
    prev: np.ndarray


def _times(g: ReplayGraph, r: Replayed) -> _Times:
    shift = r.item_end - g.it_end
    op_end = r.op_end.astype(np.int64)
    n_items = len(g.it_start)
    it_start = g.it_start + np.r_[0, shift[:-1]] if n_items else g.it_start.copy()
    return _Times(op_start=op_end - g.op_dur, op_end=op_end,
                  anchor=g.op_anchor + _shift_at(g.it_end, shift, g.op_anchor),
                  it_start=it_start.astype(np.int64), it_end=r.item_end.astype(np.int64),
                  step_start=g.step_start + _shift_at(g.it_end, shift, g.step_start),
                  step_end=g.step_end + _shift_at(g.it_end, shift, g.step_end), prev=_prev_on_stream(g))


def _gpu_bound(g: ReplayGraph, t: _Times, i: int) -> bool:
    """Whether item i ended when the op it awaited ended (it waited), not after its own cost."""
    j = int(g.it_await[i])
    if g.it_kind[i] == "data" or j < 0 or t.op_end[j] == NONE:
        return False
    return bool(t.op_end[j] > t.it_start[i] and t.op_end[j] + g.it_post[i] >= t.it_start[i] + g.it_min[i])


def _walk(g: ReplayGraph, t: _Times, k: int, op_names: np.ndarray, op_kinds: np.ndarray,
          item_names: list[str]) -> list[Segment]:
    """Step k's path, from its end back to its start, through the constraint that decided each time."""
    lo_bound, cur = int(t.step_start[k]), int(t.step_end[k])
    segs: list[Segment] = []

    def emit(kind: str, name: str, lo: int, item: int = -1, op: int = -1) -> None:
        nonlocal cur
        a = max(lo, lo_bound)
        if cur > a:
            segs.append(Segment(kind, name, a, cur - a, item, op))
        cur = min(cur, max(lo, lo_bound))

    op = -1  # -1: on the host at ``cur``
    budget = 4 * (len(g.op_start) + len(g.it_start)) + 16
    while cur > lo_bound:
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"critical path of step {k}: the walk back does not end (a cycle in the graph)")
        if op < 0:
            i = int(np.searchsorted(t.it_start, cur, side="left")) - 1
            if i < 0:
                emit("host", "CPU work", lo_bound)
                break
            if t.it_end[i] < cur:
                emit("host", "CPU work", int(t.it_end[i]))
            elif t.it_end[i] > cur:  # inside the item: host work of another thread, tied to the item's start
                emit("host", "CPU work", int(t.it_start[i]))
            elif _gpu_bound(g, t, i):
                j = int(g.it_await[i])
                emit(str(g.it_kind[i]), item_names[i], int(t.op_end[j]), item=i)
                op = j
            else:
                emit(str(g.it_kind[i]), item_names[i], int(t.it_start[i]), item=i)
            continue
        j = op
        start = int(t.op_start[j])
        emit(str(op_kinds[j]), str(op_names[j]), start, op=j)
        p, d = int(t.prev[j]), int(g.op_dep[j])
        by_stream = int(t.op_end[p]) + int(g.op_b[j]) if p >= 0 else NONE
        by_dep = int(t.op_end[d]) + int(g.op_c[j]) if d >= 0 else NONE
        by_launch = int(t.anchor[j]) + int(g.op_a[j])
        if p >= 0 and by_stream >= by_dep and by_stream >= by_launch:
            emit("stream_gap", "after the previous op on its stream", int(t.op_end[p]), op=j)
            op = p
        elif d >= 0 and by_dep >= by_launch:
            emit("stream_gap", "waiting for an op on another stream", int(t.op_end[d]), op=j)
            op = d
        else:
            emit("launch", "launch", int(t.anchor[j]), op=j)
            op = -1
    segs.reverse()
    return segs


def _slack(g: ReplayGraph, t: _Times) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(each op's slack, the host's slack at each op's launch, at each item's start and at each step's start), in ns
    (inf: nothing after it ends a window step): one backward pass in time order. An op may
    slip until its next op on the stream, an op waiting on it, or a sync awaiting it would move, plus their own
    slack; the host may slip by what the syncs after it spent waiting, up to the slack of what it launches."""
    n_ops, n_items, n_steps = len(t.op_start), len(t.it_start), len(t.step_start)
    inf = math.inf
    F = np.full(n_ops, inf)
    D_end = np.full(n_items, inf)
    nxt = np.full(n_ops, -1, dtype=np.int64)
    has_prev = t.prev >= 0
    nxt[t.prev[has_prev]] = np.flatnonzero(has_prev)
    dep_succ: dict[int, list[int]] = defaultdict(list)
    for k in np.flatnonzero(g.op_dep >= 0):
        dep_succ[int(g.op_dep[k])].append(int(k))
    awaiting: dict[int, list[int]] = defaultdict(list)
    for i in range(n_items):
        if g.it_kind[i] != "data" and g.it_await[i] >= 0:
            awaiting[int(g.it_await[i])].append(i)
    # events, processed from the latest; at one time, in reverse host order: ops and their launches, item starts,
    # the next step's start, the step's end, item ends (a sync returns, then the step ends, then the next begins)
    item_start_p = np.where(t.it_end > t.it_start, 4, 0)  # an empty item: its end first, then its start
    ev_t = np.concatenate([t.step_end, t.op_start, t.anchor, t.it_end, t.it_start, t.step_start])
    ev_p = np.concatenate([np.full(n_steps, 2), np.full(n_ops, 6), np.full(n_ops, 5), np.full(n_items, 1),
                           item_start_p, np.full(n_steps, 3)])
    ev_k = np.concatenate([np.full(n_steps, 6), np.full(n_ops, 5), np.full(n_ops, 4), np.full(n_items, 3),
                           np.full(n_items, 2), np.full(n_steps, 1)])
    ev_i = np.concatenate([np.arange(n_steps), np.arange(n_ops), np.arange(n_ops), np.arange(n_items),
                           np.arange(n_items), np.arange(n_steps)])
    order = np.lexsort((ev_p, ev_t))[::-1]
    host = inf
    start_slack = np.full(n_steps, inf)
    at_launch = np.full(n_ops, inf)
    at_item = np.full(n_items, inf)
    op_start, op_end, anchor = t.op_start, t.op_end, t.anchor
    for e in order:
        p, i = int(ev_k[e]), int(ev_i[e])
        if p == 6:
            host = 0.0
        elif p == 5:
            best = inf
            n = int(nxt[i])
            if n >= 0 and F[n] < inf:
                best = min(best, float(op_start[n] - (op_end[i] + g.op_b[n])) + F[n])
            for s in dep_succ.get(i, ()):
                if F[s] < inf:
                    best = min(best, float(op_start[s] - (op_end[i] + g.op_c[s])) + F[s])
            for it in awaiting.get(i, ()):
                if D_end[it] < inf:
                    best = min(best, float(t.it_end[it] - (op_end[i] + g.it_post[it])) + D_end[it])
            F[i] = best
        elif p == 4:
            if F[i] < inf:
                host = min(host, float(op_start[i] - (anchor[i] + g.op_a[i])) + F[i])
            at_launch[i] = host
        elif p == 3:
            D_end[i] = host
            host = inf  # the host inside the item moves with its start, not its end
        elif p == 2:
            absorb = 0 if g.it_kind[i] == "data" else int(t.it_end[i] - (t.it_start[i] + g.it_min[i]))
            host = min(host, D_end[i] + absorb)
            at_item[i] = host
        else:
            start_slack[i] = host
    return F, at_launch, at_item, start_slack


#: phases whose name says more than "CPU work" about a stretch of host work on the path
NAMED_PHASES = frozenset({"forward", "backward", "optimizer", "zero_grad", "compile", "h2d"})


def _by_phase(segs: list[Segment], phases: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[Segment]:
    """Host work on the path split where the training thread's phase changes, each piece named by its phase
    ("forward", "optimizer", ...; "CPU work" outside those)."""
    starts, ends, labels = phases
    if not starts.size:
        return segs
    out: list[Segment] = []
    for seg in segs:
        if seg.kind != "host":
            out.append(seg)
            continue
        lo, hi = seg.start_ns, seg.start_ns + seg.dur_ns
        first = max(int(np.searchsorted(ends, lo, side="right")), 0)
        cur = lo
        for i in range(first, len(starts)):
            if starts[i] >= hi:
                break
            a, b = max(int(starts[i]), lo), min(int(ends[i]), hi)
            if b <= a:
                continue
            if a > cur:  # not in any phase (outside the window)
                out.append(Segment("host", "CPU work", cur, a - cur))
            phase = PHASES[int(labels[i])]
            name = phase if phase in NAMED_PHASES else "CPU work"
            if out and out[-1].kind == "host" and out[-1].name == name and out[-1].start_ns + out[-1].dur_ns == a:
                last = out.pop()
                out.append(Segment("host", name, last.start_ns, last.dur_ns + b - a))
            else:
                out.append(Segment("host", name, a, b - a))
            cur = b
        if cur < hi:
            out.append(Segment("host", "CPU work", cur, hi - cur))
    return out


def _most(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if len(finite) else None


@trace_view
def critical_path(trace: RankTrace) -> CriticalPath:
    g = replay_graph(trace)
    r = baseline(trace)
    t = _times(g, r)
    op_names, op_kinds = _op_kinds(trace, g)
    item_names = _item_names(trace, g)
    F, at_launch, at_item, at_start = _slack(g, t)
    phases = phase_lookup(host_phases(trace))
    steps = []
    for k in range(g.steps):
        s0, s1 = t.step_start[k], t.step_end[k]
        segs = _by_phase(_walk(g, t, k, op_names, op_kinds, item_names), phases)
        ops = (t.op_start >= s0) & (t.op_start < s1)
        launched = (t.anchor >= s0) & (t.anchor < s1)
        items = (t.it_start >= s0) & (t.it_start < s1)
        host = _most(np.r_[at_start[k], at_launch[launched], at_item[items]])
        steps.append(StepPath(int(s0), int(s1), tuple(segs), _most(F[ops]), host))
    return CriticalPath(tuple(steps), F)


# --- the report's block --------------------------------------------------------------------------------
def _us(ns: float) -> float:
    return round(ns / 1000, 3)


def _merged(segs: tuple[Segment, ...]) -> list[tuple[str, str, int, int]]:
    """Consecutive segments of one kind and name as one (a run of a kernel's launches reads as one)."""
    out: list[tuple[str, str, int, int]] = []
    for s in segs:
        if out and out[-1][0] == s.kind and out[-1][1] == s.name and out[-1][2] + out[-1][3] == s.start_ns:
            out[-1] = (s.kind, s.name, out[-1][2], out[-1][3] + s.dur_ns)
        else:
            out.append((s.kind, s.name, s.start_ns, s.dur_ns))
    return out


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def critical_path_entry(trace: RankTrace) -> CriticalPathSummary | None:
    """The report's ``critical_path`` block: the path's time by kind and by name (mean per window step), the
    median step's path segment by segment, and the slack beside it."""
    g = replay_graph(trace)
    if not g.steps:
        return None
    cp = critical_path(trace)
    n = len(cp.steps)
    mean_step = sum(s.dur_ns for s in cp.steps) / n
    by_kind: dict[str, int] = defaultdict(int)
    by_name: dict[tuple[str, str], int] = defaultdict(int)
    for s in cp.steps:
        for seg in s.segments:
            by_kind[seg.kind] += seg.dur_ns
            by_name[(seg.kind, seg.name)] += seg.dur_ns
    kinds = [PathKind(kind=k, dur_us=_us(by_kind[k] / n), step_fraction=round(by_kind[k] / n / mean_step, 4))
             for k in KINDS if by_kind.get(k)]
    names = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))
    top = [PathName(kind=k, name=nm, dur_us=_us(ns / n), step_fraction=round(ns / n / mean_step, 4))
           for (k, nm), ns in names[:LISTED_NAMES]]
    durs = np.array([s.dur_ns for s in cp.steps])
    med = int(np.argsort(durs, kind="stable")[(n - 1) // 2])
    step = cp.steps[med]
    merged = _merged(step.segments)
    listed = merged[:LISTED_SEGMENTS]
    rest = merged[LISTED_SEGMENTS:]
    segments = [PathSegment(kind=k, name=nm, start_us=_us(st - step.start_ns), dur_us=_us(d),
                            step_fraction=round(d / step.dur_ns, 4) if step.dur_ns else None)
                for k, nm, st, d in listed]
    gpu = [s.gpu_slack_ns for s in cp.steps if s.gpu_slack_ns is not None]
    host = [s.host_slack_ns for s in cp.steps if s.host_slack_ns is not None]
    return CriticalPathSummary(
        steps=n,
        fraction_of="the mean window step (by_kind, names); the median step's duration (median_step)",
        mean_step_us=_us(mean_step),
        by_kind=kinds,
        names=top,
        names_left_out=max(0, len(names) - LISTED_NAMES),
        gpu_slack_us=_us(m) if (m := _median(gpu)) is not None else None,
        host_slack_us=_us(m) if (m := _median(host)) is not None else None,
        median_step=MedianStepPath(
            index=med,
            step_us=_us(step.dur_ns),
            segments=segments,
            segments_left_out=len(rest),
            left_out_us=_us(sum(d for *_, d in rest)),
            gpu_slack_us=_us(step.gpu_slack_ns) if step.gpu_slack_ns is not None else None,
            host_slack_us=_us(step.host_slack_ns) if step.host_slack_ns is not None else None,
        ),
    )


def fix_limits(trace: RankTrace, edits: Edits) -> dict[str, float | None] | None:
    """Why a fix that removes host waiting gains less than the waiting: of the window's host items it edits
    (data waits, syncs, blocking copies), their recorded time per step, the part of it on the critical path, and
    the GPU's slack beside the path (median over steps). None where the fix edits no host item."""
    g = replay_graph(trace)
    edited = set(edits.item_dur) | set(edits.item_free)
    if edits.loader is not None:
        groups = {int(x) for x in edits.loader.items}
        edited |= {i for i, grp in enumerate(g.it_group) if int(grp) in groups and g.it_kind[i] == "data"}
    if not g.steps or not edited:
        return None
    cp = critical_path(trace)
    inside = [i for i in edited if g.step_start[0] <= g.it_start[i] < g.step_end[-1]]
    if not inside:
        return None
    on = cp.item_on_path_ns()
    n = g.steps
    gpu = [s.gpu_slack_ns for s in cp.steps if s.gpu_slack_ns is not None]
    median = _median(gpu)
    return {"targeted_us_per_step": _us(sum(int(g.it_end[i] - g.it_start[i]) for i in inside) / n),
            "on_critical_path_us_per_step": _us(sum(on.get(i, 0) for i in inside) / n),
            "gpu_slack_us": _us(median) if median is not None else None}
