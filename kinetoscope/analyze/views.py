"""Slices of a trace for display (the app's timeline), chosen here so renderers never compute."""

from __future__ import annotations

import pandas as pd

from kinetoscope.analyze.timeline import gpu_work, loader_spans, main_thread
from kinetoscope.analyze.trace import RankTrace

#: more spans than this make a browser chart sluggish; the longest are kept
MAX_SPANS = 20_000


def timeline_spans(trace: RankTrace, first_step: int | None = None, last_step: int | None = None,
                   max_spans: int = MAX_SPANS) -> pd.DataFrame:
    """GPU work per stream, plus the training thread's steps, DataLoader waits and top ops, in a step range.

    Columns: lane, name, kind, start_us, end_us, dur_us (start/end relative to the range start).
    """
    steps = trace.steps
    if len(steps) and first_step is not None and last_step is not None:
        sel = steps[(steps["step"] >= first_step) & (steps["step"] <= last_step)]
        lo, hi = int(sel["start_ns"].min()), int(sel["end_ns"].max())
    else:
        ev = trace.events
        lo, hi = int(ev["ts_ns"].min()), int(ev["end_ns"].max())
    gpu = gpu_work(trace)
    gpu = gpu[(gpu["end_ns"] > lo) & (gpu["ts_ns"] < hi)]
    parts = [pd.DataFrame({
        "lane": "GPU " + gpu["device"].astype(str) + " stream " + gpu["stream"].astype(str),
        "name": gpu["name"].astype(str), "kind": gpu["kind"].astype(str),
        "ts_ns": gpu["ts_ns"], "end_ns": gpu["end_ns"]})]
    host_rows = []
    for s in steps.itertuples():
        if s.end_ns > lo and s.start_ns < hi:
            host_rows.append(("host: steps", f"ProfilerStep#{s.step}", "step", s.start_ns, s.end_ns))
    ld = loader_spans(trace)
    for r in ld[(ld["end_ns"] > lo) & (ld["ts_ns"] < hi)].itertuples():
        host_rows.append(("host: data", str(r.name), "data_wait", r.ts_ns, r.end_ns))
    parts.append(pd.DataFrame(host_rows, columns=["lane", "name", "kind", "ts_ns", "end_ns"]))
    tid = main_thread(trace)
    if tid is not None:
        ev = trace.events
        ops = ev[(ev["tid"] == tid) & ev["kind"].isin(("cpu_op", "runtime", "driver"))
                 & (ev["end_ns"] > lo) & (ev["ts_ns"] < hi)]
        parts.append(pd.DataFrame({"lane": "host: ops", "name": ops["name"].astype(str), "kind": ops["kind"].astype(str),
                                   "ts_ns": ops["ts_ns"], "end_ns": ops["end_ns"]}))
    out = pd.concat(parts, ignore_index=True)
    out = out.assign(dur_ns=out["end_ns"] - out["ts_ns"])
    if len(out) > max_spans:
        out = out.nlargest(max_spans, "dur_ns")
    return pd.DataFrame({
        "lane": out["lane"], "name": out["name"], "kind": out["kind"],
        "start_us": (out["ts_ns"] - lo) / 1000.0, "end_us": (out["end_ns"] - lo) / 1000.0,
        "dur_us": out["dur_ns"] / 1000.0,
    }).reset_index(drop=True)
