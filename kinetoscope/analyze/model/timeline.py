"""Derived views of a rank shared by several analyzers, computed once per trace.

Everything here is a pure function of the ``RankTrace``; the cache is keyed on
the trace object's identity (``RankTrace`` is frozen), so it never goes stale.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.hostfacts import count
from kinetoscope.analyze.model.trace import RankTrace, trace_view
from kinetoscope.analyze.model.units import us

LOADER_RE = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#")
#: torch.compile compiling (dynamo's frame compile, the lazily compiled backward, the backend): not the step's work
COMPILE_RE = re.compile(r"^(entire_frame_compile|entire_backward_compile|_compile\.compile_inner|backend_compile)"
                        r"(?:$| \(dynamo_timed\))")
#: host calls that block until the device catches up: stream/device/event syncs (runtime and driver
#: API), blocking copies, and frees (cudaFree synchronises the device)
SYNC_RUNTIME_RE = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyWithStream|Free|FreeHost|HostFree)$"
    r"|^cu(Ctx|Stream|Event)Synchronize$|^cuMemcpy(HtoD|DtoH|DtoD)?(_v2)?$|^cuMemFree(Host)?(_v2)?$"
)
SYNC_OP_NAMES = frozenset({"aten::item", "aten::_local_scalar_dense"})
#: a CUDA/HIP graph replay: one call that runs a whole recorded graph of kernels
GRAPH_LAUNCH_RE = re.compile(r"^(cuda|hip)GraphLaunch(_v2)?$|^cuGraphLaunch$")
#: stream capture (recording a graph): launches inside it do not run
CAPTURE_BEGIN_RE = re.compile(
    r"^(cuda|hip)StreamBeginCapture(_v2|ToGraph)?(_ptsz)?$|^cuStreamBeginCapture(_v2)?(_ptsz)?$"
)
CAPTURE_END_RE = re.compile(r"^(cuda|hip)StreamEndCapture(_ptsz)?$|^cuStreamEndCapture(_ptsz)?$")


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int
    basis: str  # "profiler_steps" | "gpu_activity" | "all_events"

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns

    def describe(self) -> str:
        return {
            "profiler_steps": "first ProfilerStep start to last ProfilerStep end",
            "inferred_steps": "training-loop iterations inferred from DataLoader waits "
            "(trace has no ProfilerStep spans)",
            "gpu_activity": "span of all GPU activity (trace has no ProfilerStep spans)",
            "all_events": "span of all events (no ProfilerStep spans, no GPU activity)",
        }[self.basis]


@trace_view
def window(trace: RankTrace) -> Window:
    steps = trace.steps
    if len(steps) and "partial" in steps and not steps["partial"].all():
        steps = steps[~steps["partial"].to_numpy()]  # a step cut short is no step: the window is the complete ones
    if len(steps):
        inferred = "inferred" in steps and bool(steps["inferred"].any())
        return Window(int(steps["start_ns"].min()), int(steps["end_ns"].max()),
                      "inferred_steps" if inferred else "profiler_steps")
    gpu = trace.gpu_events
    if len(gpu):
        return Window(int(gpu["ts_ns"].min()), int(gpu["end_ns"].max()), "gpu_activity")
    ev = trace.events
    if len(ev):
        return Window(int(ev["ts_ns"].min()), int(ev["end_ns"].max()), "all_events")
    mem = trace.memory
    return Window(int(mem["ts_ns"].min()), int(mem["ts_ns"].max()), "all_events")


def _set(frame: pd.DataFrame, w: Window) -> iv.Intervals:
    return iv.clip(iv.union(frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy()), w.start_ns, w.end_ns)


def category_mask(frame: pd.DataFrame, column: str, keep: Callable[[Any], bool]) -> np.ndarray:
    """Rows whose categorical ``column`` holds a category ``keep`` accepts: each category tested once, the rows
    compared on their codes."""
    cat = frame[column].cat
    return codes_in(np.asarray(cat.codes), [i for i, c in enumerate(cat.categories) if keep(c)])


def kind_mask(frame: pd.DataFrame, kinds: tuple[str, ...] | list[str]) -> np.ndarray:
    """Rows whose ``kind`` is one of ``kinds``."""
    return category_mask(frame, "kind", lambda k: k in kinds)


def codes_in(codes: np.ndarray, wanted: list[int]) -> np.ndarray:
    """``np.isin(codes, wanted)`` for a categorical's codes (-1: missing, never wanted), in one pass: a few
    equality tests, or a lookup table for more (``isin`` sorts or masks, 5 ms on 700k int8 codes, where
    three equality tests take 0.1 ms)."""
    if len(wanted) <= 4:
        out = np.zeros(len(codes), dtype=bool)
        for c in wanted:
            out |= codes == c
        return out
    table = np.zeros(max(wanted) + 2, dtype=bool)  # the last slot: codes past the largest wanted, and -1
    table[wanted] = True
    return table.take(np.minimum(codes, len(table) - 1, dtype=np.intp), mode="wrap")


def name_mask(frame: pd.DataFrame, pattern: re.Pattern[str] | None = None, names: frozenset[str] | None = None,
              *, search: bool = False) -> np.ndarray:
    """Rows whose ``name`` matches ``pattern`` (at the start; anywhere with ``search``) or is one of
    ``names``, tested once per distinct name."""
    test = (pattern.search if search else pattern.match) if pattern is not None else None
    return category_mask(frame, "name", lambda n: (test is not None and bool(test(n)))
                         or (names is not None and n in names))


@trace_view
def runtime_calls(trace: RankTrace) -> pd.DataFrame:
    """CUDA/HIP runtime and driver calls on the host."""
    return trace.events[kind_mask(trace.events, ("runtime", "driver"))]


@trace_view
def kernels(trace: RankTrace) -> pd.DataFrame:
    """Kernels of ``gpu_work``."""
    work = gpu_work(trace)
    return work[kind_mask(work, ("kernel",))]


@trace_view
def gpu_work(trace: RankTrace) -> pd.DataFrame:
    """Kernels, copies and memsets with a device and stream, sorted by start."""
    gpu = trace.gpu_events
    gpu = gpu[gpu["device"].notna()]
    return gpu.assign(device=gpu["device"].astype(np.int64), stream=gpu["stream"].fillna(-1).astype(np.int64))


@trace_view
def device_busy(trace: RankTrace) -> dict[int, iv.Intervals]:
    """Per device: union of all its streams' work, clipped to the window."""
    w = window(trace)
    return {int(d): _set(g, w) for d, g in gpu_work(trace).groupby("device", sort=True)}


@trace_view
def any_gpu_busy(trace: RankTrace) -> iv.Intervals:
    gpu = gpu_work(trace)
    return _set(gpu, window(trace)) if len(gpu) else iv.EMPTY


def _tid_mask(frame: pd.DataFrame, tids: set[str] | frozenset[str]) -> np.ndarray:
    """Rows whose thread is one of ``tids``."""
    return category_mask(frame, "tid", lambda t: str(t) in tids)


@trace_view
def all_loader_spans(trace: RankTrace) -> pd.DataFrame:
    """``enumerate(DataLoader)#…`` spans on any thread (a prefetch thread's ``next()`` included)."""
    ev = trace.events
    return ev[name_mask(ev, LOADER_RE) & ~kind_mask(ev, ("gpu_annotation",))]


