"""GPU telemetry the capture sampled through NVML (counter events): utilisation, memory, clocks, power, PCIe."""

from __future__ import annotations

import pandas as pd

from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.results import Series, TelemetryResult
from kinetoscope.analyze.model.timeline import window
from kinetoscope.analyze.model.trace import RankTrace


@register("telemetry", "GPU telemetry")
def analyze_telemetry(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Mean, min and max of every counter series inside the window (``null`` when the trace has none)."""
    counters = trace.counters
    if counters.empty:
        return AnalysisResult(key="telemetry", metrics=TelemetryResult(telemetry=None))
    w = window(trace)
    inside = counters[(counters["ts_ns"] >= w.start_ns) & (counters["ts_ns"] <= w.end_ns)]
    if inside.empty:
        inside = counters
    stats = inside.groupby(["name", "series"], observed=True)["value"].agg(["mean", "min", "max", "count"])
    out: dict[str, dict[str, Series]] = {}
    for (name, series), row in stats.iterrows():
        out.setdefault(str(name), {})[str(series)] = Series(
            mean=round(float(row["mean"]), 3), min=float(row["min"]), max=float(row["max"]),
            samples=int(row["count"]),
        )
    return AnalysisResult(key="telemetry", metrics=TelemetryResult(telemetry=out),
                          tables={"telemetry": _for_display(inside, w.start_ns)})


#: a series' unit from its name's suffix, and the factor to show it in (bytes are shown in MiB)
_UNITS = (("_pct", "%", 1.0), ("_bytes", "MiB", 1.0 / 2**20), ("_mhz", "MHz", 1.0), ("_w", "W", 1.0),
          ("_kb_per_s", "KB/s", 1.0))


def _for_display(rows: pd.DataFrame, start_ns: int) -> pd.DataFrame:
    """The samples with the time from the window's start (ms), each series' unit and its value in that unit."""
    series = rows["series"].astype(str)
    unit = pd.Series("", index=rows.index, dtype=object)
    factor = pd.Series(1.0, index=rows.index)
    for suffix, name, f in _UNITS:
        hit = series.str.endswith(suffix)
        unit[hit], factor[hit] = name, f
    return rows.assign(t_ms=(rows["ts_ns"] - start_ns) / 1e6, unit=unit.to_numpy(), shown=rows["value"] * factor)
