"""Profiler steps and the analysis window."""

from __future__ import annotations

from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.results import Steps, StepsResult, Window
from kinetoscope.analyze.model.timeline import window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import us


@register("steps", "Steps and window")
def analyze_steps(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """ProfilerStep count and times, and the window every fraction refers to."""
    w = window(trace)
    steps = trace.steps
    table = steps.assign(dur_us=steps["dur_ns"] / 1000.0)
    complete = steps[~steps["partial"].to_numpy()] if "partial" in steps else steps
    # a step cut short (a crash, a stop) is no step: counted apart, and says nothing about a step's length
    shown = complete if len(complete) else steps
    stats = Steps(
        count=int(len(complete)),
        mean_us=us(complete["dur_ns"].mean()) if len(complete) else None,
        min_us=us(complete["dur_ns"].min()) if len(complete) else None,
        max_us=us(complete["dur_ns"].max()) if len(complete) else None,
        first=int(shown["step"].iloc[0]) if len(shown) else None,
        last=int(shown["step"].iloc[-1]) if len(shown) else None,
        partial=int(steps["partial"].sum()) if "partial" in steps else 0,
    )
    metrics = StepsResult(
        window_us=us(w.dur_ns),
        window=Window(start_us=us(w.start_ns), end_us=us(w.end_ns), basis=w.basis, description=w.describe()),
        steps=stats,
    )
    return AnalysisResult(key="steps", metrics=metrics, tables={"steps": table})