def loader_roles(trace: RankTrace) -> dict[int, str]:
    """Each DataLoader's role as the capture decided it when the run ended (the manifest's ``loop.loaders``), else as
    its marks in this trace say: "train", "eval" or "unknown"; {} for a trace without the capture's marks."""
    loop = (trace.meta.capture or {}).get("loop") or {}
    roles: dict[int, str] = {}
    for entry in loop.get("loaders") or []:
        if isinstance(entry, dict) and isinstance(entry.get("loader"), int) and isinstance(entry.get("role"), str):
            roles[entry["loader"]] = entry["role"]
    marks = trace.marks
    waits = marks[(marks["name"] == "kinetoscope::data_wait").to_numpy()] if len(marks) else marks
    for loader, role in zip(waits["loader"], waits["role"], strict=False):
        if loader is not pd.NA and not pd.isna(loader) and int(loader) not in roles and isinstance(role, str):
            roles[int(loader)] = role
    return roles


@trace_view
def other_role_waits(trace: RankTrace) -> pd.DataFrame:
    """The capture's data-wait marks of loaders that are not the training loop's (validation, evaluation), and of
    batches the capture saw taken for evaluation from any loader (an evaluator over the training loader): their
    waits are no training data wait."""
    marks = trace.marks
    if marks.empty:
        return trace.events.iloc[0:0]
    roles = loader_roles(trace)
    waits = marks[(marks["name"] == "kinetoscope::data_wait").to_numpy()]
    other = np.asarray([roles.get(int(x)) == "eval" if not pd.isna(x) else False for x in waits["loader"]], dtype=bool)
    if "evaluation" in waits:
        other |= waits["evaluation"].fillna(False).to_numpy(dtype=bool)
    return trace.events.iloc[waits["row"].to_numpy()[other]]


@trace_view
def loader_spans(trace: RankTrace) -> pd.DataFrame:
    """The training loop's waits for data: DataLoader spans on the training thread only, and - where the capture
    marked which loader each wait was for - only the training loader's (a validation loader's waits are not)."""
    spans = all_loader_spans(trace)
    tid = main_thread(trace)
    if tid is None or spans.empty:
        return spans.iloc[0:0]
    spans = spans[_tid_mask(spans, {tid})]
    # mostly inside another loader's wait (not training), inside the capture's record of workers stopping (the
    # next() that ended a non-persistent iterator shuts its workers down: worker_respawn's time, no wait for data),
    # or a multi-process iterator's first batch (one worker loads it while the others start, whatever their number:
    # start-up, which no worker count removes)
    for other in (other_role_waits(trace), _workers_stopping(trace), _first_batches(trace)):
        if len(other) and len(spans):
            marked = iv.union(other["ts_ns"].to_numpy(), other["end_ns"].to_numpy())
            inside = iv.overlap_each(spans["ts_ns"].to_numpy(), spans["end_ns"].to_numpy(), marked)
            spans = spans[inside < spans["dur_ns"].to_numpy() / 2]
    return spans


def _first_batches(trace: RankTrace) -> pd.DataFrame:
    """The capture's data-wait marks of a multi-process iterator's first batch (batch 0 of a loader with workers, as
    the manifest describes it), where the capture timed the workers' starts (a capture before that, or a trace from
    elsewhere: none)."""
    marks = trace.marks
    loop = (trace.meta.capture or {}).get("loop") or {}
    if marks.empty or "workers" not in (loop.get("recorded") or []):
        return trace.events.iloc[0:0]
    multi = {x.get("loader") for x in loop.get("loaders") or [] if isinstance(x, dict)
             and isinstance(x.get("num_workers"), int) and x["num_workers"] > 0}
    if not multi:
        return trace.events.iloc[0:0]
    first = ((marks["batch"] == 0).fillna(False).to_numpy(dtype=bool)
             & marks["loader"].isin(list(multi)).fillna(False).to_numpy(dtype=bool))
    return _mark_events(trace, "kinetoscope::data_wait", first)


def worker_starts_ns(trace: RankTrace) -> np.ndarray:
    """When each start of the training loader's worker processes that the capture marked ended (ns, sorted; none
    where the capture recorded no loader's role, and in a trace from elsewhere): batches after it come from new
    workers (was: any loader's, so a validation loader's workers starting made the training loader's stalled batch
    untimed)."""
    marks = trace.marks
    training = [loader for loader, role in loader_roles(trace).items() if role == "train"]
    if marks.empty or not training:
        return np.zeros(0, dtype=np.int64)
    starts = _mark_events(trace, "kinetoscope::workers_start",
                          marks["loader"].isin(training).fillna(False).to_numpy(dtype=bool))
    return np.sort(starts["end_ns"].to_numpy(np.int64))


def batches_left(trace: RankTrace, starts_ns: np.ndarray, ends_ns: np.ndarray) -> np.ndarray:
    """For each wait [``starts_ns``, ``ends_ns``], how many batches its iterator still had to hand out after the one
    it took, from the capture's data-wait marks (a batch's index within its iterator, and the ``next()`` that ended
    the iterator, whose index is the iterator's batch count); NaN where no mark covers the wait or its iterator's end
    is not in the trace."""
    out = np.full(len(starts_ns), np.nan)
    marks = trace.marks
    if marks.empty or not len(starts_ns):
        return out
    waits = marks[(marks["name"] == "kinetoscope::data_wait").to_numpy()]
    if waits.empty:
        return out
    ev = trace.events.iloc[waits["row"].to_numpy()]
    frame = pd.DataFrame({"ts": ev["ts_ns"].to_numpy(np.int64), "end": ev["end_ns"].to_numpy(np.int64),
                          "loader": waits["loader"].to_numpy(), "batch": waits["batch"].to_numpy(),
                          "exhausted": waits["exhausted"].fillna(False).to_numpy(dtype=bool)}).sort_values("ts")
    frame["left"] = np.nan
    for _, group in frame.groupby("loader", dropna=True, sort=False):
        batch = pd.to_numeric(group["batch"], errors="coerce").to_numpy(float)
        # an iterator runs from a batch 0 to the next one; its end is the mark of the next() that ended it
        era = np.cumsum(np.r_[True, batch[1:] <= batch[:-1]] | np.isnan(batch))
        for e in np.unique(era):
            rows = np.flatnonzero(era == e)
            ended = group["exhausted"].to_numpy()[rows]
            if ended.any():
                count = batch[rows[np.flatnonzero(ended)[0]]]
                frame.loc[group.index[rows], "left"] = count - batch[rows] - 1
    ts, end, left = frame["ts"].to_numpy(), frame["end"].to_numpy(), frame["left"].to_numpy(float)
    mid = (np.asarray(starts_ns, dtype=np.int64) + np.asarray(ends_ns, dtype=np.int64)) // 2
    at = np.searchsorted(ts, mid, side="right") - 1
    inside = (at >= 0) & (end[np.maximum(at, 0)] >= mid)
    out[inside] = left[at[inside]]
    return out


def _workers_stopping(trace: RankTrace) -> pd.DataFrame:
    return _mark_events(trace, "kinetoscope::workers_stop")


def _mark_events(trace: RankTrace, name: str, also: np.ndarray | None = None) -> pd.DataFrame:
    """The events of the capture's marks named ``name`` (and, per mark, ``also``)."""
    marks = trace.marks
    if marks.empty:
        return trace.events.iloc[0:0]
    pick = (marks["name"] == name).to_numpy()
    return trace.events.iloc[marks["row"].to_numpy()[pick & also if also is not None else pick]]


