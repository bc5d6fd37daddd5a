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
(``method``). Everything here is a pure function of the rank trace and the finding."""


from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.trace import RankTrace, trace_view
from kinetoscope.analyze.whatif.graph import NONE, ReplayGraph, replay_graph
from kinetoscope.analyze.whatif.loader_queue import LoaderFix, simulate_loader


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
    loader: LoaderFix | None = None

    def merge(self, other: Edits) -> Edits:
        out = Edits(dict(self.item_dur), set(self.item_free) | other.item_free, dict(self.op_dur),
                    max(self.floor_step_ns, other.floor_step_ns), dict(self.analytic_ns), self.loader or other.loader)
        for k, v in other.item_dur.items():
            out.item_dur[k] = min(v, out.item_dur.get(k, v))
        for k, v in other.op_dur.items():
            out.op_dur[k] = min(v, out.op_dur.get(k, v))
        for key, ns in other.analytic_ns.items():
            out.analytic_ns[key] = max(ns, out.analytic_ns.get(key, ns))
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
    starts = launch + g.op_a[idx]
    deps = g.op_dep[idx]
    has = deps >= 0
    if has.any():
        starts[has] = np.maximum(starts[has], op_end[deps[has]] + g.op_c[idx][has])
    x = starts + dur[idx]
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
        if fix.ready is not None:
            # batches that were ready stay as recorded: more workers cannot make a ready batch readier (was: each
            # credited down to the assumed hand-over, so waits of 0.95 ms against a probed 0.70 ms were worth 4% of a
            # run with more workers)
            waits = np.where(fix.ready, own, waits)
        waits = np.minimum(waits, own)  # a fix never makes a wait longer (it would not be applied)
        e = Edits(dict(edits.item_dur), set(edits.item_free), dict(edits.op_dur), edits.floor_step_ns,
                  dict(edits.analytic_ns))
        e.item_dur.update(wait_edits(g, fix.items, waits))
        result = replay(g, e)
        new = np.maximum(result.step_ns[step_of] - waits, 0.0)
        if np.allclose(new, compute, rtol=1e-3):
            break
        compute = new
    return result  # type: ignore[return-value]


def wait_edits(g: ReplayGraph, waits: np.ndarray, new_ns: np.ndarray) -> dict[int, int]:
    """Item durations that make each wait last about ``new_ns``: its loading (the data pieces) shrinks by what
    the wait loses; syncs or copies inside it (a Dataset calling .cuda()) stay items of their own."""
    pieces: dict[int, list[int]] = {}
    for i, grp in enumerate(g.it_group):
        if grp >= 0:
            pieces.setdefault(int(grp), []).append(i)
    out: dict[int, int] = {}
    for grp, w in zip(waits, new_ns, strict=False):
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


