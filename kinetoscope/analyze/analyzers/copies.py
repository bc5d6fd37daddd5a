"""Host<->device copies: time, bytes, bandwidth, pageable vs pinned, overlap with compute."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import pandas as pd

from kinetoscope.analyze import intervals as iv
from kinetoscope.analyze.config import AnalysisConfig
from kinetoscope.analyze.findings import Finding
from kinetoscope.analyze.registry import AnalysisResult, register
from kinetoscope.analyze.timeline import Window, gpu_work, kernels, runtime_calls, window
from kinetoscope.analyze.trace import RankTrace
from kinetoscope.analyze.units import frac, us

# "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memcpy DtoD (Device -> Device)"
_DIRECTION_RE = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP|HtoH)\b")
_HOST_MEMORY_RE = re.compile(r"\b(Pageable|Pinned)\b")
_SYNC_COPY_RE = re.compile(r"^(cuda|hip)Memcpy(WithStream)?$|^cuMemcpy(HtoD|DtoH)(_v2)?$")


@lru_cache(maxsize=16)
def copies(trace: RankTrace) -> pd.DataFrame:
    """Every memcpy on the device, with direction, host memory kind and the call that launched it."""
    work = gpu_work(trace)
    mem = work[work["kind"] == "memcpy"]
    names = mem["name"].astype(str)
    direction = names.str.extract(_DIRECTION_RE, expand=False).fillna("other")
    host_kind = names.str.extract(_HOST_MEMORY_RE, expand=False)
    runtime = runtime_calls(trace)
    runtime = runtime[runtime["correlation"].notna()]
    launcher = runtime.drop_duplicates("correlation").set_index("correlation")["name"].astype(str)
    called = mem["correlation"].map(launcher)
    return mem.assign(
        direction=direction,
        pageable=host_kind.eq("Pageable").fillna(False).astype(bool),
        pinned=host_kind.eq("Pinned").fillna(False).astype(bool),
        launched_by=called.astype("string"),
        synchronous=called.fillna("").astype(str).str.match(_SYNC_COPY_RE).astype(bool),
    )


def h2d_copies(trace: RankTrace) -> pd.DataFrame:
    c = copies(trace)
    return c[c["direction"] == "HtoD"]


def _overlap_ns(trace: RankTrace, sel: pd.DataFrame, w: Window) -> tuple[int, int]:
    """(copy time, copy time with a kernel running on another stream of the same device)."""
    k = kernels(trace)
    total = overlapped = 0
    for (device, stream), group in sel.groupby(["device", "stream"], sort=False):
        mine = iv.clip(iv.union(group["ts_ns"].to_numpy(), group["end_ns"].to_numpy()), w.start_ns, w.end_ns)
        others = k[(k["device"] == device) & (k["stream"] != stream)]
        other_set = iv.union(others["ts_ns"].to_numpy(), others["end_ns"].to_numpy())
        total += iv.measure(mine)
        overlapped += iv.measure(iv.intersect(mine, other_set))
    return total, overlapped


def _direction_metrics(trace: RankTrace, sel: pd.DataFrame, w: Window) -> dict[str, Any] | None:
    sel = sel[(sel["end_ns"] > w.start_ns) & (sel["ts_ns"] < w.end_ns)]
    if sel.empty:
        return None
    time_ns, overlapped_ns = _overlap_ns(trace, sel, w)
    pageable_ns, _ = _overlap_ns(trace, sel[sel["pageable"]], w) if sel["pageable"].any() else (0, 0)
    total_bytes = int(sel["bytes"].fillna(0).sum())
    busy_s = time_ns / 1e9
    return {
        "count": int(len(sel)),
        "time_us": us(time_ns),
        "fraction": frac(time_ns, w.dur_ns),
        "fraction_of": "window",
        "bytes": total_bytes,
        "bandwidth_gb_per_s": round(total_bytes / busy_s / 1e9, 3) if busy_s else None,
        "overlap_fraction": frac(overlapped_ns, time_ns),
        "overlap_fraction_of": "copy time",
        "pageable_fraction": frac(pageable_ns, time_ns),
        "pageable_fraction_of": "copy time",
        "pageable_count": int(sel["pageable"].sum()),
        "pinned_count": int(sel["pinned"].sum()),
        "synchronous_count": int(sel["synchronous"].sum()),
    }


@register("copies", "H2D / D2H copies")
def analyze_copies(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """H2D and D2H copies: time (union), bytes, bandwidth, pageable share, synchronous calls, overlap with kernels."""
    if not trace.has_gpu:
        return AnalysisResult(key="copies", metrics={"h2d": None, "d2h": None})
    w = window(trace)
    table = copies(trace)
    h2d = _direction_metrics(trace, table[table["direction"] == "HtoD"], w)
    d2h = _direction_metrics(trace, table[table["direction"] == "DtoH"], w)
    findings: list[Finding] = []
    if h2d:
        time_ns = (h2d["time_us"] or 0) * 1000
        pageable_ns = time_ns * (h2d["pageable_fraction"] or 0)
        if w.dur_ns and pageable_ns / w.dur_ns >= config.pageable_min_fraction:
            findings.append(
                Finding(
                    id="h2d_pageable",
                    severity="warning",
                    rank=trace.rank,
                    title=f"{h2d['pageable_count']} host-to-device copies come from pageable memory ({pageable_ns / w.dur_ns:.1%} of the window)",
                    evidence={
                        "pageable_count": h2d["pageable_count"],
                        "pageable_time_us": round(pageable_ns / 1000, 3),
                        "pageable_fraction_of_copy_time": h2d["pageable_fraction"],
                        "synchronous_count": h2d["synchronous_count"],
                        "bandwidth_gb_per_s": h2d["bandwidth_gb_per_s"],
                        "bytes": h2d["bytes"],
                    },
                    recommendation=(
                        "Pageable copies are staged through a driver buffer, run at a fraction of PCIe/NVLink "
                        "bandwidth and block the host. Use DataLoader(pin_memory=True) (or tensor.pin_memory()) and "
                        "tensor.to(device, non_blocking=True)."
                    ),
                    impact_us=pageable_ns / 1000.0,
                )
            )
        exposed_ns = time_ns * (1 - (h2d["overlap_fraction"] or 0))
        if (
            w.dur_ns
            and time_ns / w.dur_ns >= config.copy_min_fraction
            and (h2d["overlap_fraction"] or 0) < config.overlap_min_fraction
        ):
            findings.append(
                Finding(
                    id="h2d_not_overlapped",
                    severity="warning",
                    rank=trace.rank,
                    title=f"Host-to-device copies ({time_ns / w.dur_ns:.0%} of the window) overlap compute only {h2d['overlap_fraction'] or 0:.0%} of their time",
                    evidence={
                        "h2d_time_us": h2d["time_us"],
                        "overlap_fraction_of_copy_time": h2d["overlap_fraction"],
                        "exposed_copy_time_us": round(exposed_ns / 1000, 3),
                        "count": h2d["count"],
                        "bytes": h2d["bytes"],
                    },
                    recommendation=(
                        "Copy the next batch while the current one computes: pinned memory plus non_blocking=True, "
                        "issued on a side stream (a CUDA-stream prefetcher) one step ahead."
                    ),
                    impact_us=exposed_ns / 1000.0,
                )
            )
    copy_table = table[["ts_ns", "dur_ns", "name", "device", "stream", "bytes", "direction", "pageable", "pinned",
                        "launched_by", "synchronous"]]
    return AnalysisResult(key="copies", metrics={"h2d": h2d, "d2h": d2h}, tables={"copies": copy_table},
                          findings=tuple(findings))