@trace_view
def other_loader_spans(trace: RankTrace) -> pd.DataFrame:
    """DataLoader spans that are not the training loop's waits: on other threads (prefetchers), or - where the
    capture marked them - a validation loader's."""
    spans = all_loader_spans(trace)
    return spans[~spans.index.isin(loader_spans(trace).index)]


@trace_view
def launches(trace: RankTrace) -> pd.DataFrame:
    """Runtime/driver calls that put work on the GPU: their correlation id names recorded GPU work,
    or they replay a graph (whose kernels may not be recorded)."""
    calls = runtime_calls(trace)
    work_corr = gpu_work(trace)["correlation"].dropna().to_numpy(np.int64)
    corr = calls["correlation"]
    matched = corr.notna().to_numpy() & np.isin(corr.fillna(-1).to_numpy(np.int64), work_corr)
    return calls[matched | name_mask(calls, GRAPH_LAUNCH_RE)]


@trace_view
def launching_threads(trace: RankTrace) -> frozenset[str]:
    """Threads that launch GPU work (the training thread, autograd's backward threads, ...)."""
    threads = {str(t) for t in launches(trace)["tid"].unique()}
    tid = main_thread(trace)
    if tid is not None and trace.has_gpu:
        threads.add(tid)
    return frozenset(threads)


@trace_view
def sync_calls(trace: RankTrace) -> pd.DataFrame:
    """Synchronising calls on threads that launch GPU work (a sync on an unrelated thread does not
    stall the launch queue): ``cuda*``/``hip*``/``cu*`` syncs, blocking copies, frees, ``.item()``. On a run
    with GPU work, an ``.item()`` that makes no runtime call (a CPU tensor's value) waits for nothing."""
    ev = trace.events
    is_runtime = kind_mask(ev, ("runtime", "driver"))
    is_item = kind_mask(ev, ("cpu_op",)) & name_mask(ev, names=SYNC_OP_NAMES)
    if trace.has_gpu and is_item.any():
        is_item &= _holds_a_call(ev, is_item, is_runtime)
    is_sync = (is_runtime & name_mask(ev, SYNC_RUNTIME_RE)) | is_item
    threads = launching_threads(trace)
    if threads:
        is_sync &= _tid_mask(ev, threads)
    return ev[is_sync]


