"""Derived views of a rank shared by several analyzers, computed once per trace.

Everything here is a pure function of the ``RankTrace``; the cache is keyed on
the trace object's identity (``RankTrace`` is frozen), so it never goes stale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from kinetoscope.analyze import intervals as iv
from kinetoscope.analyze.trace import RankTrace

LOADER_RE = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#")
#: host calls that block until the device catches up
SYNC_RUNTIME_RE = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyWithStream|Memset)$"
)
SYNC_OP_NAMES = frozenset({"aten::item", "aten::_local_scalar_dense"})


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
            "gpu_activity": "span of all GPU activity (trace has no ProfilerStep spans)",
            "all_events": "span of all events (no ProfilerStep spans, no GPU activity)",
        }[self.basis]


@lru_cache(maxsize=16)
def window(trace: RankTrace) -> Window:
    steps = trace.steps
    if len(steps):
        return Window(int(steps["start_ns"].min()), int(steps["end_ns"].max()), "profiler_steps")
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


def kind_mask(frame: pd.DataFrame, kinds: tuple[str, ...] | list[str]) -> np.ndarray:
    """Rows whose ``kind`` is one of ``kinds``, compared on the categorical codes."""
    kind = frame["kind"].cat
    codes = [i for i, k in enumerate(kind.categories) if k in kinds]
    return np.isin(np.asarray(kind.codes), codes)


def name_mask(frame: pd.DataFrame, pattern: re.Pattern[str] | None = None, names: frozenset[str] | None = None,
              *, search: bool = False) -> np.ndarray:
    """Rows whose ``name`` matches ``pattern`` (at the start; anywhere with ``search``) or is one of
    ``names``, tested once per distinct name."""
    name = frame["name"].cat
    test = (pattern.search if search else pattern.match) if pattern is not None else None
    codes = [i for i, n in enumerate(name.categories)
             if (test is not None and test(n)) or (names is not None and n in names)]
    return np.isin(np.asarray(name.codes), codes)


@lru_cache(maxsize=16)
def runtime_calls(trace: RankTrace) -> pd.DataFrame:
    """CUDA/HIP runtime and driver calls on the host."""
    return trace.events[kind_mask(trace.events, ("runtime", "driver"))]


@lru_cache(maxsize=16)
def kernels(trace: RankTrace) -> pd.DataFrame:
    """Kernels of ``gpu_work``."""
    work = gpu_work(trace)
    return work[kind_mask(work, ("kernel",))]


@lru_cache(maxsize=16)
def gpu_work(trace: RankTrace) -> pd.DataFrame:
    """Kernels, copies and memsets with a device and stream, sorted by start."""
    gpu = trace.gpu_events
    gpu = gpu[gpu["device"].notna()]
    return gpu.assign(device=gpu["device"].astype(np.int64), stream=gpu["stream"].fillna(-1).astype(np.int64))


@lru_cache(maxsize=16)
def device_busy(trace: RankTrace) -> dict[int, iv.Intervals]:
    """Per device: union of all its streams' work, clipped to the window."""
    w = window(trace)
    return {int(d): _set(g, w) for d, g in gpu_work(trace).groupby("device", sort=True)}


@lru_cache(maxsize=16)
def any_gpu_busy(trace: RankTrace) -> iv.Intervals:
    gpu = gpu_work(trace)
    return _set(gpu, window(trace)) if len(gpu) else iv.EMPTY


@lru_cache(maxsize=16)
def loader_spans(trace: RankTrace) -> pd.DataFrame:
    ev = trace.events
    return ev[name_mask(ev, LOADER_RE) & ~kind_mask(ev, ("gpu_annotation",))]


@lru_cache(maxsize=16)
def sync_calls(trace: RankTrace) -> pd.DataFrame:
    ev = trace.events
    is_sync = (kind_mask(ev, ("runtime", "driver")) & name_mask(ev, SYNC_RUNTIME_RE)) | (
        kind_mask(ev, ("cpu_op",)) & name_mask(ev, names=SYNC_OP_NAMES)
    )
    return ev[is_sync]


@lru_cache(maxsize=16)
def host_busy(trace: RankTrace) -> iv.Intervals:
    """Host threads that issue GPU work, busy in ops or runtime calls."""
    ev = trace.events
    launching = np.unique(np.asarray(runtime_calls(trace)["tid"].cat.codes))  # tid shares its categories
    work = kind_mask(ev, ("cpu_op", "runtime", "driver")) & np.isin(np.asarray(ev["tid"].cat.codes), launching)
    w = window(trace)
    return iv.clip(iv.union(ev["ts_ns"].to_numpy()[work], ev["end_ns"].to_numpy()[work]), w.start_ns, w.end_ns)


@lru_cache(maxsize=16)
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
    ts, dur = frame["ts_ns"].to_numpy(), frame["dur_ns"].to_numpy()
    # by start, longest first at equal starts (stable): one numpy sort, one take of the frame
    order = np.lexsort((-dur, ts))
    ends = frame["end_ns"].to_numpy()[order]
    prior_max = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]))
    return frame.iloc[order[ends > prior_max]]


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
