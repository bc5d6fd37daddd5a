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

import numpy as np

from kinetoscope.analyze import intervals as iv
from kinetoscope.analyze.timeline import gpu_work
from kinetoscope.analyze.trace import RankTrace
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
        raise HtaUnavailable(f"HolisticTraceAnalysis is not installed ({exc}); pip install 'kinetoscope[hta]'") from None
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
    table = hta_run(files, "get_comm_comp_overlap", visualize=False)
    return {int(r["rank"]): float(r["comp_comm_overlap_pctg"]) / 100.0 for _, r in table.iterrows()}  # type: ignore[union-attr]


def hta_temporal_breakdown(files: list[Path]) -> dict[int, HtaIdle]:
    """Run HTA's ``get_temporal_breakdown`` on the given rank files."""
    table = hta_run(files, "get_temporal_breakdown", visualize=False)
    return {
        int(row["rank"]): HtaIdle(int(row["rank"]), float(row["idle_time(us)"]), float(row["kernel_time(us)"]))
        for _, row in table.iterrows()  # type: ignore[union-attr]
    }


def hta_style_idle(trace: RankTrace) -> HtaIdle:
    """Our numbers under HTA's definition, to separate definition from measurement differences.

    HTA keeps GPU work launched before the last ProfilerStep starts (when there are
    at least two steps), merges every stream of every device, and measures idle
    between the first such event's start and the last one's end.
    """
    work = gpu_work(trace)
    steps = trace.steps
    if len(steps) >= 2:
        last_start = int(steps["start_ns"].max())
        ev = trace.events
        runtime = ev[ev["kind"].isin(("runtime", "driver")) & ev["correlation"].notna() & (ev["ts_ns"] < last_start)]
        work = work[work["correlation"].isin(set(runtime["correlation"].astype(np.int64)))]
    busy = iv.union(work["ts_ns"].to_numpy(), work["end_ns"].to_numpy())
    if busy[0].size == 0:
        return HtaIdle(trace.rank, 0.0, 0.0)
    window = int(busy[1][-1] - busy[0][0])
    return HtaIdle(trace.rank, (window - iv.measure(busy)) / 1000.0, window / 1000.0)