def _holds_a_call(ev: pd.DataFrame, outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """For each row: whether it is an ``outer`` row with an ``inner`` row of its thread starting inside it."""
    out = np.zeros(len(ev), dtype=bool)
    tids = ev["tid"].astype(str).to_numpy()
    ts, end = ev["ts_ns"].to_numpy(), ev["end_ns"].to_numpy()
    for tid in np.unique(tids[outer]):
        starts = np.sort(ts[inner & (tids == tid)])
        rows = np.flatnonzero(outer & (tids == tid))
        first = np.searchsorted(starts, ts[rows], side="left")
        out[rows] = (first < len(starts)) & (starts[np.minimum(first, max(len(starts) - 1, 0))] <= end[rows]) \
            if len(starts) else False
    return out


@dataclass(frozen=True)
class HostWork:
    """What the launching threads were doing, as disjoint interval sets clipped to the window."""

    #: long CPU ops that launch little for their length: CPU-bound op work
    compute: iv.Intervals
    #: the rest of their traced ops and runtime calls: launch overhead
    launch: iv.Intervals


#: a top-level op that launches nothing and runs this long is CPU work, not dispatch overhead ...
COMPUTE_MIN_NS = 100_000
#: ... and so is one spending this much host time per GPU launch inside it (an eager op costs ~10-50 us
#: of host time per kernel it launches; past 250 us the op is doing work of its own on the CPU)
COMPUTE_NS_PER_LAUNCH = 250_000
#: record_function ranges that 2021 traces file as ops: containers of work, never work themselves
CONTAINER_RE = re.compile(r"^(ProfilerStep#|Optimizer\.(step|zero_grad)#|enumerate\(|## )")


@trace_view
def host_work(trace: RankTrace) -> HostWork:
    ev = trace.events
    w = window(trace)
    threads = launching_threads(trace)
    on = _tid_mask(ev, threads) if threads else np.zeros(len(ev), dtype=bool)
    work = on & kind_mask(ev, ("cpu_op", "runtime", "driver"))
    busy = iv.clip(iv.union(ev["ts_ns"].to_numpy()[work], ev["end_ns"].to_numpy()[work]), w.start_ns, w.end_ns)
    launch = launches(trace)
    compute_s: list[np.ndarray] = []
    compute_e: list[np.ndarray] = []
    ops = ev[on & kind_mask(ev, ("cpu_op",)) & ~name_mask(ev, CONTAINER_RE)]
    for tid, group in ops.groupby(ops["tid"].astype(str), sort=False, observed=True):
        tops = top_level(group)
        mine = np.sort(launch["ts_ns"].to_numpy()[_tid_mask(launch, {tid})])
        inside = np.searchsorted(mine, tops["end_ns"].to_numpy()) - np.searchsorted(mine, tops["ts_ns"].to_numpy())
        heavy = tops["dur_ns"].to_numpy() >= np.where(inside > 0, COMPUTE_NS_PER_LAUNCH * inside, COMPUTE_MIN_NS)
        compute_s.append(tops["ts_ns"].to_numpy()[heavy])
        compute_e.append(tops["end_ns"].to_numpy()[heavy])
    compute = iv.union(np.concatenate(compute_s), np.concatenate(compute_e)) if compute_s else iv.EMPTY
    compute = iv.clip(compute, w.start_ns, w.end_ns)
    return HostWork(compute=compute, launch=iv.subtract(busy, compute))


def host_busy(trace: RankTrace) -> iv.Intervals:
    """Launching threads busy in any traced op or runtime call."""
    hw = host_work(trace)
    return iv.union(np.concatenate((hw.compute[0], hw.launch[0])), np.concatenate((hw.compute[1], hw.launch[1])))


@trace_view
def launch_queue(trace: RankTrace) -> pd.DataFrame:
    """Per kernel launched by its own call (graph replays excluded): device, start, duration, and how
    long after its launch call returned it started. A kernel that starts as soon as it is launched
    found the GPU's queue empty: the GPU was waiting for the host."""
    work = gpu_work(trace)
    k = work[(work["kind"] == "kernel").to_numpy() & work["correlation"].notna().to_numpy()]
    calls = launches(trace)
    calls = calls[calls["correlation"].notna().to_numpy() & ~name_mask(calls, GRAPH_LAUNCH_RE)]
    calls = calls.drop_duplicates("correlation")
    keys = calls["correlation"].to_numpy(np.int64)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    call_ts, call_end = calls["ts_ns"].to_numpy()[order], calls["end_ns"].to_numpy()[order]
    corr = k["correlation"].to_numpy(np.int64)
    # one kernel per call (a graph's kernels share one correlation and are left out above)
    single = ~pd.Series(corr).duplicated(keep=False).to_numpy()
    pos = np.minimum(np.searchsorted(keys, corr), max(len(keys) - 1, 0))
    found = single & (keys[pos] == corr) if len(keys) else np.zeros(len(k), dtype=bool)
    return pd.DataFrame({
        "device": k["device"].to_numpy()[found],
        "ts_ns": k["ts_ns"].to_numpy()[found],
        "dur_ns": k["dur_ns"].to_numpy()[found],
        "launch_ts_ns": call_ts[pos[found]],
        "delay_ns": k["ts_ns"].to_numpy()[found] - call_end[pos[found]],
    })


@trace_view
def pending_work(trace: RankTrace) -> iv.Intervals:
    """When launched GPU work was queued but not yet running: from its launch call's return to its start."""
    work = gpu_work(trace)
    calls = launches(trace)
    calls = calls[calls["correlation"].notna().to_numpy()].drop_duplicates("correlation")
    keys = calls["correlation"].to_numpy(np.int64)
    order = np.argsort(keys, kind="stable")
    keys, call_end = keys[order], calls["end_ns"].to_numpy()[order]
    has = work["correlation"].notna().to_numpy()
    corr = work["correlation"].fillna(0).to_numpy(np.int64)
    if not len(keys):
        return iv.EMPTY
    pos = np.minimum(np.searchsorted(keys, corr), len(keys) - 1)
    found = has & (keys[pos] == corr)
    start = call_end[pos[found]]
    end = work["ts_ns"].to_numpy()[found]
    return iv.union(start, end)


#: a runtime call this long with the GPU idle throughout is start-up work (context creation, lazy module
#: loading, cuDNN/JIT first use), not steady-state launching: a launch costs microseconds
STARTUP_CALL_NS = 1_000_000


#: device memory allocated and freed by the runtime (the caching allocator's misses, empty_cache, an allocator
#: bypassed): cudaFree/hipFree synchronise the device
ALLOCATOR_RE = re.compile(r"^(cuda|hip)(Malloc|MallocAsync|MallocManaged|MallocHost|HostAlloc|Free|FreeAsync|FreeHost|"
                          r"HostFree)$|^cuMem(Alloc|Free|AllocHost|FreeHost|AllocAsync|FreeAsync)(_v2)?$")


@trace_view
def allocator_calls(trace: RankTrace) -> pd.DataFrame:
    """Device mallocs and frees on the threads that launch GPU work, in the window."""
    w = window(trace)
    calls = runtime_calls(trace)
    calls = calls[name_mask(calls, ALLOCATOR_RE) & (calls["end_ns"] > w.start_ns).to_numpy()
                  & (calls["ts_ns"] < w.end_ns).to_numpy()]
    threads = launching_threads(trace)
    return calls[_tid_mask(calls, threads)] if threads else calls


def recurring_allocator_calls(trace: RankTrace) -> pd.DataFrame:
    """Allocator calls in steps where they recur: at least two steps of the window hold some (one step's
    allocations are that step's start-up)."""
    calls = allocator_calls(trace)
    if calls.empty or not len(trace.steps):
        return calls.iloc[0:0]
    step = step_at(trace, calls["ts_ns"].to_numpy())
    return calls[step >= 0] if len(np.unique(step[step >= 0])) >= 2 else calls.iloc[0:0]


@trace_view
def startup_calls(trace: RankTrace) -> pd.DataFrame:
    """Runtime/driver calls of at least STARTUP_CALL_NS in the window during which no GPU work ran; device
    mallocs and frees that recur step after step are no start-up (see ``recurring_allocator_calls``)."""
    w = window(trace)
    calls = runtime_calls(trace)
    calls = calls[((calls["dur_ns"] >= STARTUP_CALL_NS) & (calls["end_ns"] > w.start_ns)
                   & (calls["ts_ns"] < w.end_ns)).to_numpy()]
    if calls.empty:
        return calls
    calls = calls[~calls.index.isin(recurring_allocator_calls(trace).index)]
    busy = iv.overlap_each(calls["ts_ns"].to_numpy(), calls["end_ns"].to_numpy(), any_gpu_busy(trace))
    return calls[busy == 0]


@trace_view
def main_thread(trace: RankTrace) -> str | None:
    """The training loop's thread: the one holding the ProfilerStep spans, else the busiest launcher."""
    if len(trace.steps):
        return str(trace.steps["tid"].mode().iloc[0])
    ev = trace.events
    launches = runtime_calls(trace)
    pool = launches if len(launches) else ev[kind_mask(ev, ("cpu_op",))]
    if pool.empty:
        return None
    return str(pool["tid"].astype(str).value_counts().index[0])


def top_level(frame: pd.DataFrame) -> pd.DataFrame:
    """Events of one thread not nested inside another of them (sorted by start, longest first)."""
    if frame.empty:
        return frame
    ts, ends = frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy()
    order = None
    if len(ts) > 1 and (ts[1:] < ts[:-1]).any():  # the tables are time-ordered: this sorts other frames only
        order = np.lexsort((-frame["dur_ns"].to_numpy(), ts))  # by start, longest first at equal starts (stable)
        ts, ends = ts[order], ends[order]
    # of the events starting together, the longest (the first of equals) is the one that can be top level, when it
    # ends after everything that started before
    first = np.flatnonzero(np.concatenate(([True], ts[1:] != ts[:-1])))
    group_end = np.maximum.reduceat(ends, first)
    group = np.repeat(np.arange(len(first)), np.diff(np.append(first, len(ts))))
    longest = np.flatnonzero(ends == group_end[group])
    longest = longest[np.concatenate(([True], group[longest[1:]] != group[longest[:-1]]))]  # one per group
    prior_max = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(group_end)[:-1]))
    kept = longest[group_end > prior_max]
    return frame.iloc[kept if order is None else order[kept]]


def intervals_of(frame: pd.DataFrame, w: Window) -> iv.Intervals:
    return _set(frame, w)


def step_at(trace: RankTrace, ts_ns: np.ndarray) -> np.ndarray:
    """The ProfilerStep number containing each time, or -1."""
    steps = trace.steps
    ts_ns = np.asarray(ts_ns, dtype=np.int64)
    if steps.empty:
        return np.full(ts_ns.shape, -1, dtype=np.int64)
    starts = steps["start_ns"].to_numpy()
    idx = np.searchsorted(starts, ts_ns, side="right") - 1
    ok = (idx >= 0) & (ts_ns < steps["end_ns"].to_numpy()[np.maximum(idx, 0)])
    return np.where(ok, steps["step"].to_numpy()[np.maximum(idx, 0)], -1)


@trace_view
def python_frames(trace: RankTrace) -> pd.DataFrame:
    """Python stack frames (``with_stack=True``: ``python_function`` events) on the threads that launch GPU work
    (else the training thread): what the host's Python was running, traced."""
    ev = trace.events
    threads = set(launching_threads(trace))
    tid = main_thread(trace)
    if tid is not None:
        threads.add(tid)
    frames = ev[kind_mask(ev, ("python",)) & _tid_mask(ev, frozenset(threads))]
    return frames[["ts_ns", "dur_ns", "end_ns", "name", "tid"]]


#: a frame holding this share of the time looked at wraps everything (``<module>``, a training function): it names
#: nothing in particular
_HOTSPOT_WRAPS_ALL = 0.9
#: a frame holding less than this share is not among what the host was doing
_HOTSPOT_MIN_SHARE = 0.05


