"""Host<->device copies: time, bytes, bandwidth, pageable vs pinned, overlap with compute.

Copy time is a union per device (two concurrent copies on two streams count once), and so is
every share of it. Host memory is what the copy's name says (``Pageable``/``Pinned``); where the
name does not say (ROCm writes ``Memcpy HtoD (Host -> Device)``) it is unknown, reported as
``null``, except for a copy whose launching call holds the host for the copy's whole duration:
that copy behaves as pageable/synchronous whatever its memory, and is counted as such.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.copies import copies
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.results import Copies, CopiesResult, CopyDevice, CopyHostMemory
from kinetoscope.analyze.model.timeline import Window, kernels, window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us

_PARTS = ("time", "overlapped", "pageable", "pinned", "blocking_unknown", "unknown")


def _device_ns(trace: RankTrace, sel: pd.DataFrame, w: Window) -> dict[int, dict[str, int]]:
    """Per device, the measure of: copy time (a union), copy time with a kernel on another stream of the
    same device, and copy time by host memory; plus the copies' time unclipped by the window."""
    k = kernels(trace)
    host = sel["host_memory"].to_numpy(object)
    blocking = sel["blocking"].to_numpy(bool)
    groups = {"pageable": host == "pageable", "pinned": host == "pinned",
              "blocking_unknown": (host == "unknown") & blocking, "unknown": (host == "unknown") & ~blocking}
    dev = sel["device"].to_numpy()
    out: dict[int, dict[str, int]] = {}
    for device in np.unique(dev):
        on = dev == device
        mine = sel[on]
        ns = {"time": iv.measure(_clip_union(mine, w)),
              "whole": iv.measure(iv.union(mine["ts_ns"].to_numpy(), mine["end_ns"].to_numpy()))}
        for name, mask in groups.items():
            ns[name] = iv.measure(_clip_union(sel[on & mask], w))
        on_k = k[(k["device"] == device).to_numpy()]
        overlapped = []
        for stream, group in mine.groupby("stream", sort=False):
            others = on_k[(on_k["stream"] != stream).to_numpy()]
            other_set = iv.union(others["ts_ns"].to_numpy(), others["end_ns"].to_numpy())
            overlapped.append(iv.intersect(_clip_union(group, w), other_set))
        ns["overlapped"] = iv.measure(_union_all(overlapped))
        ns["bytes"] = int(mine["bytes"].fillna(0).sum())
        ns["pageable_like"] = iv.measure(
            _union_all([_clip_union(sel[on & (groups["pageable"] | groups["blocking_unknown"])], w)])
        )
        out[int(device)] = ns
    return out


def _clip_union(frame: pd.DataFrame, w: Window) -> iv.Intervals:
    return iv.clip(iv.union(frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy()), w.start_ns, w.end_ns)


