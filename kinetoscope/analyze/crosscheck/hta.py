"""An adapter to Holistic Trace Analysis (optional extra ``kinetoscope[hta]``).

HTA is never the loader here: it is used to cross-check numbers both tools
compute. HTA 0.5.0 works on a directory of rank files, rounds timestamps to
whole microseconds and, by design, drops the last profiler step. Its failures
(it crashes in several analyses under pandas 3) become ``HtaUnavailable``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.timeline import gpu_work
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.errors import KinetoscopeError


class HtaUnavailable(KinetoscopeError):
    """HTA is not installed or failed on this trace."""


@dataclass(frozen=True)
class HtaIdle:
    rank: int
    idle_us: float
    window_us: float  # HTA's "kernel_time": first GPU event start to last GPU event end

    @property
    def idle_fraction(self) -> float:
        return self.idle_us / self.window_us if self.window_us else float("nan")


def hta_run(files: list[Path], method: str, **kwargs: object) -> object:
    """Load the rank files into HTA's TraceAnalysis and call one of its analyses; HTA's failures
    (several analyses crash under pandas 3) become ``HtaUnavailable``."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        raise HtaUnavailable(
            f"HolisticTraceAnalysis is not installed ({exc}); pip install 'kinetoscope[hta]'"
        ) from None
    with tempfile.TemporaryDirectory(prefix="kinetoscope-hta-") as tmp:
        for f in files:
            os.symlink(Path(f).resolve(), Path(tmp) / Path(f).name)
        quiet = io.StringIO()
        logging.getLogger("hta").setLevel(logging.ERROR)
        try:
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                analysis = TraceAnalysis(trace_dir=tmp)
                return getattr(analysis, method)(**kwargs)
        except Exception as exc:  # noqa: BLE001 - HTA's own failure, reported as such
            raise HtaUnavailable(f"HTA {method} unavailable: {type(exc).__name__}: {str(exc)[:120]}") from None


#: HTA analyses worth having beside ours, with the arguments that keep them from plotting
HTA_ANALYSES = {
    "temporal_breakdown": ("get_temporal_breakdown", {"visualize": False}),
    "kernel_breakdown": ("get_gpu_kernel_breakdown", {"visualize": False}),
    "comm_comp_overlap": ("get_comm_comp_overlap", {"visualize": False}),
    "launch_stats": ("get_cuda_kernel_launch_stats", {"visualize": False}),
    "queue_length": ("get_queue_length_summary", {}),
}


def hta_breakdowns(files: list[Path]) -> dict[str, object]:
    """Every analysis in HTA_ANALYSES: its result, or the reason it is unavailable (never an exception)."""
    out: dict[str, object] = {}
    for name, (method, kwargs) in HTA_ANALYSES.items():
        try:
            out[name] = hta_run(files, method, **kwargs)
        except HtaUnavailable as exc:
            out[name] = str(exc)
    return out


def hta_comm_comp_overlap(files: list[Path]) -> dict[int, float]:
    """HTA's per-rank share of communication time overlapped with computation, as a fraction."""
    table = cast(pd.DataFrame, hta_run(files, "get_comm_comp_overlap", visualize=False))  # HTA returns a DataFrame
    return {int(r["rank"]): float(r["comp_comm_overlap_pctg"]) / 100.0 for _, r in table.iterrows()}


def hta_temporal_breakdown(files: list[Path]) -> dict[int, HtaIdle]:
    """Run HTA's ``get_temporal_breakdown`` on the given rank files."""
    table = cast(pd.DataFrame, hta_run(files, "get_temporal_breakdown", visualize=False))  # HTA returns a DataFrame
    return {
        int(row["rank"]): HtaIdle(int(row["rank"]), float(row["idle_time(us)"]), float(row["kernel_time(us)"]))
        for _, row in table.iterrows()
    }


def _hta_selection(trace: RankTrace) -> pd.DataFrame:
    """The GPU work HTA keeps: all of it, or (with two ProfilerSteps or more) what was launched before the last."""
    ev = trace.events
    steps = trace.steps
    marked = steps[~steps["inferred"]] if "inferred" in steps else steps  # HTA knows only ProfilerStep marks
    work = gpu_work(trace)
    if len(marked) >= 2:
        last_start = int(marked["start_ns"].max())
        runtime = ev[ev["kind"].isin(("runtime", "driver")).to_numpy() & ev["correlation"].notna().to_numpy()
                     & (ev["ts_ns"] < last_start).to_numpy()]
        work = work[work["correlation"].isin(set(runtime["correlation"].astype(np.int64)))]
    return work