def python_hotspots(frames: pd.DataFrame, at: iv.Intervals, top: int = 3) -> list[dict[str, Any]]:
    """What the host's Python was doing during ``at``: the frames holding the most of that time (at least 5% of it),
    leaving out those that wrap nearly all of it and those inside a frame already named, most time first:
    ``[{"function", "time_us", "share"}]`` (share of ``at``)."""
    total = iv.measure(at)
    if frames.empty or total == 0:
        return []
    inside = iv.overlap_each(frames["ts_ns"].to_numpy(), frames["end_ns"].to_numpy(), at)
    keep = inside > 0
    f = frames[keep]
    inside = inside[keep]
    order = np.lexsort((-f["dur_ns"].to_numpy(), f["ts_ns"].to_numpy(), f["tid"].astype(str).to_numpy()))
    ts, end = f["ts_ns"].to_numpy()[order], f["end_ns"].to_numpy()[order]
    tids, names = f["tid"].astype(str).to_numpy()[order], f["name"].astype(str).to_numpy()[order]
    inside = inside[order]
    parent = np.full(len(ts), -1, dtype=np.int64)
    stack: list[int] = []
    for i in range(len(ts)):  # frames nest on their thread: each one's caller is the innermost open frame
        while stack and (tids[stack[-1]] != tids[i] or end[stack[-1]] < end[i]):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    by_name: dict[str, float] = {}
    for name, t in zip(names, inside, strict=False):
        by_name[name] = by_name.get(name, 0) + t
    chosen: list[str] = []
    for name, t in sorted(by_name.items(), key=lambda kv: -kv[1]):
        if len(chosen) == top or t < _HOTSPOT_MIN_SHARE * total:
            break
        if t >= _HOTSPOT_WRAPS_ALL * total:
            continue
        rows = np.flatnonzero(names == name)
        nested = False
        for r in rows[:64]:  # is this frame called from inside one already named?
            p = parent[r]
            while p >= 0 and not nested:
                nested = names[p] in chosen
                p = parent[p]
        if not nested:
            chosen.append(name)
    return [{"function": n, "time_us": us(by_name[n]), "share": round(by_name[n] / total, 4)} for n in chosen]


def cpu_shares(trace: RankTrace) -> tuple[float | None, float | None]:
    """(CPU cores' worth of work the loading did per ns of wait, the process's CPU per ns of step outside
    the wait), from the capture's per-step process CPU time; None where not recorded."""
    rs = trace.run_steps
    if rs is None or "cpu_ns" not in rs or rs["cpu_ns"].isna().all():
        return None, None
    rs = rs.iloc[1:] if len(rs) > 2 else rs  # the first step carries start-up work
    wait, wait_cpu = rs["data_wait_ns"].to_numpy(float), rs["data_wait_cpu_ns"].to_numpy(float)
    wall, cpu = rs["wall_ns"].to_numpy(float), rs["cpu_ns"].to_numpy(float)
    load = float(np.nansum(wait_cpu) / np.nansum(wait)) if np.nansum(wait) > 0 else None
    rest = wall - wait
    comp = float(np.nansum(cpu - wait_cpu) / np.nansum(rest)) if np.nansum(rest) > 0 else None
    return load, comp


def wait_cpu_share(trace: RankTrace) -> tuple[float | None, bool]:
    """The CPU the loop itself spent per ns of its data waits, over the run's steps after the first, and whether it
    is the training thread's own (the capture records it apart: its work taking each batch over) rather than the
    process's (every thread, a pin-memory thread's too: captures before the thread's was recorded); None where
    neither is recorded."""
    if _thread_wait_cpu_recorded(trace):
        return _thread_wait_cpu(trace, training_only=False), True
    return cpu_shares(trace)[0], False


def _thread_wait_cpu_recorded(trace: RankTrace) -> bool:
    rs = trace.run_steps
    return rs is not None and "data_wait_thread_cpu_ns" in rs and not rs["data_wait_thread_cpu_ns"].isna().all()


def _thread_wait_cpu(trace: RankTrace, *, training_only: bool) -> float | None:
    """The training thread's CPU per ns of its data waits (the capture's per-step times) over the run's steps after
    the first; ``training_only``: only those holding no evaluation (no validation time, no evaluation loader's wait).
    None where no such step waited, or the steps are not recorded."""
    rs = trace.run_steps
    if rs is None:
        return None
    rs = rs.iloc[1:] if len(rs) > 2 else rs
    keep = np.ones(len(rs), dtype=bool)
    if training_only:
        for column in ("validation_ns", "eval_data_wait_ns"):
            if column in rs:
                keep &= rs[column].fillna(0).to_numpy(np.float64) == 0
    wait = rs["data_wait_ns"].to_numpy(np.float64)[keep]
    cpu = rs["data_wait_thread_cpu_ns"].to_numpy(np.float64)[keep]
    known = ~np.isnan(cpu)
    total = float(wait[known].sum())
    return float(cpu[known].sum()) / total if total > 0 else None


def in_memory_dataset(trace: RankTrace) -> str | None:
    """Where a training loader with workers serves a dataset whose items are rows of tensors (or NumPy arrays) it
    holds in memory, as the capture read the dataset object: "tensor_rows" (a ``TensorDataset``: an item is its rows
    and nothing else, so the whole batch can be indexed at once in the training process, with no worker to hand it
    over) or "custom" (a class of its own holding such tensors, whose ``__getitem__``'s per-item work the capture does
    not know); None where not, or not recorded (a trace from elsewhere: its workers are not in it), or where the
    loader's ``collate_fn`` is its own (per-batch work of its own the workers do: tokenising, padding; captures before
    the collate was recorded leave it unknown, and are read as PyTorch's)."""
    dl = (trace.meta.capture or {}).get("dataloader") or {}
    workers, tensors, getitem = dl.get("num_workers"), dl.get("dataset_tensors"), dl.get("dataset_getitem")
    if (not isinstance(workers, int) or isinstance(workers, bool) or workers <= 0
            or not isinstance(tensors, int) or isinstance(tensors, bool) or tensors < 1
            or dl.get("collate") == "custom"):
        return None
    return getitem if getitem in ("tensor_rows", "custom") else None


def batch_at_once(trace: RankTrace, waits_ns: np.ndarray) -> str | None:
    """Where the training loop's batches from workers can be indexed at once in the training process instead: the
    workers serve a ``TensorDataset`` ("tensor_rows"), or a dataset class of its own holding its rows in memory
    ("custom") whose waits are not the workers' own work: the hand-over of ready batches (``handover_waits``), or
    workers mostly idle (their CPU under ``WORKERS_BUSY_MIN_SHARE`` of the time a batch takes them: with the rows in
    memory there is no storage to wait for, so the loop waits on taking batches over, or on workers waiting for a CPU
    its own process could use - was: the hand-over only, so a loop waiting 1.0 ms of a 4.5 ms step on a worker 8%
    busy over in-memory arrays, 1.4 times the probe's hand-over, was told more workers would not help, at
    information; two readers and their consensus: index the batch at once, a warning); None otherwise. The one test
    the loader's advice and its replay (``whatif.fixes.plan_loader``) both ask."""
    kind = in_memory_dataset(trace)
    if kind == "tensor_rows":
        return kind
    if kind == "custom":
        busy = workers_busy_share(trace)
        if handover_waits(trace, waits_ns) or (busy is not None and busy < WORKERS_BUSY_MIN_SHARE):
            return kind
    return None


