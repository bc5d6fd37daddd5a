"""Memory growth from ``[memory]`` allocator events, per device (CPU and GPU apart)."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.hostfacts import host_memory_share
from kinetoscope.analyze.model.results import Memory, MemoryDevice, MemoryResult
from kinetoscope.analyze.model.timeline import step_at, window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import us

MiB = 1024 * 1024


def device_label(device_type: int, device_id: int) -> str:
    return "cpu" if device_type == 0 else f"cuda:{device_id}"


def _series(group: pd.DataFrame) -> tuple[np.ndarray, str]:
    if group["total_allocated_bytes"].notna().all():
        return group["total_allocated_bytes"].to_numpy(np.int64), "allocator_total"
    # 2021 traces record only signed sizes: allocation relative to the first event
    return np.cumsum(group["bytes"].to_numpy(np.int64)), "cumulative_bytes"


class UnrecordedFrees(NamedTuple):
    """Frees of CPU blocks the trace did not record (``unrecorded_frees``)."""

    #: blocks allocated in the window at an address the trace still held live, and the bytes of the earlier blocks
    #: there: freed where the profiler does not record it
    blocks: int
    bytes: int
    #: blocks allocated in the window on the same thread and of the same size as two or more of those, with no free
    #: recorded by the trace's end, and their bytes: the same kind of buffer, most likely freed unseen too (nothing
    #: handed their addresses out again before the trace ended)
    like_live_blocks: int
    like_live_bytes: int


def unrecorded_frees(group: pd.DataFrame, start_ns: int, end_ns: int) -> UnrecordedFrees | None:
    """CPU blocks freed on a thread the profiler does not record (gloo's, a pin-memory thread): those allocated in
    ``[start_ns, end_ns]`` at an address the trace still held live (no free recorded since the last allocation
    there), and blocks like them (same thread, same size) still live at the trace's end. None where the trace records
    no addresses."""
    cols = ["addr", "bytes", "ts_ns"] + (["tid"] if "tid" in group else [])
    g = group[cols].dropna(subset=["addr", "bytes", "ts_ns"])
    if g.empty:
        return None
    order = np.lexsort((g["ts_ns"].to_numpy(np.int64), g["addr"].to_numpy(np.int64)))
    addr = g["addr"].to_numpy(np.int64)[order]
    size = g["bytes"].to_numpy(np.int64)[order]
    ts = g["ts_ns"].to_numpy(np.int64)[order]
    tid = (g["tid"].astype(str).to_numpy()[order] if "tid" in g else np.full(len(g), ""))
    again = (size[1:] > 0) & (size[:-1] > 0) & (addr[1:] == addr[:-1]) & (ts[1:] >= start_ns) & (ts[1:] <= end_ns)
    # a kind of block (thread, size) shown freed unseen more than once: a buffer handed out over and over (one such
    # block beside a leak of the same size is still the leak)
    seen = Counter(zip(tid[:-1][again].tolist(), size[:-1][again].tolist(), strict=True))
    kinds = {k for k, n in seen.items() if n >= 2}
    # an allocation is live at the end where it is its address's last event
    last = np.ones(len(addr), dtype=bool)
    last[:-1] = addr[1:] != addr[:-1]
    live = np.flatnonzero(last & (size > 0) & (ts >= start_ns) & (ts <= end_ns))
    like = live[[(t, b) in kinds for t, b in zip(tid[live].tolist(), size[live].tolist(), strict=True)]] \
        if kinds and len(live) else live[:0]
    return UnrecordedFrees(int(again.sum()), int(size[:-1][again].sum()), int(len(like)), int(size[like].sum()))


def _asof(ts: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(ts, at, side="right") - 1
    out = values[np.maximum(idx, 0)].astype(np.float64)
    out[idx < 0] = np.nan
    return out


def _fit(steps: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """Least-squares slope (bytes/step) and R^2 (reported beside the robust slope, not used to judge)."""
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


#: Theil-Sen over at most this many points (evenly thinned beyond): all pairs of 400 is 80k slopes
_ROBUST_POINTS = 400


def robust_slope(steps: np.ndarray, values: np.ndarray) -> float:
    """Theil-Sen slope: the median of the slopes between every pair of points. One outlier step (a
    spike, a warm-up allocation) moves it little, unlike a least-squares fit of three points."""
    x = np.asarray(steps, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if x.size > _ROBUST_POINTS:
        keep = np.linspace(0, x.size - 1, _ROBUST_POINTS).round().astype(np.int64)
        x, y = x[keep], y[keep]
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        return 0.0
    return float(np.median((y[j] - y[i])[ok] / dx[ok]))


def kendall_trend(values: np.ndarray) -> tuple[float, float]:
    """How consistently a series rises, and how sure that is: Kendall's tau ((pairs rising - pairs falling) /
    pairs, over every pair of points) and the Mann-Kendall z score of S = rising - falling (its variance
    n(n-1)(2n+5)/18, ties ignored: conservative). A leak that lands every other step, in chunks or under
    noise still rises between most pairs; noise around a flat line gives tau ~0, z ~0."""
    y = np.asarray(values, dtype=np.float64)
    if y.size > _ROBUST_POINTS:
        y = y[np.linspace(0, y.size - 1, _ROBUST_POINTS).round().astype(np.int64)]
    i, j = np.triu_indices(y.size, k=1)
    if not i.size:
        return 0.0, 0.0
    s = float(np.sign(y[j] - y[i]).sum())
    n = y.size
    var = n * (n - 1) * (2 * n + 5) / 18.0
    return s / i.size, s / np.sqrt(var)


def growth(steps: np.ndarray, values: np.ndarray) -> dict[str, float | int | None]:
    """How a per-step series grows: robust slope overall and over the later half (does the growth
    persist, or was it a warm-up that levelled off?), trend consistency (Kendall's tau), share of rising
    steps and least-squares R^2 (both for reference)."""
    n = int(len(values))
    if n < 2:
        return {"points": n, "slope": None, "late_slope": None, "tau": None, "trend_z": None, "rising_share": None,
                "r2": None}
    half = steps.size // 2
    late_x, late_y = steps[half:], values[half:]
    deltas = np.diff(values.astype(np.float64))
    tau, z = kendall_trend(values)
    return {
        "points": n,
        "slope": robust_slope(steps, values),
        "late_slope": robust_slope(late_x, late_y) if late_x.size >= 2 else None,
        "tau": tau,
        "trend_z": z,
        "rising_share": float((deltas > 0).mean()),
        "r2": _fit(steps, values)[1],
    }


def growth_floor(config: AnalysisConfig, total_bytes: int | None) -> float:
    """The least growth per step a leak is judged from: 1 MiB/step (allocator noise below), or less on a device
    whose memory is known, where growth taking a tenth of it over a long run is a leak however small per step."""
    floor = config.memory_growth_min_bytes_per_step
    if total_bytes:
        floor = min(floor, config.memory_leak_device_share * total_bytes / config.memory_leak_horizon_steps)
    return floor


def steady(g: dict[str, float | int | None], config: AnalysisConfig, floor: float | None = None) -> bool:
    """Growth a leak would show: enough steps, a robust slope past the noise floor (``growth_floor``), persisting
    into the later steps at half the rate or more, and a rise too consistent to be noise (Mann-Kendall)."""
    slope, late, z = g["slope"], g["late_slope"], g["trend_z"]
    return bool(
        int(g["points"] or 0) >= config.memory_min_steps
        and slope is not None and slope >= (config.memory_growth_min_bytes_per_step if floor is None else floor)
        and late is not None and late >= config.memory_growth_min_persistence * slope
        and z is not None and z >= config.memory_growth_min_trend_z
    )


def _op_at(trace: RankTrace, ts_ns: int, tid: str) -> str | None:
    ev = trace.events
    spans = np.flatnonzero((ev["ts_ns"].to_numpy() <= ts_ns) & (ev["end_ns"].to_numpy() >= ts_ns))
    sub = ev.iloc[spans]  # the few events spanning the time, then the op and thread tests
    hit = sub[(sub["kind"] == "cpu_op") & (sub["tid"] == tid)]
    if hit.empty:
        return None
    return str(hit.loc[hit["dur_ns"].idxmin(), "name"])


TIMELINE_POINTS = 2000


def _timeline(ts: np.ndarray, allocated: np.ndarray, reserved: np.ndarray | None, label: str,
              start_ns: int) -> pd.DataFrame:
    """Allocated/reserved over time, at most TIMELINE_POINTS per device (each bin keeps its maximum, and the
    allocated minimum too: a bin's dips are drawn, not hidden behind its peak); ``t_ms`` is the time from the
    window's start and the ``_mib`` columns the sizes in MiB, for display."""
    n = len(ts)
    bins = max(1, int(np.ceil(n / TIMELINE_POINTS)))
    starts = np.arange(0, n, bins)
    frame = pd.DataFrame({
        "ts_us": ts[starts] / 1000.0,
        "allocated_bytes": np.maximum.reduceat(allocated, starts),
        "allocated_min_bytes": np.minimum.reduceat(allocated, starts),
        # fmax: a bin's maximum ignoring missing values, missing only when all are
        "reserved_bytes": np.fmax.reduceat(reserved, starts) if reserved is not None else np.nan,
    })
    frame["t_ms"] = (ts[starts] - start_ns) / 1e6
    frame["allocated_mib"] = frame["allocated_bytes"] / 2**20
    frame["allocated_min_mib"] = frame["allocated_min_bytes"] / 2**20
    frame["reserved_mib"] = frame["reserved_bytes"] / 2**20
    return frame.assign(device=label)


def _device_metrics(
    trace: RankTrace, group: pd.DataFrame, config: AnalysisConfig
) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    w = window(trace)
    ts = group["ts_ns"].to_numpy(np.int64)
    allocated, basis = _series(group)
    reserved = group["total_reserved_bytes"]
    # the CPU allocator caches nothing: PyTorch writes "Total Reserved" 0 for it, which is no reserved figure
    # (allocated minus 0 read as a negative fragmentation)
    has_reserved = bool(reserved.notna().all()) and int(group["device_type"].iloc[0]) != 0
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
    x = fit["step"].to_numpy(np.float64)
    alloc_growth = growth(x, fit["allocated_bytes"].to_numpy(np.float64))
    fit_r = per_step.dropna(subset=["reserved_bytes"])
    res_growth = growth(fit_r["step"].to_numpy(np.float64), fit_r["reserved_bytes"].to_numpy(np.float64)) \
        if has_reserved else None
    slope = alloc_growth["slope"]
    device_type = int(group["device_type"].iloc[0])
    device_id = int(group["device_id"].iloc[0])
    floor = growth_floor(config, _total_memory(trace, device_id) if device_type != 0 else host_memory_share(trace)[0])
    metrics: dict[str, Any] = {
        "device": device_label(device_type, device_id),
        "basis": basis,
        "events": int(len(group)),
        "peak_allocated_bytes": int(allocated[peak_i]),
        "peak_us": us(ts[peak_i]),
        "peak_step": int(step_at(trace, np.array([ts[peak_i]]))[0]),
        "peak_op": _op_at(trace, int(ts[peak_i]), str(group["tid"].iloc[peak_i])),
        "peak_reserved_bytes": int(reserved.max()) if has_reserved else None,
        "growth_bytes_per_step": round(slope, 3) if slope is not None else None,
        "growth_method": "Theil-Sen slope of allocated bytes at step ends",
        "late_growth_bytes_per_step": round(alloc_growth["late_slope"], 3)
        if alloc_growth["late_slope"] is not None
        else None,
        "growth_r2": round(alloc_growth["r2"], 6) if alloc_growth["r2"] is not None else None,
        "rising_step_share": round(alloc_growth["rising_share"], 6)
        if alloc_growth["rising_share"] is not None
        else None,
        "growth_tau": round(alloc_growth["tau"], 6) if alloc_growth["tau"] is not None else None,
        "growth_trend_z": round(alloc_growth["trend_z"], 4) if alloc_growth["trend_z"] is not None else None,
        "steady_growth": steady(alloc_growth, config, floor),
        "reserved_growth_bytes_per_step": (
            round(res_growth["slope"], 3) if res_growth and res_growth["slope"] is not None else None
        ),
        "steady_reserved_growth": bool(res_growth and steady(res_growth, config, floor)),
        "fragmentation_bytes_max": int(per_step["fragmentation_bytes"].max())
        if per_step["fragmentation_bytes"].notna().any()
        else None,
        "steps_fitted": int(len(fit)),
    }
    # the CPU allocator's total in the trace comes down only for frees on threads the profiler records (a caching
    # GPU allocator reports its own totals, whatever thread frees): on the CPU, blocks allocated again at an address
    # still held live show frees it never took off
    missed = unrecorded_frees(group, w.start_ns, w.end_ns) if device_type == 0 else None
    metrics["unrecorded_frees"] = missed.blocks if missed is not None else None
    metrics["unrecorded_free_bytes"] = missed.bytes if missed is not None else None
    metrics["unrecorded_like_live_blocks"] = missed.like_live_blocks if missed is not None else None
    metrics["unrecorded_like_live_bytes"] = missed.like_live_bytes if missed is not None else None
    if slope is not None:
        intercept = float(np.median(fit["allocated_bytes"].to_numpy(np.float64) - slope * x))
        per_step["growth_fit_bytes"] = intercept + slope * per_step["step"].to_numpy(np.float64)
    else:
        per_step["growth_fit_bytes"] = np.nan
    timeline = _timeline(ts, allocated, reserved.to_numpy(np.float64) if has_reserved else None, metrics["device"],
                         w.start_ns)
    for col in ("allocated", "reserved", "growth_fit"):
        per_step[f"{col}_mib"] = per_step[f"{col}_bytes"] / 2**20
    return metrics, per_step.assign(device=metrics["device"]), timeline


def _total_memory(trace: RankTrace, device_id: int) -> int | None:
    for p in trace.meta.device_properties:
        if p.get("id") == device_id and isinstance(p.get("totalGlobalMem"), int):
            return int(p["totalGlobalMem"])
    return None


@register("memory", "Memory growth")
def analyze_memory(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Allocated/reserved at each step end, peak and the op at it, robust growth per step, and whether it
    is a leak (allocated grows and keeps growing), allocator growth (reserved grows, allocated flat), or
    too few steps to tell."""
    mem = trace.memory
    if mem.empty:
        return AnalysisResult(key="memory", metrics=MemoryResult(memory=None))
    devices, tables, timelines, findings = [], [], [], []
    for (device_type, device_id), group in mem.groupby(["device_type", "device_id"], sort=True):
        metrics, per_step, timeline = _device_metrics(trace, group, config)
        devices.append(metrics)
        tables.append(per_step)
        timelines.append(timeline)
        findings += _memory_findings(trace, config, metrics, int(device_type), int(device_id))
    gpu = [d for d in devices if d["device"] != "cpu"] or devices
    growth_values = [d["growth_bytes_per_step"] for d in gpu if d["growth_bytes_per_step"] is not None]
    summary = Memory(
        growth_bytes_per_step=max(growth_values) if growth_values else None,
        peak_allocated_bytes=max(d["peak_allocated_bytes"] for d in gpu),
        scope="gpu" if any(d["device"] != "cpu" for d in devices) else "cpu",
        devices=[MemoryDevice(**d) for d in devices],
    )
    return AnalysisResult(
        key="memory",
        metrics=MemoryResult(memory=summary),
        tables={"memory_per_step": pd.concat(tables, ignore_index=True),
                "memory_timeline": pd.concat(timelines, ignore_index=True)},
        findings=tuple(findings),
    )


def _steps_to_oom(
    trace: RankTrace, m: dict[str, Any], device_type: int, device_id: int, slope: float
) -> tuple[int | None, int | None, str]:
    """(the memory judged against, the steps until it runs out, what the title says of them)."""
    # the CPU's allocations against the host's memory the capture recorded (was: not judged, so a loop keeping every
    # step's attention maps attached, 6.75 MiB a step on a 23 GiB host - out of memory in ~3,400 steps - was a
    # warning, "the device's memory is not recorded"; two readers and their consensus: critical)
    if device_type != 0:
        total, said = _total_memory(trace, device_id), ""
        if total is None:
            return None, None, "the device's memory is not recorded"
    else:
        total, said = host_memory_share(trace)
        if total is None:
            return None, None, said
    peak = m["peak_reserved_bytes"] or m["peak_allocated_bytes"]
    if total - peak <= 0:  # the ranks do not share it alike (the CPU's counts start when profiling does)
        return total, None, (f"{said or 'the device'}: {_size(total)}, under the {_size(peak)} the trace already "
                             "counts, so not projected")
    steps = int((total - peak) / slope) if slope > 0 else None
    return total, steps, (f"out of memory in ~{steps:,} steps" + (f" ({said})" if said else "")
                          if steps is not None else "")


def _memory_findings(
    trace: RankTrace, config: AnalysisConfig, m: dict[str, Any], device_type: int, device_id: int
) -> list[Finding]:
    n = m["steps_fitted"]
    slope = m["growth_bytes_per_step"]
    if m["steady_growth"]:
        return [_growth_finding(trace, config, m, device_type, device_id)]
    if m["steady_reserved_growth"] and (slope is None or slope < config.reserved_growth_max_allocated_share
                                        * m["reserved_growth_bytes_per_step"]):
        return [_reserved_finding(trace, config, m, device_type, device_id)]
    if (n < config.memory_min_steps and slope is not None and slope >= config.memory_growth_min_bytes_per_step):
        return [Finding(
            id="memory_inconclusive",
            rank=trace.rank,
            title=(f"{m['device']} memory rose {slope / MiB:.1f} MiB per step over only {n} step ends: too few "
                   "to tell a leak from warm-up"),
            evidence={"device": m["device"], "steps_fitted": n, "growth_bytes_per_step": slope,
                      "steps_needed": config.memory_min_steps},
            recommendation=(f"Capture at least {max(config.memory_min_steps, 10)} active steps after warm-up "
                            "(Schedule(active=...)) with profile_memory=True to judge memory growth."),
        )]
    return []


def _growth_finding(
    trace: RankTrace, config: AnalysisConfig, m: dict[str, Any], device_type: int, device_id: int
) -> Finding:
    slope = m["growth_bytes_per_step"]
    n = m["steps_fitted"]
    total, steps_to_oom, projected = _steps_to_oom(trace, m, device_type, device_id, slope)
    critical = (steps_to_oom is not None and steps_to_oom <= config.memory_critical_steps_to_oom
                and n >= config.memory_critical_min_steps)
    # against the device's memory: a run of memory_leak_horizon_steps fails on it, or it has room for far longer
    roomy = steps_to_oom is not None and steps_to_oom > config.memory_leak_horizon_steps
    oom = f"; {projected}" if projected else ""
    # blocks freed on a thread the profiler does not record (DDP's buckets on gloo's) leave the CPU allocator's total
    # in the trace growing; those the trace shows (allocated again at an address still held live) are a lower bound
    # on them, and blocks like them (same thread, same size) still live at the trace's end most likely went the same
    # way (was: only the first, so an FSDP2 rank on gloo whose 1.13 MiB buffers were shown freed unseen 4 times, and
    # 4 more were live at the end, read as a 1.1 MiB-a-step leak, warning; readers: no leak): where they come to half
    # the growth or more, growth cannot be told from such frees (one such block beside a leak of its own is still
    # the leak)
    missed = m.get("unrecorded_frees") or 0
    like = m.get("unrecorded_like_live_blocks") or 0
    unseen_per_step = ((m.get("unrecorded_free_bytes") or 0) + (m.get("unrecorded_like_live_bytes") or 0)) / max(n, 1)
    blind = bool(missed) and unseen_per_step >= config.memory_unrecorded_free_share * slope
    alike = (f", and {like} more like them {'are' if like != 1 else 'is'} still live at the trace's end"
             if like else "")
    said = (f"; but {missed} block{'s were' if missed != 1 else ' was'} allocated again at addresses the trace "
            f"still held live{alike} ({_size(unseen_per_step)} a step most likely freed where the profiler does not "
            "record it, on a gloo or pin-memory thread, and never taken off the CPU allocator's total in the trace): "
            "this growth cannot be told from such frees" if blind else "")
    return Finding(
        id="memory_growth",
        severity="info" if blind or roomy else "critical" if critical else "warning",
        rank=trace.rank,
        title=(f"{m['device']} memory grows {_size(slope)} every step (judged over {n} steps){oom}"
               + (f", longer than a run of {config.memory_leak_horizon_steps:,} steps" if roomy else "") + said),
        evidence={
            "device": m["device"],
            "growth_bytes_per_step": slope,
            "method": m["growth_method"],
            "late_growth_bytes_per_step": m["late_growth_bytes_per_step"],
            "r2": m["growth_r2"],
            "rising_step_share": m["rising_step_share"],
            "tau": m["growth_tau"],
            "trend_z": m["growth_trend_z"],
            "steps_fitted": n,
            "peak_allocated_bytes": m["peak_allocated_bytes"],
            "peak_op": m["peak_op"],
            "peak_step": m["peak_step"],
            "device_total_bytes": total,
            "steps_to_out_of_memory": steps_to_oom,
            "unrecorded_frees": m.get("unrecorded_frees"),
            "unrecorded_free_bytes": m.get("unrecorded_free_bytes"),
            "unrecorded_like_live_blocks": m.get("unrecorded_like_live_blocks"),
            "unrecorded_like_live_bytes": m.get("unrecorded_like_live_bytes"),
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


def _size(per_step: float) -> str:
    return f"{per_step / MiB:.1f} MiB" if per_step >= MiB / 10 else f"{per_step / 1024:.1f} KiB"


def _reserved_finding(
    trace: RankTrace, config: AnalysisConfig, m: dict[str, Any], device_type: int, device_id: int
) -> Finding:
    slope = m["reserved_growth_bytes_per_step"]
    n = m["steps_fitted"]
    total, steps_to_oom, _ = _steps_to_oom(trace, m, device_type, device_id, slope)
    return Finding(
        id="reserved_memory_growth",
        severity="warning",
        rank=trace.rank,
        title=(f"{m['device']} reserved memory grows {slope / MiB:.1f} MiB every step while allocated memory stays "
               f"flat (allocator fragmentation; judged over {n} steps)"),
        evidence={
            "device": m["device"],
            "reserved_growth_bytes_per_step": slope,
            "allocated_growth_bytes_per_step": m["growth_bytes_per_step"],
            "steps_fitted": n,
            "peak_reserved_bytes": m["peak_reserved_bytes"],
            "peak_allocated_bytes": m["peak_allocated_bytes"],
            "fragmentation_bytes_max": m["fragmentation_bytes_max"],
            "device_total_bytes": total,
            "steps_to_out_of_memory": steps_to_oom,
        },
        recommendation=(
            "The caching allocator keeps reserving new blocks it cannot reuse (tensor sizes that change every step "
            "fragment its pool). Free large temporaries as soon as they are dead (del, or keep shapes fixed by "
            "padding), set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow instead of multiplying, "
            "and call torch.cuda.empty_cache() only at phase changes (e.g. after evaluation) where it helps - "
            "not every step, which costs a sync and re-allocation."
        ),
    )
