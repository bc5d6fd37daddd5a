"""CUDA stream gaps: busy and idle per device and stream, and why the GPU waited."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze import intervals as iv
from kinetoscope.analyze.config import AnalysisConfig
from kinetoscope.analyze.findings import Finding
from kinetoscope.analyze.registry import AnalysisResult, register
from kinetoscope.analyze.timeline import (
    Window,
    any_gpu_busy,
    device_busy,
    gpu_work,
    host_busy,
    intervals_of,
    loader_spans,
    step_at,
    sync_calls,
    window,
)
from kinetoscope.analyze.trace import RankTrace
from kinetoscope.analyze.units import frac, us

#: Idle time is attributed to the first cause that covers it, in this order.
CAUSES = ("data_wait", "sync", "host_launch", "other")


def _stream_table(trace: RankTrace, w: Window) -> pd.DataFrame:
    rows = []
    for (device, stream), g in gpu_work(trace).groupby(["device", "stream"], sort=True):
        busy = intervals_of(g, w)
        busy_ns = iv.measure(busy)
        gaps = iv.complement(busy, w.start_ns, w.end_ns)
        gap_lengths = gaps[1] - gaps[0]
        rows.append(
            {
                "device": int(device),
                "stream": int(stream),
                "kernels": int((g["kind"] == "kernel").sum()),
                "copies": int((g["kind"] == "memcpy").sum()),
                "memsets": int((g["kind"] == "memset").sum()),
                "busy_us": busy_ns / 1000.0,
                "idle_us": (w.dur_ns - busy_ns) / 1000.0,
                "idle_fraction": frac(w.dur_ns - busy_ns, w.dur_ns),
                "largest_gap_us": float(gap_lengths.max()) / 1000.0 if gap_lengths.size else 0.0,
            }
        )
    return pd.DataFrame(rows)


def _attribute(idle: iv.Intervals, causes: dict[str, iv.Intervals]) -> dict[str, iv.Intervals]:
    """Split idle time among causes without double counting (first cause wins)."""
    remaining = idle
    out: dict[str, iv.Intervals] = {}
    for name in CAUSES[:-1]:
        out[name] = iv.intersect(remaining, causes[name])
        remaining = iv.subtract(remaining, causes[name])
    out["other"] = remaining
    return out


def _gap_table(trace: RankTrace, device: int, gaps: iv.Intervals, parts: dict[str, iv.Intervals], config: AnalysisConfig) -> pd.DataFrame:
    lengths = gaps[1] - gaps[0]
    big = lengths >= config.min_gap_us * 1000
    starts, ends, lengths = gaps[0][big], gaps[1][big], lengths[big]
    order = np.argsort(-lengths, kind="stable")[: config.top_gaps]
    starts, ends, lengths = starts[order], ends[order], lengths[order]
    by_cause = {c: iv.overlap_each(starts, ends, parts[c]) for c in CAUSES}
    matrix = np.vstack([by_cause[c] for c in CAUSES]) if len(starts) else np.zeros((len(CAUSES), 0))
    cause = [CAUSES[i] for i in matrix.argmax(axis=0)] if len(starts) else []
    table = pd.DataFrame(
        {
            "device": np.full(len(starts), device, dtype=np.int64),
            "start_ns": starts,
            "start_us": starts / 1000.0,
            "dur_us": lengths / 1000.0,
            "step": step_at(trace, starts),
            "cause": cause,
        }
    )
    for c in CAUSES:
        table[f"{c}_us"] = by_cause[c] / 1000.0
    return table


@register("gpu", "CUDA stream gaps")
def analyze_gpu(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Per device and stream: busy (kernels, copies, memsets as a union), idle, largest gaps and their causes."""
    if not trace.has_gpu:
        return AnalysisResult(key="gpu", metrics={"gpu": None})
    w = window(trace)
    streams = _stream_table(trace, w)
    causes = {
        "data_wait": intervals_of(loader_spans(trace), w),
        "sync": intervals_of(sync_calls(trace), w),
        "host_launch": host_busy(trace),
    }
    devices: list[dict[str, Any]] = []
    idle_by_device: list[int] = []
    gap_tables = []
    findings: list[Finding] = []
    for device, busy in device_busy(trace).items():
        idle = iv.complement(busy, w.start_ns, w.end_ns)
        parts = _attribute(idle, causes)
        idle_ns = iv.measure(idle)
        idle_by_device.append(idle_ns)
        gaps = _gap_table(trace, device, idle, parts, config)
        gap_tables.append(gaps)
        by_cause_ns = {c: iv.measure(parts[c]) for c in CAUSES}
        devices.append(
            {
                "device": device,
                "busy_us": us(iv.measure(busy)),
                "idle_us": us(idle_ns),
                "idle_fraction": frac(idle_ns, w.dur_ns),
                "idle_by_cause_us": {c: us(v) for c, v in by_cause_ns.items()},
                "largest_gaps": [
                    {"start_us": r.start_us, "dur_us": round(r.dur_us, 3), "step": int(r.step), "cause": r.cause}
                    for r in gaps.itertuples()
                ],
            }
        )
        findings += _device_findings(trace, config, w, device, idle_ns, by_cause_ns, gaps)
    all_idle = iv.complement(any_gpu_busy(trace), w.start_ns, w.end_ns)
    metrics = {
        "idle_fraction": frac(max(idle_by_device), w.dur_ns) if idle_by_device else None,
        "fraction_of": "window",
        "any_device_idle_us": us(iv.measure(all_idle)),
        "devices": devices,
        "streams": streams.to_dict("records"),
    }
    gaps_all = pd.concat(gap_tables, ignore_index=True) if gap_tables else pd.DataFrame()
    findings += _launch_bound(trace, config, w, devices)
    tables = {"streams": streams, "gaps": gaps_all, "gpu_per_step": _per_step(trace)}
    return AnalysisResult(key="gpu", metrics={"gpu": metrics}, tables=tables, findings=tuple(findings))


