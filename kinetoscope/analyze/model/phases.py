"""The phases of a step (what each step of ``for x, y in loader:`` spends, on the host and on the device):
the view the step-anatomy analyzer reports, and the operators view and the outliers and hygiene analyzers use.

Host phases come from what PyTorch records on the training thread:
  data_wait  ``enumerate(DataLoader)#...`` spans
  compile    torch.compile's compilation (``entire_frame_compile``, ``entire_backward_compile``, ...): compile
             time is neither forward nor backward
  zero_grad  ``Optimizer.zero_grad#...`` annotations
  optimizer  ``Optimizer.step#...`` annotations
  sync       ``aten::item``/``_local_scalar_dense``/``cuda*Synchronize``/``cudaMemcpy`` on the training thread
  backward   each backward pass of the step, from its first to its last autograd op (``autograd::engine::
             evaluate_function``, or a bare ``...Backward`` node in 2021 traces), on any thread; a step holds
             several under gradient accumulation (autograd work separated by forward ops on the training thread)
  h2d        top-level ``aten::to``/``_to_copy``/``copy_`` before backward (GPU runs only)
  forward    for each backward pass, from the first other top-level op after the previous pass to its start
  other      the rest of the window (Python between phases, untraced work); on the device, also
             work whose launching call is not in the trace (launched before recording began)
Each nanosecond of the window belongs to exactly one phase (first match in that order), so the
host fractions sum to 1. Device time is attributed by following each kernel/copy back to the
runtime call that launched it (correlation id) and taking the host phase at that call.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.timeline import (
    COMPILE_RE,
    Window,
    gpu_work,
    kind_mask,
    loader_spans,
    main_thread,
    name_mask,
    runtime_calls,
    sync_calls,
    top_level,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace, trace_view

PHASES = ("data_wait", "compile", "zero_grad", "optimizer", "sync", "backward", "h2d", "forward", "other")
OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#")
ZERO_GRAD_RE = re.compile(r"^Optimizer\.zero_grad#")
#: autograd work: the engine's wrapper (2022+) or a bare autograd node (2021: "AddmmBackward")
_STEP_PREFIX_RE = re.compile(r"ProfilerStep#")
BACKWARD_RE = re.compile(r"^autograd::engine::evaluate_function:|^[A-Za-z0-9_:]*Backward\d*$")
COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})


_MAIN_COLUMNS = ("ts_ns", "dur_ns", "end_ns", "name", "kind", "tid")


@trace_view
def phase_events(trace: RankTrace) -> dict[str, pd.DataFrame]:
    """The raw events behind each phase (before precedence), for analyzers that need them."""
    ev = trace.events
    tid = main_thread(trace)
    # masks on categorical codes, one copy per returned frame
    host = ~kind_mask(ev, ("python", "gpu_annotation", "kernel", "memcpy", "memset", "sync", "trace", "mark"))
    main = host & (ev["tid"] == tid).to_numpy(bool) if tid is not None else np.zeros(len(ev), dtype=bool)
    syncs = sync_calls(trace)
    return {
        "data_wait": loader_spans(trace),
        "compile": ev[host & name_mask(ev, COMPILE_RE)],
        "zero_grad": ev[host & name_mask(ev, ZERO_GRAD_RE)],
        "optimizer": ev[host & name_mask(ev, OPTIMIZER_STEP_RE)],
        "sync": syncs[(syncs["tid"] == tid).to_numpy(bool)] if tid is not None else syncs.iloc[0:0],
        "backward": ev[host & name_mask(ev, BACKWARD_RE) & kind_mask(ev, ("cpu_op",))],
        # the training thread's host events: only what the phases read of them (most of a trace's rows)
        "main": ev.loc[main, list(_MAIN_COLUMNS)],
    }


@trace_view
def evaluation_steps(trace: RankTrace) -> np.ndarray:
    """Per row of ``trace.steps``: a step that runs no backward pass and no optimizer step while at least half of
    the steps (and two) run a backward pass - an evaluation iteration, inferred (a window inferred from DataLoader
    waits takes a test loader's batches for steps). All False where too few steps train to tell."""
    steps = trace.steps
    if steps.empty:
        return np.zeros(0, dtype=bool)
    ev = phase_events(trace)
    backward = _steps_holding(steps, ev["backward"])
    optimizer = _steps_holding(steps, ev["optimizer"]) if "optimizer" in ev else np.zeros(len(steps), dtype=bool)
    if not _trains(backward):
        return np.zeros(len(steps), dtype=bool)
    return ~backward & ~optimizer


def _steps_holding(steps: pd.DataFrame, frame: pd.DataFrame) -> np.ndarray:
    """Per step: whether any of ``frame``'s events overlaps it."""
    spans = iv.union(frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy())
    return iv.overlap_each(steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy(), spans) > 0


def _trains(backward: np.ndarray) -> bool:
    """Whether a trace trains, from which of its steps hold a backward pass: at least half of them, and two."""
    return int(backward.sum()) >= max(2, len(backward) // 2)


def waits_before_no_backward(trace: RankTrace, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per DataLoader wait on the training thread (``begin``/``end``, ns): a wait after which no backward pass starts
    before the next wait, in a trace that trains (at least half of its steps, and two, run a backward pass) - a batch
    the loop evaluates, not one it trains on: a validation pass run inside a training step (after its optimizer
    step), which ``evaluation_steps`` cannot tell apart by whole steps. Waits with no operator of the training thread
    between them are one iteration's (a step that takes a batch from each of two loaders, as domain adaptation does)
    and are judged together, by what follows the last. The last wait is judged by what follows it in the trace: where
    nothing does, it counts as training, as does every wait where the trace does not train. An evaluation takes
    several batches in a row: a lone wait no backward follows (an epoch's iterator ending before the next epoch's
    first batch) counts as training."""
    out = np.zeros(len(begin), dtype=bool)
    steps = trace.steps
    if len(begin) < 2 or steps.empty:
        return out
    ev = phase_events(trace)
    backward = ev["backward"]
    if not _trains(_steps_holding(steps, backward)):
        return out
    order = np.argsort(begin, kind="stable")
    b, e = np.asarray(begin)[order], np.asarray(end)[order]
    nxt = np.append(b[1:], np.iinfo(np.int64).max)
    first = np.sort(backward["ts_ns"].to_numpy())
    k = np.searchsorted(first, e, side="left")  # the first backward starting once the wait is over
    followed = (k < len(first)) & (first[np.minimum(k, len(first) - 1)] < nxt)
    # an operator of the training thread between a wait and the next: the loop did something with the batch;
    # none: the next wait is the same iteration's, and what follows it decides for both
    main = ev["main"]
    ops = np.sort(main.loc[(main["kind"] == "cpu_op").to_numpy(bool), "ts_ns"].to_numpy())
    j = np.searchsorted(ops, e, side="left")
    worked = (j < len(ops)) & (ops[np.minimum(j, len(ops) - 1)] < nxt)
    if not followed[-1] and not worked[-1]:  # nothing after the last wait to judge it by: training
        followed[-1] = True
    for i in range(len(b) - 2, -1, -1):
        if not worked[i]:
            followed[i] = followed[i + 1]
    # an evaluation takes batches one after another: a lone wait no backward follows is an iterator ending (an
    # epoch's StopIteration before the next epoch's first batch), not a validation pass
    alone = ~followed
    neighbour = np.zeros(len(b), dtype=bool)
    neighbour[1:] |= alone[:-1]
    neighbour[:-1] |= alone[1:]
    out[order] = alone & neighbour
    return out


def evaluation_waits(trace: RankTrace, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per DataLoader wait on the training thread: one an evaluation took, inferred where the capture did not mark
    which loader each wait was for (with its marks: none here, the marks say) - a wait in an evaluation step
    (``evaluation_steps``) or one no backward pass follows (``waits_before_no_backward``)."""
    begin, end = np.asarray(begin, dtype=np.int64), np.asarray(end, dtype=np.int64)
    if len(trace.marks) or not len(begin):
        return np.zeros(len(begin), dtype=bool)
    out = waits_before_no_backward(trace, begin, end)
    evaluation = evaluation_steps(trace)
    if evaluation.any():
        steps = trace.steps
        starts, ends = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
        i = np.clip(np.searchsorted(starts, begin, side="right") - 1, 0, len(steps) - 1)
        out = out | (evaluation[i] & (begin >= starts[i]) & (begin < ends[i]))
    return out


def _step_envelopes(steps: pd.DataFrame, frame: pd.DataFrame) -> iv.Intervals:
    """Per step: [first start, last end] of the frame's events starting inside the step."""
    if frame.empty or steps.empty:
        return iv.EMPTY
    idx = np.searchsorted(steps["start_ns"].to_numpy(), frame["ts_ns"].to_numpy(), side="right") - 1
    inside = (idx >= 0) & (frame["ts_ns"].to_numpy() < steps["end_ns"].to_numpy()[np.maximum(idx, 0)])
    if not inside.any():
        return iv.EMPTY
    g = pd.DataFrame(
        {"i": idx[inside], "s": frame["ts_ns"].to_numpy()[inside], "e": frame["end_ns"].to_numpy()[inside]}
    )
    agg = g.groupby("i").agg(s=("s", "min"), e=("e", "max"))
    return iv.union(agg["s"].to_numpy(), agg["e"].to_numpy())


def steps_or_window(trace: RankTrace, w: Window) -> pd.DataFrame:
    if len(trace.steps):
        return trace.steps
    return pd.DataFrame({"step": [-1], "start_ns": [w.start_ns], "end_ns": [w.end_ns], "dur_ns": [w.dur_ns]})


@trace_view
def host_phases(trace: RankTrace) -> dict[str, iv.Intervals]:
    """Disjoint host intervals per phase, covering the window exactly."""
    w = window(trace)
    raw = phase_events(trace)
    steps = steps_or_window(trace, w)
    sets: dict[str, iv.Intervals] = {}
    for name in ("data_wait", "compile", "zero_grad", "optimizer", "sync"):
        frame = raw[name]
        sets[name] = iv.clip(iv.union(frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    main = raw["main"]
    # the training thread's own top-level work that is not autograd's: it separates the backward passes of an
    # accumulated step (forward of the next micro-step) - communication and containers do not
    own = main[kind_mask(main, ("cpu_op", "runtime", "driver")) & ~name_mask(main, _NOT_FORWARD_RE)
               & ~name_mask(main, BACKWARD_RE)]
    sets["backward"] = iv.clip(_backward_passes(steps, raw["backward"], own), w.start_ns, w.end_ns)
    # a closure optimizer (LBFGS) runs forward and backward inside its step: those spans are the
    # optimizer's only where nothing else is (its own arithmetic, the line search)
    opt = raw["optimizer"]
    holds_backward = (
        iv.overlap_each(
            opt["ts_ns"].to_numpy(),
            opt["end_ns"].to_numpy(),
            iv.union(raw["backward"]["ts_ns"].to_numpy(), raw["backward"]["end_ns"].to_numpy()),
        )
        > 0
    )
    closures = iv.clip(iv.union(opt["ts_ns"].to_numpy()[holds_backward], opt["end_ns"].to_numpy()[holds_backward]),
                       w.start_ns, w.end_ns)
    if closures[0].size:
        sets["optimizer"] = iv.subtract(sets["optimizer"], closures)
        # backward inside a closure: the autograd work itself (the closure runs forward and backward several
        # times: an envelope from the first to the last would swallow the forwards between them)
        bwd = raw["backward"]
        inside = iv.overlap_each(bwd["ts_ns"].to_numpy(), bwd["end_ns"].to_numpy(), closures) > 0
        outside = iv.clip(_step_envelopes(steps, bwd[~inside]), w.start_ns, w.end_ns)
        within = iv.clip(
            iv.union(bwd["ts_ns"].to_numpy()[inside], bwd["end_ns"].to_numpy()[inside]), w.start_ns, w.end_ns
        )
        sets["backward"] = iv.union(np.concatenate((outside[0], within[0])), np.concatenate((outside[1], within[1])))
        closure_forward = _closure_forwards(trace, closures, within)
    else:
        closure_forward = iv.EMPTY

    # user annotations (record_function ranges) are containers, not work: look at the ops inside
    candidates = (~name_mask(main, _STEP_PREFIX_RE) & ~main.index.isin(raw["data_wait"].index)
                  & kind_mask(main, ("cpu_op", "runtime", "driver")))
    tops = top_level(main[candidates])
    claimed = sets["data_wait"], sets["compile"], sets["zero_grad"], sets["optimizer"], sets["sync"], sets["backward"]
    busy_elsewhere = iv.union(np.concatenate([c[0] for c in claimed]), np.concatenate([c[1] for c in claimed]))
    # ops outside the step's backward passes that are not already another phase
    last_bwd_end = _backward_end_per_op(steps, tops, sets["backward"])
    before_bwd = tops["ts_ns"].to_numpy() < last_bwd_end  # after the step's last pass: not the forward
    free = (
        iv.overlap_each(tops["ts_ns"].to_numpy(), tops["end_ns"].to_numpy(), busy_elsewhere) < tops["dur_ns"].to_numpy()
    )
    if closures[0].size:  # inside a closure optimizer's step, forward is found per evaluation (_closure_forwards)
        free &= iv.overlap_each(tops["ts_ns"].to_numpy(), tops["end_ns"].to_numpy(), closures) == 0
    fwd_ops = tops[before_bwd & free]
    copies = fwd_ops["name"].isin(list(COPY_OPS)) & trace.has_gpu
    sets["h2d"] = iv.clip(iv.union(fwd_ops.loc[copies, "ts_ns"].to_numpy(), fwd_ops.loc[copies, "end_ns"].to_numpy()),
                          w.start_ns, w.end_ns)
    compute = fwd_ops[~copies]
    # forward: for each backward pass, from the first compute op after the previous pass (or the step's start) to
    # the pass's start; after a step's last pass (or in a step with none), to its last compute op
    sets["forward"] = iv.clip(_forward_passes(steps, compute, sets["backward"]), w.start_ns, w.end_ns)
    if closure_forward[0].size:  # each closure evaluation's forward, inside the optimizer's step
        sets["forward"] = iv.union(np.concatenate((sets["forward"][0], closure_forward[0])),
                                   np.concatenate((sets["forward"][1], closure_forward[1])))

    out: dict[str, iv.Intervals] = {}
    taken = iv.EMPTY
    for name in PHASES[:-1]:
        mine = iv.subtract(sets[name], taken) if taken[0].size else sets[name]
        out[name] = mine
        taken = iv.union(np.concatenate((taken[0], mine[0])), np.concatenate((taken[1], mine[1])))
    if closures[0].size:  # what a closure optimizer's step holds besides forward and backward is the optimizer's
        rest = iv.subtract(closures, taken)
        out["optimizer"] = iv.union(np.concatenate((out["optimizer"][0], rest[0])),
                                    np.concatenate((out["optimizer"][1], rest[1])))
        taken = iv.union(np.concatenate((taken[0], rest[0])), np.concatenate((taken[1], rest[1])))
    out["other"] = iv.complement(taken, w.start_ns, w.end_ns)
    return out


#: work on the training thread that is no forward computation: communication and its bookkeeping, containers
_NOT_FORWARD_RE = re.compile(r"^(?:c10d::|record_param_comms|nccl:|gloo:|rccl:|ProfilerStep#|enumerate\(|Optimizer\.)")


def _backward_passes(steps: pd.DataFrame, bwd: pd.DataFrame, own: pd.DataFrame) -> iv.Intervals:
    """Each backward pass: autograd ops of one step, split where the training thread runs its own (forward) work
    between two of them - a step under gradient accumulation holds one pass per micro-step. One envelope per pass,
    from its first autograd op's start to its last one's end."""
    if bwd.empty or steps.empty:
        return iv.EMPTY
    order = np.argsort(bwd["ts_ns"].to_numpy(), kind="stable")
    ts, end = bwd["ts_ns"].to_numpy()[order], bwd["end_ns"].to_numpy()[order]
    step = np.searchsorted(steps["start_ns"].to_numpy(), ts, side="right") - 1
    inside = (step >= 0) & (ts < steps["end_ns"].to_numpy()[np.maximum(step, 0)])
    ts, end, step = ts[inside], end[inside], step[inside]
    if ts.size == 0:
        return iv.EMPTY
    reach = np.maximum.accumulate(end)  # autograd work so far ends here
    # own work starting after the autograd work so far and before the next autograd op: a new pass begins
    starts = np.sort(own["ts_ns"].to_numpy()) if len(own) else np.zeros(0, dtype=np.int64)
    between = np.searchsorted(starts, ts[1:], side="left") - np.searchsorted(starts, reach[:-1], side="left")
    new = np.concatenate(([True], (between > 0) | (step[1:] != step[:-1])))
    first = np.flatnonzero(new)
    return iv.union(ts[first], np.maximum.reduceat(end, first))


def _forward_passes(steps: pd.DataFrame, compute: pd.DataFrame, backward: iv.Intervals) -> iv.Intervals:
    """Forward stretches: before each backward pass, from the first compute op after the previous pass (or the
    step's start) to the pass's start; in a step without a backward pass, from its first compute op to its last
    one's end."""
    if compute.empty or steps.empty:
        return iv.EMPTY
    ts, end = compute["ts_ns"].to_numpy(), compute["end_ns"].to_numpy()
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    s_start, s_end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    out_s, out_e = [], []
    b_start, b_end = backward
    for i in range(len(s_start)):
        lo, hi = s_start[i], s_end[i]
        passes = np.flatnonzero((b_start >= lo) & (b_start < hi))
        prev = lo
        for p in passes:  # one forward per pass: compute after the previous boundary, up to the pass's start
            k = np.searchsorted(ts, prev, side="left")
            if k < len(ts) and ts[k] < b_start[p]:
                out_s.append(ts[k])
                out_e.append(b_start[p])
            prev = max(prev, b_end[p])
        k0 = np.searchsorted(ts, prev, side="left")
        k1 = np.searchsorted(ts, hi, side="left")
        if k1 > k0 and not len(passes):  # a step without backward (inference, validation): its compute
            out_s.append(ts[k0])
            out_e.append(int(end[k0:k1].max()))
    return iv.union(np.asarray(out_s, dtype=np.int64), np.asarray(out_e, dtype=np.int64))


def _closure_forwards(trace: RankTrace, closures: iv.Intervals, backward: iv.Intervals) -> iv.Intervals:
    """The forward passes a closure optimizer (LBFGS) runs inside its step, one per closure evaluation: from
    the first op that autograd links to a backward node (its ``fwdbwd`` flow starts there) after the previous
    backward ends, to the start of the next backward. The optimizer's own arithmetic (no_grad: no such flow)
    between evaluations stays the optimizer's."""
    flows = trace.flows
    if flows.empty or backward[0].size == 0:
        return iv.EMPTY
    is_fwd = (flows["cat"] == "fwdbwd").to_numpy() & (flows["phase"] == "s").to_numpy()
    marks = np.sort(flows["ts_ns"].to_numpy()[is_fwd])
    marks = marks[iv.overlap_each(marks, marks + 1, closures) > 0]
    if marks.size == 0:
        return iv.EMPTY
    b_start, b_end = backward
    prev_end = np.concatenate(([np.iinfo(np.int64).min], b_end[:-1]))
    first = np.searchsorted(marks, prev_end, side="left")
    ok = first < marks.size
    starts = marks[np.minimum(first, marks.size - 1)]
    ok &= starts < b_start
    return iv.intersect(iv.union(starts[ok], b_start[ok]), closures)


def _backward_end_per_op(steps: pd.DataFrame, frame: pd.DataFrame, backward: iv.Intervals) -> np.ndarray:
    """For each event, the end of the last backward pass in its step (int64 max when the step has none)."""
    big = np.iinfo(np.int64).max
    ts = frame["ts_ns"].to_numpy()
    if backward[0].size == 0 or ts.size == 0:
        return np.full(ts.shape, big, dtype=np.int64)
    starts, ends = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    step_idx = np.searchsorted(starts, ts, side="right") - 1
    bwd_step = np.searchsorted(starts, backward[0], side="right") - 1
    last_bwd = np.full(len(starts), big, dtype=np.int64)
    valid = bwd_step >= 0
    if valid.any():
        found = np.full(len(starts), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(found, bwd_step[valid], backward[1][valid])
        last_bwd = np.where(found > np.iinfo(np.int64).min, found, big)
    out = np.where(step_idx >= 0, last_bwd[np.maximum(step_idx, 0)], big)
    return np.where((step_idx >= 0) & (ts < ends[np.maximum(step_idx, 0)]), out, big)


def phase_lookup(phases: dict[str, iv.Intervals]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    starts = np.concatenate([phases[p][0] for p in PHASES])
    ends = np.concatenate([phases[p][1] for p in PHASES])
    labels = np.concatenate([np.full(phases[p][0].size, i) for i, p in enumerate(PHASES)])
    order = np.argsort(starts, kind="stable")
    return starts[order], ends[order], labels[order]


def gpu_phase_of(trace: RankTrace) -> pd.Series:
    """For each GPU work event (index of gpu_work), the host phase that launched it."""
    work = gpu_work(trace)
    runtime = runtime_calls(trace)
    runtime = runtime[runtime["correlation"].notna()].drop_duplicates("correlation")
    starts, ends, labels = phase_lookup(host_phases(trace))
    if starts.size == 0:  # an empty window: nothing to attribute to
        return pd.Series("other", index=work.index, dtype=object)
    # the launching call's start, matched on correlation id (sorted keys, one search)
    keys = runtime["correlation"].to_numpy(np.int64)
    order = np.argsort(keys, kind="stable")
    keys, launch_at = keys[order], runtime["ts_ns"].to_numpy()[order]
    has = work["correlation"].notna().to_numpy()
    corr = work["correlation"].fillna(0).to_numpy(np.int64)
    pos = np.minimum(np.searchsorted(keys, corr), max(len(keys) - 1, 0))
    launched = has & (keys[pos] == corr) if len(keys) else np.zeros(len(work), dtype=bool)
    t = np.where(launched, launch_at[pos] if len(keys) else -1, -1)
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = (idx >= 0) & (t < ends[np.maximum(idx, 0)]) & launched
    names = np.asarray(PHASES, dtype=object)[np.where(ok, labels[np.maximum(idx, 0)], PHASES.index("other"))]
    return pd.Series(names, index=work.index)


