"""Memory growth from ``[memory]`` allocator events, per device (CPU and GPU apart)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.config import AnalysisConfig
from kinetoscope.analyze.findings import Finding
from kinetoscope.analyze.registry import AnalysisResult, register
from kinetoscope.analyze.timeline import step_at, window
from kinetoscope.analyze.trace import RankTrace
from kinetoscope.analyze.units import us

MiB = 1024 * 1024


def device_label(device_type: int, device_id: int) -> str:
    return "cpu" if device_type == 0 else f"cuda:{device_id}"


def _series(group: pd.DataFrame) -> tuple[np.ndarray, str]:
    if group["total_allocated_bytes"].notna().all():
        return group["total_allocated_bytes"].to_numpy(np.int64), "allocator_total"
    # 2021 traces record only signed sizes: allocation relative to the first event
    return np.cumsum(group["bytes"].to_numpy(np.int64)), "cumulative_bytes"


def _asof(ts: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(ts, at, side="right") - 1
    out = values[np.maximum(idx, 0)].astype(np.float64)
    out[idx < 0] = np.nan
    return out


def _fit(steps: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """Least-squares slope (bytes/step) and R^2."""
    x = steps.astype(np.float64)
    y = values.astype(np.float64)
    x_c = x - x.mean()
    denom = float((x_c**2).sum())
    if denom == 0:
        return 0.0, 0.0
    slope = float((x_c * (y - y.mean())).sum() / denom)
    residual = y - (y.mean() + slope * x_c)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 0.0
    return slope, r2


def _op_at(trace: RankTrace, ts_ns: int, tid: str) -> str | None:
    ev = trace.events
    spans = np.flatnonzero((ev["ts_ns"].to_numpy() <= ts_ns) & (ev["end_ns"].to_numpy() >= ts_ns))
    sub = ev.iloc[spans]  # the few events spanning the time, then the op and thread tests
    hit = sub[(sub["kind"] == "cpu_op") & (sub["tid"] == tid)]
    if hit.empty:
        return None
    return str(hit.loc[hit["dur_ns"].idxmin(), "name"])


TIMELINE_POINTS = 2000


def _timeline(ts: np.ndarray, allocated: np.ndarray, reserved: np.ndarray | None, label: str) -> pd.DataFrame:
    """Allocated/reserved over time, at most TIMELINE_POINTS per device (each bin keeps its maximum)."""
    n = len(ts)
    bins = max(1, int(np.ceil(n / TIMELINE_POINTS)))
    starts = np.arange(0, n, bins)
    frame = pd.DataFrame({
        "ts_us": ts[starts] / 1000.0,
        "allocated_bytes": np.maximum.reduceat(allocated, starts),
        # fmax: a bin's maximum ignoring missing values, missing only when all are
        "reserved_bytes": np.fmax.reduceat(reserved, starts) if reserved is not None else np.nan,
    })
    return frame.assign(device=label)


def _device_metrics(trace: RankTrace, group: pd.DataFrame, config: AnalysisConfig) -> tuple[dict[str, Any], pd.DataFrame]:
    w = window(trace)
    ts = group["ts_ns"].to_numpy(np.int64)
    allocated, basis = _series(group)
    reserved = group["total_reserved_bytes"]
    has_reserved = bool(reserved.notna().all())
    in_window = (ts >= w.start_ns) & (ts <= w.end_ns)
    if not in_window.any():
        in_window = np.ones(ts.shape, dtype=bool)
    peak_i = int(np.flatnonzero(in_window)[np.argmax(allocated[in_window])])
    steps = trace.steps
    per_step = pd.DataFrame({"step": steps["step"].to_numpy(), "end_ns": steps["end_ns"].to_numpy()})
    per_step["allocated_bytes"] = _asof(ts, allocated, per_step["end_ns"].to_numpy())
    if has_reserved:
        per_step["reserved_bytes"] = _asof(ts, reserved.to_numpy(np.int64), per_step["end_ns"].to_numpy())
    else:
        per_step["reserved_bytes"] = np.nan
    per_step["fragmentation_bytes"] = per_step["reserved_bytes"] - per_step["allocated_bytes"]
    fit = per_step.dropna(subset=["allocated_bytes"])
    slope = r2 = rising = None
    steady = False
    if len(fit) >= config.memory_min_steps:
        slope, r2 = _fit(fit["step"].to_numpy(), fit["allocated_bytes"].to_numpy())
        deltas = np.diff(fit["allocated_bytes"].to_numpy())
        rising = float((deltas > 0).mean()) if deltas.size else 0.0
        steady = bool(
            slope >= config.memory_growth_min_bytes_per_step
            and r2 >= config.memory_growth_min_r2
            and rising >= config.memory_growth_min_rising_share
        )
    device_type = int(group["device_type"].iloc[0])
    device_id = int(group["device_id"].iloc[0])
    metrics = {
        "device": device_label(device_type, device_id),
        "basis": basis,
        "events": int(len(group)),
        "peak_allocated_bytes": int(allocated[peak_i]),
        "peak_us": us(ts[peak_i]),
        "peak_step": int(step_at(trace, np.array([ts[peak_i]]))[0]),
        "peak_op": _op_at(trace, int(ts[peak_i]), str(group["tid"].iloc[peak_i])),
        "peak_reserved_bytes": int(reserved.max()) if has_reserved else None,
        "growth_bytes_per_step": round(slope, 3) if slope is not None else None,
        "growth_r2": round(r2, 6) if r2 is not None else None,
        "rising_step_share": round(rising, 6) if rising is not None else None,
        "steady_growth": steady,
        "fragmentation_bytes_max": int(per_step["fragmentation_bytes"].max()) if per_step["fragmentation_bytes"].notna().any() else None,
        "steps_fitted": int(len(fit)),
    }
    if slope is not None:
        x = fit["step"].to_numpy(np.float64)
        intercept = float(fit["allocated_bytes"].mean() - slope * x.mean())
        per_step["growth_fit_bytes"] = intercept + slope * per_step["step"].to_numpy(np.float64)
    else:
        per_step["growth_fit_bytes"] = np.nan
    timeline = _timeline(ts, allocated, reserved.to_numpy(np.float64) if has_reserved else None, metrics["device"])
    return metrics, per_step.assign(device=metrics["device"]), timeline


def _total_memory(trace: RankTrace, device_id: int) -> int | None:
    for p in trace.meta.device_properties:
        if p.get("id") == device_id and isinstance(p.get("totalGlobalMem"), int):
            return int(p["totalGlobalMem"])
    return None


@register("memory", "Memory growth")
def analyze_memory(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Allocated/reserved at each step end, peak and the op at it, growth per step and whether it is a steady leak."""
    mem = trace.memory
    if mem.empty:
        return AnalysisResult(key="memory", metrics={"memory": None})
    devices, tables, timelines, findings = [], [], [], []
    for (device_type, device_id), group in mem.groupby(["device_type", "device_id"], sort=True):
        metrics, per_step, timeline = _device_metrics(trace, group, config)
        devices.append(metrics)
        tables.append(per_step)
        timelines.append(timeline)
        if metrics["steady_growth"]:
            findings.append(_growth_finding(trace, config, metrics, int(device_type), int(device_id)))
    gpu = [d for d in devices if d["device"] != "cpu"] or devices
    growth = [d["growth_bytes_per_step"] for d in gpu if d["growth_bytes_per_step"] is not None]
    summary = {
        "growth_bytes_per_step": max(growth) if growth else None,
        "peak_allocated_bytes": max(d["peak_allocated_bytes"] for d in gpu),
        "scope": "gpu" if any(d["device"] != "cpu" for d in devices) else "cpu",
        "devices": devices,
    }
    return AnalysisResult(
        key="memory",
        metrics={"memory": summary},
        tables={"memory_per_step": pd.concat(tables, ignore_index=True),
                "memory_timeline": pd.concat(timelines, ignore_index=True)},
        findings=tuple(findings),
    )