def hta_view(trace: RankTrace) -> RankTrace:
    """The same rank as HTA's temporal breakdown sees it, for running *our* analyzers on HTA's terms.

    HTA drops the last ProfilerStep (when there are at least two): it keeps GPU work whose launching
    call starts before the last step does; it rounds every event inward to whole microseconds (start
    up, end down); and its window is the span of the GPU work it keeps. So: that GPU work, rounded the
    same way, every host event unchanged, and no steps (the window becomes the GPU span). Differences
    left between HTA and ``analyze_gpu`` on this view are differences of definition (HTA counts every
    event with a ``stream`` argument as busy: ``cuda_sync`` markers, even CPU ops that take a stream), in
    docs/hta.md.
    """
    ev = trace.events
    keep = ~ev.index.isin(gpu_work(trace).index)
    work = _hta_selection(trace)
    steps = trace.steps
    keep |= ev.index.isin(work.index)
    view = ev[keep].copy()
    is_gpu = view.index.isin(work.index)
    start = np.where(is_gpu, -(-view["ts_ns"].to_numpy() // 1000) * 1000, view["ts_ns"].to_numpy())
    end = np.where(is_gpu, (view["end_ns"].to_numpy() // 1000) * 1000, view["end_ns"].to_numpy())
    end = np.maximum(end, start)
    view["ts_ns"], view["end_ns"], view["dur_ns"] = start, end, end - start
    view = view.sort_values("ts_ns", kind="stable").reset_index(drop=True)
    return RankTrace(rank=trace.rank, meta=trace.meta, events=view, memory=trace.memory.iloc[0:0],
                     counters=trace.counters.iloc[0:0], flows=trace.flows, instants=trace.instants,
                     steps=steps.iloc[0:0], comm_args=trace.comm_args.iloc[0:0], marks=trace.marks.iloc[0:0])



#: categories of GPU work proper (kernels, copies, memsets), in both dialects
_WORK_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})


def hta_extra_busy_events(path: Path) -> dict[str, int]:
    """Events HTA counts as GPU busy that are not GPU work: any complete event with a ``stream`` argument
    (``cuda_sync`` markers, CPU ops that take a stream), by category. Read from the file as HTA reads it."""
    import gzip

    import msgspec

    raw = Path(path).read_bytes()
    doc = msgspec.json.decode(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    counts: dict[str, int] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("cat") in _WORK_CATS:
            continue
        args = e.get("args")
        stream = args.get("stream") if isinstance(args, dict) else None
        if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
            counts[str(e.get("cat"))] = counts.get(str(e.get("cat")), 0) + 1
    return counts


def hta_rounding_loss_us(trace: RankTrace) -> float:
    """Busy time HTA loses to its own rounding: an event shorter than a microsecond inside one gets its
    start rounded up past its end rounded down, a negative duration that HTA's merge then subtracts."""
    work = _hta_selection(trace)
    ts, end = work["ts_ns"].to_numpy(), work["end_ns"].to_numpy()
    if not ((ts % 1000).any() or (end % 1000).any()):
        return 0.0  # a whole-microsecond trace: HTA does not round
    return float(np.maximum(-(-ts // 1000) - end // 1000, 0).sum())


def hta_extra_busy_us(path: Path, trace: RankTrace) -> float | None:
    """How much busy time HTA adds with the non-work events it counts (``hta_extra_busy_events``), rounded
    as HTA rounds: their union less the GPU work's. None where HTA drops the last step (two ProfilerSteps
    or more), whose selection of such events is its own."""
    import gzip

    import msgspec

    steps = trace.steps
    marked = steps[~steps["inferred"]] if "inferred" in steps else steps
    if len(marked) >= 2:
        return None
    raw = Path(path).read_bytes()
    doc = msgspec.json.decode(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    starts, ends = [], []
    fractional = False
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur", 0)
        if isinstance(ts, float) and not ts.is_integer():
            fractional = True
        if e.get("cat") in _WORK_CATS:
            continue
        args = e.get("args")
        stream = args.get("stream") if isinstance(args, dict) else None
        if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0 and isinstance(ts, (int, float)):
            starts.append(float(ts))
            ends.append(float(ts) + float(dur or 0))
    if not starts:
        return 0.0
    s = np.asarray(starts)
    e = np.asarray(ends)
    if fractional:  # HTA rounds inward to whole microseconds (only when the trace has fractional times)
        s, e = np.ceil(s), np.floor(e)
    e = np.maximum(e, s)
    extra = iv.union((s * 1000).astype(np.int64), (e * 1000).astype(np.int64))
    work = gpu_work(hta_view(trace))
    work_set = iv.union(work["ts_ns"].to_numpy(), work["end_ns"].to_numpy())
    return iv.measure(iv.subtract(extra, work_set)) / 1000.0