#: a wait is per-item indexing of in-memory tensors when its batch is built from at least this many ``aten::select``
#: calls (one per item per tensor: a TensorDataset's ``__getitem__``) ...
PER_ITEM_MIN_SELECTS = 16
#: ... and the indexing and the collate's stack/cat hold at least this share of the waits (the rest is the Python
#: around them, per item): loading that decodes, augments or reads files is something else
PER_ITEM_MIN_SHARE = 0.3
_INDEXING = frozenset({"aten::select", "aten::unsqueeze", "aten::as_strided", "aten::slice", "aten::stack",
                       "aten::cat"})
_COLLATE = frozenset({"aten::stack", "aten::cat"})


#: ... or, where the indexing alone is less, torch's operators (``aten::``) hold at least this share of the waits: each
#: item's rows indexed and then worked on by tensor operators (noise added, scaled, cast), work that runs on the whole
#: batch as well as on one item, with the Python around each item gone
PER_ITEM_TENSOR_MIN_SHARE = 0.5
_ATEN_RE = re.compile(r"^aten::")


#: ... or, where the items are not indexed out of tensors (an image stored as bytes in memory, made a PIL image, then
#: ToTensor and Normalize: no ``aten::select``), operators called once per item (as many times as the batch has items,
#: or more) hold at least this share of the waits, and the dataset's tensors hold the batch's content (per item, at
#: least a fifth of the bytes of the batch the capture's probe handed over: uint8 pixels become float32, four times
#: their bytes, and labels the dataset may keep as Python numbers add to the batch's): each
#: item converted from memory one at a time, the Python around each conversion in the rest of the wait. Not file
#: reads or decoding (the content is in memory), and not a per-batch operator (called fewer times than the items)
PER_ITEM_TRANSFORM_MIN_SHARE = 0.2
#: bytes a dataset holds per item, at least, against a batch's bytes per item, for its content to be in memory
IN_MEMORY_MIN_BYTES_RATIO = 0.2


#: operators that index or collate a batch, or hand one over: never a conversion of an item, however often called
_NOT_CONVERSION = _INDEXING | frozenset({"aten::pin_memory", "aten::_pin_memory", "aten::set_", "aten::copy_"})


def _per_item_ops(trace: RankTrace, starts: np.ndarray, ends: np.ndarray, per_item_min: int = PER_ITEM_MIN_SELECTS,
                  never_per_item: frozenset[str] = frozenset()) -> tuple[np.ndarray, ...] | None:
    """Per wait (``starts``/``ends``) on the training thread, from its torch operators that no other operator holds
    (a collate's ``pad_sequence`` holds its own selects): its ``aten::select`` count, the time its indexing operators
    cover, the time those called once a batch cover (fewer than ``PER_ITEM_MIN_SELECTS`` times in the wait: the
    collate's stack, a ``pin_memory``, a cast - what building the batch at once still does) and the time those called
    per item cover (ns); None where the thread or its operators are not known."""
    tid = main_thread(trace)
    if tid is None or not len(starts):
        return None
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & _tid_mask(ev, {tid}) & name_mask(ev, _ATEN_RE)]
    if ops.empty:
        return None
    # outer operators first where two start together, so that the inner one reads as held
    ops = ops.assign(_neg=-ops["dur_ns"].to_numpy(np.int64)).sort_values(["ts_ns", "_neg"], kind="stable")
    names = ops["name"].astype(str).to_numpy()
    o_start, o_end = ops["ts_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    # held: inside an operator that started before it (ends by the latest end so far)
    reach = np.maximum.accumulate(o_end)
    held = np.zeros(len(o_end), bool)
    held[1:] = o_end[1:] <= reach[:-1]
    is_select, is_indexing = names == "aten::select", np.isin(names, list(_INDEXING))
    selects, indexing, per_batch, per_item = (np.zeros(len(starts)) for _ in range(4))
    # each wait's operators by binary search on their starts: one pass over the operators, not one per wait
    lo_at, hi_at = np.searchsorted(o_start, starts, side="left"), np.searchsorted(o_start, ends, side="right")
    for k, (lo, hi) in enumerate(zip(lo_at, hi_at, strict=True)):
        inside = (o_end[lo:hi] <= ends[k]) & ~held[lo:hi]
        s_, e_, n_ = o_start[lo:hi][inside], o_end[lo:hi][inside], names[lo:hi][inside]
        selects[k] = float(is_select[lo:hi][inside].sum())
        i = is_indexing[lo:hi][inside]
        indexing[k] = iv.measure(iv.union(s_[i], e_[i]))
        kinds, counts = np.unique(n_, return_counts=True)
        many = np.isin(n_, kinds[counts >= per_item_min]) & ~np.isin(n_, list(never_per_item))
        per_batch[k] = iv.measure(iv.union(s_[~many], e_[~many]))
        per_item[k] = iv.measure(iv.union(s_[many], e_[many]))
    return selects, indexing, per_batch, per_item


def per_item_batch(trace: RankTrace, starts: np.ndarray, ends: np.ndarray) -> tuple[str, np.ndarray] | None:
    """Where the training loop's data waits (``starts``/``ends``) build each batch item by item from rows of tensors
    in memory: ("indexing", ...) where the per-item work is the indexing (a ``TensorDataset``'s ``__getitem__`` per
    item, then ``default_collate``'s ``torch.stack``), ("tensor_ops", ...) where it is the indexing and then torch's
    operators on each item (a dataset of its own adding noise to its rows: ``PER_ITEM_TENSOR_MIN_SHARE`` of the waits
    in operators called per item), ("transforms", ...) where each item is converted from memory one at a time (an
    image stored in memory made a tensor and normalised per item: ``_per_item_transforms``), ("python", ...) where
    the loop's own ``__getitem__`` builds each item in work the trace does not show as torch's (parsing, tokenising,
    decoding: ``_per_item_python``), with each wait's once-a-batch operators' time (ns: the collate's stack, a
    ``pin_memory``), which building the batch at once still spends; None where none of these. Read from the
    operators the trace recorded inside the waits on the training thread, those no other operator holds. Not
    "tensor_ops" where the capture read the dataset and it holds no tensors (indexing then is of something the loader
    built: a tokenizer's output)."""
    total = float((ends - starts).sum())
    if not total:
        return None
    return _per_item_tensors(trace, starts, ends, total) or _per_item_python(trace, starts, ends, total)


def _per_item_tensors(trace: RankTrace, starts: np.ndarray, ends: np.ndarray,
                      total: float) -> tuple[str, np.ndarray] | None:
    """("indexing" | "tensor_ops" | "transforms", ...) of ``per_item_batch``: the batch built item by item by torch's
    operators on tensors in memory; None where not."""
    found = _per_item_ops(trace, starts, ends)
    if found is None:
        return None
    selects, indexing, per_batch, per_item = found
    if float(selects.mean()) < PER_ITEM_MIN_SELECTS:
        return _per_item_transforms(trace, starts, ends, total)
    if indexing.sum() / total >= PER_ITEM_MIN_SHARE:
        return "indexing", per_batch
    tensors = ((trace.meta.capture or {}).get("dataloader") or {}).get("dataset_tensors")
    if per_item.sum() / total >= PER_ITEM_TENSOR_MIN_SHARE and not (isinstance(tensors, int) and tensors < 1):
        return "tensor_ops", per_batch
    return None


#: a main-process loader's waits are its ``__getitem__``'s own work, item by item on the training thread, where that
#: thread is on a CPU through at least this share of them (the capture's per-step CPU times: computing, not reading a
#: file or waiting for one) ...
PYTHON_PER_ITEM_MIN_CPU = 0.75
#: ... and torch's operators hold under this share of them: the rest is Python (parsing text, building lists,
#: tokenising) or a library's C code (decoding) around them, which the trace does not break down
PYTHON_PER_ITEM_MAX_TORCH = 0.5


def python_judged(trace: RankTrace) -> tuple[int, float] | None:
    """(the batch size, the training thread's CPU share of the training loader's waits) where a batch built item by
    item in ``__getitem__``'s own work can be judged (``_per_item_python``): a loader in the training process of at
    least 2 items a batch over a map-style dataset of its own (``dataset_getitem`` "custom": not a
    ``TensorDataset``, not an iterable dataset, which has no ``__getitem__``), collated by PyTorch's collate (a
    ``collate_fn`` of its own may be where the work is, once a batch), whose waits' CPU on the training thread the
    capture timed in steps holding no evaluation; None where not."""
    dl = (trace.meta.capture or {}).get("dataloader") or {}
    batch = count(dl.get("batch_size"), 2)
    if (count(dl.get("num_workers"), 0) != 0 or batch is None or dl.get("dataset_getitem") != "custom"
            or dl.get("collate") == "custom"):
        return None
    cpu = training_wait_cpu_share(trace)
    return (batch, cpu) if cpu is not None else None


def training_wait_cpu_share(trace: RankTrace) -> float | None:
    """The training thread's CPU per ns of its data waits (the capture's per-step times), over the run's steps after
    the first that hold no evaluation (no validation time, no evaluation loader's wait: their waits are not the
    training loader's; was: over every step, so an evaluation loader's busy waits could make a training loader
    waiting on a file read as computing); None where not recorded, or no such step waited."""
    return _thread_wait_cpu(trace, training_only=True) if _thread_wait_cpu_recorded(trace) else None


def _per_item_python(trace: RankTrace, starts: np.ndarray, ends: np.ndarray,
                     total: float) -> tuple[str, np.ndarray] | None:
    """("python", each wait's once-a-batch operators' time) where a loader in the training process (``python_judged``:
    ``num_workers`` 0, at least 2 items a batch, a map-style dataset of its own, PyTorch's collate) builds each batch
    in its ``__getitem__``, item by item, in work the trace does not show as torch's: the training thread computes
    through ``PYTHON_PER_ITEM_MIN_CPU`` of the training loader's waits or more, and torch's operators hold under
    ``PYTHON_PER_ITEM_MAX_TORCH`` of them. What that work costs done once for the dataset or on the whole batch is
    not in the trace (parsing text once, vectorised, is far cheaper than per item; a random augmentation can only
    move to the batch): the caller's estimate is a bound. Was: only more workers were priced, so a loop parsing a CSV
    line per item through 26% of its window, on a host where a worker's hand-over costs as much, was worth 3%
    (information; two readers and their consensus: a warning). None where not, or not recorded (a trace from
    elsewhere)."""
    judged = python_judged(trace)
    if judged is None or judged[1] < PYTHON_PER_ITEM_MIN_CPU:
        return None
    found = _per_item_ops(trace, starts, ends, per_item_min=judged[0])
    if found is None:  # no torch operator inside at all: nothing once a batch either
        return "python", np.zeros(len(starts))
    _, _, per_batch, per_item = found
    if (per_batch.sum() + per_item.sum()) / total >= PYTHON_PER_ITEM_MAX_TORCH:
        return None
    return "python", per_batch


#: torch's operators that draw random numbers for an item (an augmentation's parameters, noise, dropout); not a
#: sampler's shuffle at an epoch's start (``randperm``, and ``random_`` for its seed)
_RANDOM_RE = re.compile(r"^aten::(?:rand|randn|randint|bernoulli|normal|uniform|multinomial|exponential"
                        r"|geometric|cauchy|log_normal|poisson|rrelu|dropout|native_dropout|feature_dropout)(?:_|\b|$)")


def draws_random(trace: RankTrace, starts: np.ndarray, ends: np.ndarray) -> bool | None:
    """Whether torch drew random numbers on the training thread inside the waits (``starts``/``ends``): an
    augmentation whose parameters torch draws (torchvision's random transforms do); None where the thread is not
    known. Randomness drawn in Python or NumPy leaves no trace here."""
    tid = main_thread(trace)
    if tid is None:
        return None
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & _tid_mask(ev, {tid}) & name_mask(ev, _RANDOM_RE)]
    if ops.empty or not len(starts):
        return False
    at = ops["ts_ns"].to_numpy(np.int64)
    order = np.argsort(starts)
    k = np.searchsorted(starts[order], at, side="right") - 1
    inside = (k >= 0) & (at < ends[order][np.clip(k, 0, None)])
    return bool(inside.any())