def _per_step(trace: RankTrace) -> pd.DataFrame:
    """Per step and device: busy (union of all streams) and idle, in us."""
    rows = []
    for device, busy in device_busy(trace).items():
        for s in trace.steps.itertuples():
            b = iv.measure(iv.clip(busy, int(s.start_ns), int(s.end_ns)))
            rows.append({"step": int(s.step), "device": device, "busy_us": b / 1000.0, "idle_us": (s.dur_ns - b) / 1000.0})
    return pd.DataFrame(rows, columns=["step", "device", "busy_us", "idle_us"])


def _device_findings(trace: RankTrace, config: AnalysisConfig, w: Window, device: int, idle_ns: int,
                     by_cause_ns: dict[str, int], gaps: pd.DataFrame) -> list[Finding]:
    out = []
    share = idle_ns / w.dur_ns if w.dur_ns else 0.0
    if share >= config.gpu_idle_warning:
        main = max(CAUSES, key=lambda c: by_cause_ns[c])
        advice = {
            "data_wait": "the GPU waits for input: see the loader_stall finding (more DataLoader workers, prefetching).",
            "sync": "the host blocks on the device: remove .item()/.cpu()/synchronize calls from the step (see sync_point).",
            "host_launch": "the host cannot launch work fast enough: fuse small ops (torch.compile), use CUDA graphs, or grow the batch.",
            "other": "the host is doing untraced work between launches (Python code, I/O, logging): profile with with_stack=True to find it.",
        }[main]
        out.append(
            Finding(
                id="gpu_idle",
                severity="critical" if share >= config.gpu_idle_critical else "warning",
                rank=trace.rank,
                title=f"GPU {device} is idle {share:.0%} of the window, mostly {main.replace('_', ' ')}",
                evidence={
                    "device": device,
                    "idle_us": us(idle_ns),
                    "idle_fraction_of_window": frac(idle_ns, w.dur_ns),
                    "idle_by_cause_us": {c: us(v) for c, v in by_cause_ns.items()},
                    "largest_gaps": gaps.head(3)[["start_us", "dur_us", "step", "cause"]].to_dict("records"),
                },
                recommendation=advice,
                impact_us=idle_ns / 1000.0,
            )
        )
    sync_ns = by_cause_ns["sync"]
    if w.dur_ns and sync_ns / w.dur_ns >= config.sync_idle_fraction:
        calls = sync_calls(trace)
        in_window = calls[(calls["end_ns"] > w.start_ns) & (calls["ts_ns"] < w.end_ns)]
        top = in_window.groupby("name", observed=True)["dur_ns"].agg(["count", "sum"]).sort_values("sum", ascending=False).head(5)
        out.append(
            Finding(
                id="sync_point",
                severity="warning",
                rank=trace.rank,
                title=f"Host-device synchronisation leaves GPU {device} idle {sync_ns / w.dur_ns:.0%} of the window",
                evidence={
                    "device": device,
                    "gpu_idle_during_sync_us": us(sync_ns),
                    "calls": [{"name": str(n), "count": int(r["count"]), "time_us": us(r["sum"])} for n, r in top.iterrows()],
                    "steps": int(len(trace.steps)),
                },
                recommendation=(
                    "Each sync drains the launch queue. Keep values on the device (accumulate losses as tensors, "
                    "log every N steps), avoid .item()/.cpu()/print of CUDA tensors inside the step, and prefer "
                    "non_blocking copies and events over cudaDeviceSynchronize."
                ),
                impact_us=sync_ns / 1000.0,
            )
        )
    return out


def _launch_bound(trace: RankTrace, config: AnalysisConfig, w: Window, devices: list[dict[str, Any]]) -> list[Finding]:
    kernels = gpu_work(trace)
    kernels = kernels[(kernels["kind"] == "kernel") & (kernels["ts_ns"] >= w.start_ns) & (kernels["ts_ns"] < w.end_ns)]
    if kernels.empty:
        return []
    short_share = float((kernels["dur_ns"] < config.short_kernel_us * 1000).mean())
    out = []
    for d in devices:
        idle_ns = (d["idle_us"] or 0) * 1000
        launch_ns = (d["idle_by_cause_us"]["host_launch"] or 0) * 1000
        if (
            w.dur_ns
            and idle_ns / w.dur_ns >= config.gpu_idle_warning
            and launch_ns / max(idle_ns, 1) >= config.launch_idle_share
            and short_share >= config.short_kernel_share
        ):
            steps = max(len(trace.steps), 1)
            out.append(
                Finding(
                    id="launch_bound",
                    severity="warning",
                    rank=trace.rank,
                    title=f"Launch-bound: GPU {d['device']} waits on the host launching many short kernels",
                    evidence={
                        "device": d["device"],
                        "kernels": int(len(kernels)),
                        "kernels_per_step": round(len(kernels) / steps, 1),
                        "short_kernel_share": round(short_share, 4),
                        "median_kernel_us": us(float(kernels["dur_ns"].median())),
                        "gpu_idle_while_host_launches_us": us(launch_ns),
                    },
                    recommendation=(
                        "Fewer, larger kernels: torch.compile (fusion), CUDA graphs (torch.compile(mode='reduce-overhead')), "
                        "a larger batch, or fused optimizers (foreach/fused=True)."
                    ),
                    impact_us=launch_ns / 1000.0,
                )
            )
    return out
