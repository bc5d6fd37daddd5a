"""Device memory allocated and freed through the runtime inside the steps (``cudaMalloc``/``cudaFree``,
``hipMalloc``/``hipFree``): PyTorch's caching allocator makes these rare after warm-up, so when they recur every
step the cache is being emptied (``torch.cuda.empty_cache()`` in the loop) or bypassed
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``), and each free synchronises the device."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.record import json_ready
from kinetoscope.analyze.model.results import Allocator, AllocatorResult, OpTime
from kinetoscope.analyze.model.timeline import allocator_calls, recurring_allocator_calls, step_at, window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us


@register("allocator", "Device allocator calls")
def analyze_allocator(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Runtime mallocs and frees of device memory in the window: how many, the host time in them, in how many
    steps; a finding when they take a share of the window (recurring: every step pays them)."""
    calls = allocator_calls(trace)
    if calls.empty:
        return AnalysisResult(key="allocator", metrics=AllocatorResult(allocator=None))
    w = window(trace)
    held = iv.clip(iv.union(calls["ts_ns"].to_numpy(), calls["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    held_ns = iv.measure(held)
    step = step_at(trace, calls["ts_ns"].to_numpy())
    in_steps = np.unique(step[step >= 0])
    by_name = calls.groupby("name", observed=True)["dur_ns"].agg(["count", "sum"]).sort_values("sum", ascending=False)
    metrics = Allocator(
        calls=int(len(calls)),
        time_us=us(held_ns),
        fraction=frac(held_ns, w.dur_ns),
        fraction_of="window (host time in device mallocs and frees, a union)",
        steps_with_calls=int(len(in_steps)),
        steps=int(len(trace.steps)),
        by_name={str(n): OpTime(count=int(r["count"]), time_us=us(r["sum"])) for n, r in by_name.iterrows()},
    )
    findings = []
    if w.dur_ns and held_ns >= config.allocator_min_fraction * w.dur_ns:
        recurring = recurring_allocator_calls(trace)
        cost = iv.measure(iv.clip(iv.union(recurring["ts_ns"].to_numpy(), recurring["end_ns"].to_numpy()),
                                  w.start_ns, w.end_ns))
        names = ", ".join(f"{n} x{int(r['count'])}" for n, r in by_name.head(3).iterrows())
        title = (f"Device memory is allocated and freed through the runtime in {len(in_steps)} of {len(trace.steps)} "
                 f"steps ({names}): {held_ns / w.dur_ns:.0%} of the {w.dur_ns / 1e6:.1f} ms window")
        found = Finding(
            id="allocator_churn", rank=trace.rank, title=title,
            evidence={"calls": int(len(calls)), "time_us": us(held_ns), "fraction_of_window": frac(held_ns, w.dur_ns),
                      "recurring_time_us": us(cost), "steps_with_calls": int(len(in_steps)),
                      "steps": int(len(trace.steps)), "by_name": json_ready(metrics.by_name),
                      "window_us": us(w.dur_ns)},
            recommendation=("Let PyTorch's caching allocator keep device memory between steps: remove "
                            "torch.cuda.empty_cache() (and gc-driven frees) from the loop, unset "
                            "PYTORCH_NO_CUDA_MEMORY_CACHING, and where varying shapes fragment the cache set "
                            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. Each cudaFree/hipFree also synchronises "
                            "the device."),
            impact_us=cost / 1000.0,
        )
        if recurring.empty:  # one step's (or a step-less window's) allocations: start-up, or cannot tell
            found = replace(found, ceiling="info", impact_us=held_ns / 1000.0,
                            ceiling_reason="in one step only: whether it recurs cannot be told")
        findings.append(found)
    return AnalysisResult(key="allocator", metrics=AllocatorResult(allocator=metrics), findings=tuple(findings))