def _union_all(sets: list[iv.Intervals]) -> iv.Intervals:
    if not sets:
        return iv.EMPTY
    return iv.union(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


def _direction_metrics(trace: RankTrace, sel: pd.DataFrame, w: Window) -> dict[str, Any] | None:
    sel = sel[((sel["end_ns"] > w.start_ns) & (sel["ts_ns"] < w.end_ns)).to_numpy()]
    if sel.empty:
        return None
    per = _device_ns(trace, sel, w)
    total = {name: sum(d[name] for d in per.values()) for name in (*_PARTS, "whole", "bytes", "pageable_like")}
    time_ns = total["time"]
    busiest = max(per.values(), key=lambda d: d["time"])
    whole_s = total["whole"] / 1e9
    return {
        "count": int(len(sel)),
        "time_us": us(time_ns),
        "time_of": "a union per device, summed over devices",
        "fraction": frac(busiest["time"], w.dur_ns),
        "fraction_of": "window (the device with the most copy time)",
        "bytes": total["bytes"],
        # bytes over the copies' whole durations: a copy straddling the window's edge counts once, whole
        "bandwidth_gb_per_s": round(total["bytes"] / whole_s / 1e9, 3) if whole_s and total["bytes"] > 0 else None,
        "overlap_fraction": frac(total["overlapped"], time_ns),
        "overlap_fraction_of": "copy time",
        "pageable_fraction": frac(total["pageable_like"], time_ns) if total["unknown"] == 0 else None,
        "pageable_fraction_of": "copy time (named Pageable, or blocking the host for the whole copy)",
        "host_memory_us": {
            "pageable": us(total["pageable"]),
            "pinned": us(total["pinned"]),
            "unknown_but_blocking": us(total["blocking_unknown"]),
            "unknown": us(total["unknown"]),
        },
        "pageable_count": int(sel["pageable"].sum()),
        "pinned_count": int(sel["pinned"].sum()),
        "unknown_count": int((sel["host_memory"] == "unknown").sum()),
        "synchronous_count": int(sel["synchronous"].sum()),
        "blocking_count": int(sel["blocking"].sum()),
        "devices": [
            {
                "device": d,
                "time_us": us(v["time"]),
                "fraction": frac(v["time"], w.dur_ns),
                "overlap_fraction": frac(v["overlapped"], v["time"]),
                "bytes": v["bytes"],
            }
            for d, v in sorted(per.items())
        ],
        "_pageable_like_ns": total["pageable_like"],
        "_busiest_ns": busiest["time"],
    }


def _typed(m: dict[str, Any] | None) -> Copies | None:
    """A direction's figures as its record (the findings' own figures, ``_*_ns``, left out)."""
    if m is None:
        return None
    shown = {k: v for k, v in m.items() if not k.startswith("_")}
    return Copies(**{**shown, "host_memory_us": CopyHostMemory(**m["host_memory_us"]),
                     "devices": [CopyDevice(**d) for d in m["devices"]]})


@register("copies", "H2D / D2H copies")
def analyze_copies(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """H2D and D2H copies: time (union per device), bytes, bandwidth, host memory (pageable, pinned or
    unknown), synchronous and blocking calls, overlap with kernels on other streams."""
    if not trace.has_gpu:
        return AnalysisResult(key="copies", metrics=CopiesResult(h2d=None, d2h=None))
    w = window(trace)
    table = copies(trace)
    h2d = _direction_metrics(trace, table[(table["direction"] == "HtoD").to_numpy()], w)
    d2h = _direction_metrics(trace, table[(table["direction"] == "DtoH").to_numpy()], w)
    findings: list[Finding] = []
    if h2d:
        findings += _h2d_findings(trace, config, w, h2d)
    copy_table = table[["ts_ns", "dur_ns", "name", "device", "stream", "bytes", "direction", "host_memory", "pageable",
                        "pinned", "launched_by", "synchronous", "blocking"]]
    return AnalysisResult(key="copies", metrics=CopiesResult(h2d=_typed(h2d), d2h=_typed(d2h)),
                          tables={"copies": copy_table},
                          findings=tuple(findings))


def _h2d_findings(trace: RankTrace, config: AnalysisConfig, w: Window, h2d: dict[str, Any]) -> list[Finding]:
    findings = []
    time_ns = (h2d["time_us"] or 0) * 1000
    busiest_ns = h2d["_busiest_ns"]
    pageable_ns = h2d["_pageable_like_ns"]
    if w.dur_ns and pageable_ns / w.dur_ns >= config.pageable_min_fraction:
        named = h2d["pageable_count"]
        inferred = h2d["host_memory_us"]["unknown_but_blocking"]
        what = (f"{named} host-to-device copies come from pageable memory" if named else
                "host-to-device copies block the host for their whole duration (pageable or synchronous)")
        findings.append(Finding(
            id="h2d_pageable",
            rank=trace.rank,
            title=f"{what} ({pageable_ns / w.dur_ns:.1%} of the {w.dur_ns / 1e6:.1f} ms window)",
            evidence={
                "pageable_count": named,
                "pageable_time_us": us(pageable_ns),
                "pageable_fraction_of_window": frac(pageable_ns, w.dur_ns),
                "pageable_fraction_of_copy_time": h2d["pageable_fraction"],
                "host_memory_us": h2d["host_memory_us"],
                "inferred_from_blocking_calls": bool(inferred),
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
        ))
    overlap = h2d["overlap_fraction"] or 0.0
    exposed_ns = time_ns * (1 - overlap)
    if w.dur_ns and busiest_ns / w.dur_ns >= config.copy_min_fraction and overlap < config.overlap_min_fraction:
        findings.append(Finding(
            id="h2d_not_overlapped",
            rank=trace.rank,
            title=(f"Host-to-device copies ({busiest_ns / w.dur_ns:.0%} of the {w.dur_ns / 1e6:.1f} ms window) overlap "
                   f"compute only {overlap:.0%} of their time"),
            evidence={
                "h2d_time_us": h2d["time_us"],
                "h2d_fraction_of_window": h2d["fraction"],
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
        ))
    return findings
