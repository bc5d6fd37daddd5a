"""The one Trace model every analyzer takes."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import pandas as pd

from kinetoscope.analyze.model.schema import (
    COMM_ARG_COLUMNS,
    GPU_BUSY_KINDS,
    GRAPH_CAPTURE_COLUMNS,
    LAUNCH_KERNEL_COLUMNS,
    MARK_COLUMNS,
    SHAPE_COLUMNS,
    empty_frame,
)
from kinetoscope.hangdump import HangDump


@dataclass(frozen=True)
class TraceMeta:
    """What a trace says about itself, plus what the loader noticed."""

    source: str
    rank_source: str  # "distributedInfo" | "filename" | "default"
    world_size: int | None = None
    schema_version: int | None = None
    trace_name: str | None = None
    base_time_ns: int | None = None
    device_properties: tuple[dict[str, Any], ...] = ()
    distributed_info: dict[str, Any] | None = None
    process_names: dict[str, str] = field(default_factory=dict)
    thread_names: dict[tuple[str, str], str] = field(default_factory=dict)
    other: dict[str, Any] = field(default_factory=dict)
    #: events we read but do not analyse, by phase/kind ("B": 12); never silently lost
    unhandled_events: dict[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    #: what the capture's manifest says about the run beside the trace: ``host`` (cpus, cores_effective, torch_threads),
    #: ``dataloader`` (num_workers, prefetch_factor, persistent_workers, pin_memory, batch_size) and ``loop`` (the loop
    #: marks' run totals: loaders and their roles, backward calls, optimizer steps, validation, compile, checkpoint;
    #: docs/report.md "Loop marks"); {} if none
    capture: dict[str, Any] = field(default_factory=dict)
    n_events: int = 0
    bytes_read: int = 0
    load_seconds: float = 0.0


class ViewLocks(dict):
    """A trace's per-view locks (view key -> ``threading.Lock``). Locks cannot be pickled or copied, and a copy of
    a trace needs none of its original's: pickling or copying gives an empty set."""

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (ViewLocks, ())

    def __copy__(self) -> ViewLocks:
        return ViewLocks()

    def __deepcopy__(self, memo: dict[int, Any]) -> ViewLocks:
        return ViewLocks()


@dataclass(frozen=True, eq=False)
class RankTrace:
    """One rank's trace as typed columnar tables (see ``schema`` for columns)."""

    rank: int
    meta: TraceMeta
    events: pd.DataFrame
    memory: pd.DataFrame
    counters: pd.DataFrame
    flows: pd.DataFrame
    instants: pd.DataFrame
    #: ``ProfilerStep#N`` spans: step, start_ns, end_ns, dur_ns, tid (the training thread); sorted by start
    steps: pd.DataFrame
    #: every step of the run timed by the capture's host clocks (step, wall_ns, data_wait_ns, profiled, cpu_ns,
    #: data_wait_cpu_ns, the training thread's data_wait_thread_cpu_ns, workers_cpu_ns, oncpu_ns and runqueue_wait_ns
    #: and the process's
    #: involuntary_switches (NaN: not recorded), and the loop marks' train_data_wait_ns, eval_data_wait_ns,
    #: validation_ns, compile_ns, checkpoint_ns (float, NaN: not recorded), backward_calls, optimizer_steps (Int64,
    #: <NA>: not recorded)), from ``rank-<r>.steps.json`` beside the trace; None when absent
    run_steps: pd.DataFrame | None = None
    #: collective metadata of events that carry it (see ``schema.COMM_ARG_COLUMNS``)
    comm_args: pd.DataFrame = field(default_factory=lambda: empty_frame(COMM_ARG_COLUMNS))
    #: the capture's loop marks (events of kind "mark") with their args (see ``schema.MARK_COLUMNS``)
    marks: pd.DataFrame = field(default_factory=lambda: empty_frame(MARK_COLUMNS))
    #: recorded inputs of host ops (``record_shapes``; see ``schema.SHAPE_COLUMNS``); empty when not recorded
    shapes: pd.DataFrame = field(default_factory=lambda: empty_frame(SHAPE_COLUMNS))
    #: launches of the graphs captured in separate capture traces (``capture_traces/`` beside the trace; see
    #: ``schema.GRAPH_CAPTURE_COLUMNS``); empty when there are none
    graph_captures: pd.DataFrame = field(default_factory=lambda: empty_frame(GRAPH_CAPTURE_COLUMNS))
    #: the kernels the trace's own captured launch calls name (see ``schema.LAUNCH_KERNEL_COLUMNS``)
    launch_kernels: pd.DataFrame = field(default_factory=lambda: empty_frame(LAUNCH_KERNEL_COLUMNS))
    #: derived views (``trace_view``), computed once and dropped with the trace
    _views: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: one lock per view, so analyzers running in threads compute each view once
    _view_locks: ViewLocks = field(default_factory=lambda: ViewLocks(), repr=False, compare=False)

    @cached_property
    def gpu_events(self) -> pd.DataFrame:
        """Kernels, copies and memsets: the work that occupies a GPU stream."""
        return self.events[self.events["kind"].isin(GPU_BUSY_KINDS)]

    @cached_property
    def has_gpu(self) -> bool:
        return bool(len(self.gpu_events))

    def drop_views(self, keep: tuple[Callable[..., Any], ...] = ()) -> None:
        """Forget the derived views (and ``gpu_events``) but those in ``keep`` (``trace_view`` functions): a caller
        done with a rank gives their memory back; a view asked for again is computed again. Not while another
        thread may be using this rank's views."""
        kept = {getattr(fn, "view_key", None) for fn in keep}
        for key in [k for k in self._views if k not in kept]:
            del self._views[key]
        self.__dict__.pop("gpu_events", None)