def transforms_judged(trace: RankTrace) -> tuple[int, float] | None:
    """(the batch size, the dataset's bytes per item over a batch's per item) where items converted one at a time can
    be judged (``_per_item_transforms``): a loader in the training process (``num_workers`` 0), of at least 2 items a
    batch, whose dataset's bytes and a probed batch's the capture recorded; None where not."""
    dl = (trace.meta.capture or {}).get("dataloader") or {}
    probe = dl.get("handover_probe")
    batch, held, items = count(dl.get("batch_size"), 2), count(dl.get("dataset_tensor_bytes")), count(
        dl.get("dataset_items"))
    batch_bytes = count(probe.get("batch_bytes")) if isinstance(probe, dict) else None
    if count(dl.get("num_workers"), 0) != 0 or batch is None or held is None or items is None or batch_bytes is None:
        return None
    return batch, (held / items) / (batch_bytes / batch)


def _per_item_transforms(trace: RankTrace, starts: np.ndarray, ends: np.ndarray,
                         total: float) -> tuple[str, np.ndarray] | None:
    """("transforms", each wait's once-a-batch operators' time) where each item is converted from memory one at a time
    (``PER_ITEM_TRANSFORM_MIN_SHARE``): operators other than indexing, collating or handing over, called at least once
    per item; None where not, or where it cannot be judged (``transforms_judged``)."""
    judged = transforms_judged(trace)
    tensor_rows = ((trace.meta.capture or {}).get("dataloader") or {}).get("dataset_getitem") == "tensor_rows"
    if judged is None or judged[1] < IN_MEMORY_MIN_BYTES_RATIO or tensor_rows:  # a TensorDataset converts nothing
        return None
    found = _per_item_ops(trace, starts, ends, per_item_min=judged[0], never_per_item=_NOT_CONVERSION)
    if found is None:
        return None
    _, _, per_batch, per_item = found
    return ("transforms", per_batch) if per_item.sum() / total >= PER_ITEM_TRANSFORM_MIN_SHARE else None


#: the process's CPU works through at least this share of a wait for a worker's batch: the wait is the hand-over
#: (unpickling the batch, copying it out of shared memory), not the workers falling behind
HANDOVER_CPU_SHARE = 0.5

#: ... or the loop's median wait is at most this many times the capture's probe of a ready batch's hand-over on this
#: host (``dataloader.handover_probe``): the batches were ready, and what the loop waits is taking them over, round
#: trips with the worker included, through which the loop sits idle part of the time (was: the loop's CPU alone, so
#: a loop idle through 54% of 1.2 ms waits, against a probe of 1.17 ms, read as workers waiting themselves)
HANDOVER_PROBE_RATIO = 1.25