def _growth_finding(trace: RankTrace, config: AnalysisConfig, m: dict[str, Any], device_type: int, device_id: int) -> Finding:
    slope = m["growth_bytes_per_step"]
    total = _total_memory(trace, device_id) if device_type != 0 else None
    headroom = (total - (m["peak_reserved_bytes"] or m["peak_allocated_bytes"])) if total else None
    steps_to_oom = int(headroom / slope) if headroom is not None and slope > 0 else None
    critical = steps_to_oom is not None and steps_to_oom <= config.memory_critical_steps_to_oom
    return Finding(
        id="memory_growth",
        severity="critical" if critical else "warning",
        rank=trace.rank,
        title=f"{m['device']} memory grows {slope / MiB:.1f} MiB every step",
        evidence={
            "device": m["device"],
            "growth_bytes_per_step": slope,
            "r2": m["growth_r2"],
            "rising_step_share": m["rising_step_share"],
            "steps_fitted": m["steps_fitted"],
            "peak_allocated_bytes": m["peak_allocated_bytes"],
            "peak_op": m["peak_op"],
            "peak_step": m["peak_step"],
            "device_total_bytes": total,
            "steps_to_out_of_memory": steps_to_oom,
        },
        recommendation=(
            "Something keeps a reference every step. Usual causes: accumulating a loss or output tensor that "
            "still holds its graph (use loss.item() or .detach() when logging), appending tensors to a list, "
            "caches keyed by step. "
            + ("Compare torch.cuda.memory_snapshot() between steps to find the allocation site."
               if device_type != 0 else
               "Profile with record_shapes=True and with_stack=True to see which op allocates what is never freed.")
        ),
        impact_us=0.0,
    )