@dataclass(frozen=True, eq=False)
class Trace:
    """One job: the rank traces of a single training run."""

    source: str
    ranks: tuple[RankTrace, ...]
    #: the ranks' hang dumps (``rank-<r>.hang.json`` beside the traces), by rank; a job that hung before any window
    #: was written has these and no rank traces
    hang_dumps: tuple[HangDump, ...] = ()

    def rank(self, rank: int) -> RankTrace:
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(rank)

    @property
    def world_size(self) -> int:
        sizes = [r.meta.world_size for r in self.ranks if r.meta.world_size]
        return max(sizes) if sizes else len(self.ranks)

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        """The job's ranks no file holds: below the world size the traces state (distributedInfo), or, where none
        states one and every file names its rank (rank-0, rank-2), below the highest rank named. Ranks numbered in
        file order (the files say nothing) show no gap: whether files are missing cannot be told."""
        present = {r.rank for r in self.ranks}
        sizes = [r.meta.world_size for r in self.ranks if r.meta.world_size]
        if sizes:
            size = max(sizes)
        elif self.ranks and all(r.meta.rank_source == "filename" for r in self.ranks):
            size = max(present) + 1
        else:
            return ()
        return tuple(r for r in range(size) if r not in present)


V = TypeVar("V")


def trace_view(fn: Callable[[RankTrace], V]) -> Callable[[RankTrace], V]:
    """A derived view of a rank trace, computed on first use and kept by the trace itself.

    Module-level caches would hold every trace they ever saw; a view lives exactly as long as its
    trace. A thread asking for a view another thread is computing waits for it rather than computing it
    again (views form no cycles: a view only asks for the views it is built on).
    """
    key = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def view(trace: RankTrace) -> V:
        views = trace._views
        try:
            return views[key]
        except KeyError:
            pass
        with trace._view_locks.setdefault(key, threading.Lock()):  # setdefault is atomic
            try:
                return views[key]
            except KeyError:
                value = views[key] = fn(trace)
                return value

    view.view_key = key  # type: ignore[attr-defined]  # for RankTrace.drop_views(keep=...)
    return view


def training_children(capture: dict[str, Any] | None) -> tuple[int, tuple[str, ...]] | None:
    """(how many, their targets) when the capture's manifest (``TraceMeta.capture``) says this process ran no training
    itself and started Python child processes (not DataLoader workers) that it does not follow:
    ``loop.child_processes``."""
    loop = (capture or {}).get("loop") or {}
    children = loop.get("child_processes") if isinstance(loop, dict) else None
    if not isinstance(children, dict) or children.get("training_in_children") is not True:
        return None
    started = children.get("started")
    if not isinstance(started, int) or isinstance(started, bool) or started < 1:
        return None
    targets = children.get("targets")
    names = tuple(str(t) for t in targets) if isinstance(targets, list) else ()
    return started, names
