"""GPU telemetry the capture sampled through NVML (counter events): utilisation, memory, clocks, power, PCIe."""

from __future__ import annotations

from kinetoscope.analyze.config import AnalysisConfig
from kinetoscope.analyze.registry import AnalysisResult, register
from kinetoscope.analyze.timeline import window
from kinetoscope.analyze.trace import RankTrace


@register("telemetry", "GPU telemetry")
def analyze_telemetry(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Mean, min and max of every counter series inside the window (``null`` when the trace has none)."""
    counters = trace.counters
    if counters.empty:
        return AnalysisResult(key="telemetry", metrics={"telemetry": None})
    w = window(trace)
    inside = counters[(counters["ts_ns"] >= w.start_ns) & (counters["ts_ns"] <= w.end_ns)]
    if inside.empty:
        inside = counters
    stats = inside.groupby(["name", "series"], observed=True)["value"].agg(["mean", "min", "max", "count"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (name, series), row in stats.iterrows():
        out.setdefault(str(name), {})[str(series)] = {
            "mean": round(float(row["mean"]), 3), "min": float(row["min"]), "max": float(row["max"]),
            "samples": int(row["count"]),
        }
    return AnalysisResult(key="telemetry", metrics={"telemetry": out}, tables={"telemetry": inside})