def probed_handover_ns(trace: RankTrace) -> int | None:
    """The capture's probe of a ready batch's hand-over on this host (its median, ns; ``dataloader.handover_probe``),
    None where it did not measure one."""
    probe = ((trace.meta.capture or {}).get("dataloader") or {}).get("handover_probe")
    probed = probe.get("median_ns") if isinstance(probe, dict) else None
    return int(probed) if isinstance(probed, int) and not isinstance(probed, bool) and probed > 0 else None


def waits_as_probed(trace: RankTrace, waits_ns: np.ndarray) -> bool:
    """Whether the loop's waits are the probed hand-over: their median within ``HANDOVER_PROBE_RATIO`` of the probe,
    and, as for ready batches read from the waits alone (``handoff_ns``), under a quarter of them stalls longer than
    twice the probe and half a millisecond (was: the median alone, so waits of 1.2, 1.2 and 30 ms over and over - 10 ms
    a step of stalls - read as the hand-over)."""
    probed = probed_handover_ns(trace)
    waits = np.asarray(waits_ns, dtype=float)
    if probed is None or not len(waits):
        return False
    stalls = float(np.mean(waits > 2.0 * probed + 500_000.0))
    return float(np.median(waits)) <= HANDOVER_PROBE_RATIO * probed and stalls < 0.25


def stall_time_share(waits_ns: np.ndarray, handoff: float) -> float:
    """The share of the waits' time in stalls - waits longer than twice the hand-over and half a millisecond: where
    neither the loop's CPU nor a probe of the hand-over is recorded, the waits alone tell the hand-over by it (was:
    the share of waits that stall, so one 30 ms stall among eleven 0.2 ms hand-overs, 94% of the time waited, read as
    "the workers keep up")."""
    waits = np.asarray(waits_ns, dtype=float)
    total = float(waits.sum())
    return float(waits[waits > 2.0 * handoff + 500_000.0].sum()) / total if total > 0 else 0.0


def handover_waits(trace: RankTrace, waits_ns: np.ndarray) -> bool | None:
    """Whether the loop's waits for batches from worker processes are the hand-over of ready batches: the loop's own
    CPU works through ``HANDOVER_CPU_SHARE`` of them or more, or they are what the capture's probe measured
    (``waits_as_probed``); None where neither the CPU nor a probe is recorded. The one test of it: the loader's
    analysis and its replay both ask here."""
    share, _ = wait_cpu_share(trace)
    if share is not None and share >= HANDOVER_CPU_SHARE:
        return True
    if waits_as_probed(trace, waits_ns):
        return True
    return None if share is None and probed_handover_ns(trace) is None else False


#: DataLoader workers whose CPU per batch is under this share of the time a batch takes them mostly wait - for
#: storage, the network or a CPU, which the trace cannot tell apart - so what more of them gain is a bound
WORKERS_BUSY_MIN_SHARE = 0.25


def workers_cpu_per_step(trace: RankTrace) -> float | None:
    """The DataLoader workers' CPU time per step (ns, the mean over the run's steps after the first: CPU work adds
    up, and the workers' batches land on alternate steps, so a median misses the expensive ones), from the
    capture's reading of their /proc schedstat; None where not recorded."""
    rs = trace.run_steps
    if rs is None or "workers_cpu_ns" not in rs:
        return None
    values = rs["workers_cpu_ns"].to_numpy(float)[1:]
    values = values[~np.isnan(values)]
    return float(np.mean(values)) if len(values) else None


def workers_busy_share(trace: RankTrace) -> float | None:
    """The DataLoader workers' CPU per batch over the time a batch takes them in the steady state (``num_workers``
    of the window's complete steps: each worker makes every num_workers-th batch), from the capture's record of their
    CPU time and the manifest's worker count; under ``WORKERS_BUSY_MIN_SHARE`` they mostly wait themselves. None
    where not known."""
    workers = ((trace.meta.capture or {}).get("dataloader") or {}).get("num_workers")
    wcpu = workers_cpu_per_step(trace)
    steps = trace.steps
    if "partial" in steps and len(steps):
        steps = steps[~steps["partial"].to_numpy(bool)]
    if not isinstance(workers, int) or isinstance(workers, bool) or workers <= 0 or wcpu is None or not len(steps):
        return None
    per_batch = workers * float(steps["dur_ns"].mean())
    return wcpu / per_batch if per_batch > 0 else None


def _profiled_rows(trace: RankTrace) -> pd.DataFrame | None:
    """The capture's step timings of the window's steps (``steps.json`` rows marked profiled), where their numbers
    are the trace's ProfilerStep numbers; None where not recorded or they are not (another window's rows)."""
    rs = trace.run_steps
    if rs is None or "profiled" not in rs:
        return None
    profiled = rs[rs["profiled"].to_numpy(bool)]
    numbers = set(int(x) for x in trace.steps["step"].to_numpy()) if "step" in trace.steps else set()
    if not len(profiled) or not set(int(x) for x in profiled["step"]) <= numbers:
        return None
    return profiled


def steps_workers_idle(trace: RankTrace) -> set[int]:
    """The window's steps (their numbers) through which the DataLoader workers burned no CPU at all, from the
    capture's per-step record of their CPU, where the workers are otherwise busy with their batches
    (``workers_busy_share`` at least ``WORKERS_BUSY_MIN_SHARE``: workers that mostly wait for storage or the network
    may sleep through a step loading one); empty where not recorded, or where the capture's profiled steps are not
    the trace's. A worker idle in a step made no batch then: it had made them, or it waited for something."""
    profiled = _profiled_rows(trace)
    busy = workers_busy_share(trace)
    if profiled is None or "workers_cpu_ns" not in profiled or busy is None or busy < WORKERS_BUSY_MIN_SHARE:
        return set()
    idle = profiled["workers_cpu_ns"].to_numpy(float) == 0.0
    return set(int(x) for x in profiled["step"].to_numpy()[idle])


def steps_taking_over(trace: RankTrace) -> set[int]:
    """The window's steps (their numbers) whose data waits the training thread worked through for
    ``HANDOVER_CPU_SHARE`` of their time or more (the capture's per-step CPU through the waits: the thread's own where
    recorded, else the process's): taking the batch over (unpickling, collating), not waiting for a worker still
    making it - the test ``handover_waits`` makes of the run, step by step. Empty where not recorded."""
    profiled = _profiled_rows(trace)
    if profiled is None:
        return set()
    column = ("data_wait_thread_cpu_ns" if "data_wait_thread_cpu_ns" in profiled
              and not profiled["data_wait_thread_cpu_ns"].isna().all() else "data_wait_cpu_ns")
    if column not in profiled:
        return set()
    wait = profiled["data_wait_ns"].to_numpy(float)
    cpu = profiled[column].to_numpy(float)
    with np.errstate(invalid="ignore"):
        working = (wait > 0) & (cpu >= HANDOVER_CPU_SHARE * wait)
    return set(int(x) for x in profiled["step"].to_numpy()[working])


def handoff_ns(waits: np.ndarray) -> float:
    """What taking a batch that is already prepared costs the loop: the median of the short waits (at most a
    quarter of the longest) where at least a quarter of the waits are short, so those batches were evidently
    ready; 0 where nearly every step stalled alike (no evidence of a ready batch)."""
    if not len(waits):
        return 0.0
    short = waits[waits <= 0.25 * float(np.max(waits))]
    return float(np.median(short)) if len(short) >= 0.25 * len(waits) else 0.0
