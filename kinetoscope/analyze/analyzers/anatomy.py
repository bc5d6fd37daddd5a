"""Step anatomy: each step's time per phase, on the host and on the device (the phases and how each is
recognised: ``kinetoscope.analyze.model.phases``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.phases import PHASES, gpu_phase_of, host_phases, steps_or_window
from kinetoscope.analyze.model.results import PhasesResult, PhaseTime
from kinetoscope.analyze.model.timeline import (
    gpu_work,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us


@register("phases", "Step anatomy")
def analyze_phases(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    (
        "Host time per step phase (data wait, copy launch, forward, backward, optimizer, zero_grad, sync, other) "
        "and GPU time launched from each."
    )
    w = window(trace)
    phases = host_phases(trace)
    steps = steps_or_window(trace, w)
    # each phase's time inside each step: one pass per phase over every step (was: a clip per step and phase)
    start, end = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    per_step = pd.DataFrame({"step": steps["step"].to_numpy(np.int64), "step_us": steps["dur_ns"].to_numpy() / 1000.0,
                             **{f"{p}_us": iv.overlap_each(start, end, phases[p]) / 1000.0 for p in PHASES}})
    rows = per_step.to_dict("records")
    gpu_time: dict[str, int] | None = None
    if trace.has_gpu:
        work = gpu_work(trace)
        phase_of = gpu_phase_of(trace).to_numpy()
        starts_ns, ends_ns = work["ts_ns"].to_numpy(), work["end_ns"].to_numpy()
        gpu_time = {}
        for p in PHASES:
            sel = phase_of == p
            gpu_time[p] = iv.measure(iv.clip(iv.union(starts_ns[sel], ends_ns[sel]), w.start_ns, w.end_ns))
    metrics: dict[str, PhaseTime] = {}
    for p in PHASES:
        host_ns = iv.measure(phases[p])
        metrics[p] = PhaseTime(
            time_us=us(host_ns),
            fraction=frac(host_ns, w.dur_ns),
            gpu_time_us=us(gpu_time[p]) if gpu_time is not None else None,
            gpu_fraction=frac(gpu_time[p], w.dur_ns) if gpu_time is not None else None,
        )
    per_step_json = [
        {"step": int(r["step"]), **{p: round(float(r[f"{p}_us"]), 3) for p in PHASES}} for r in rows
    ]
    return AnalysisResult(
        key="phases",
        metrics=PhasesResult(phases=metrics, phases_per_step_us=per_step_json),
        tables={"phases_per_step": per_step},
    )


