"""Straggler: the rank whose slowness makes the others wait in collectives."""

from __future__ import annotations

import re

import numpy as np

from kinetoscope.analyze import intervals as iv
from kinetoscope.analyze.config import AnalysisConfig
from kinetoscope.analyze.findings import Finding
from kinetoscope.analyze.registry import AnalysisResult, register
from kinetoscope.analyze.analyzers.comm import collectives
from kinetoscope.analyze.timeline import intervals_of, loader_spans, window
from kinetoscope.analyze.trace import RankTrace, Trace

#: host-side collective annotations of CPU-only runs ("gloo:all_reduce", "nccl:all_reduce")
_COLLECTIVE_ANNOTATION_RE = re.compile(r"nccl|rccl|gloo", re.IGNORECASE)


def collective_ns(trace: RankTrace) -> int:
    """Union of collective kernels (GPU) or collective annotations (CPU-only gloo runs) in the window."""
    w = window(trace)
    frame = collectives(trace)
    if frame.empty:
        ev = trace.events
        frame = ev[ev["kind"].isin(("annotation", "cpu_op")) & ev["name"].astype(str).str.contains(_COLLECTIVE_ANNOTATION_RE)]
    return iv.measure(intervals_of(frame, w))


def rank_summary(r: RankTrace) -> dict[str, float | int]:
    """What the straggler check needs from one rank (batch computes it where the rank was loaded)."""
    w = window(r)
    return {
        "rank": r.rank,
        "collective_us": collective_ns(r) / 1000.0,
        "loader_us": iv.measure(intervals_of(loader_spans(r), w)) / 1000.0,
        "mean_step_us": float(r.steps["dur_ns"].mean()) / 1000.0 if len(r.steps) else w.dur_ns / 1000.0,
    }


def straggler_finding(rows: list[dict[str, float | int]], config: AnalysisConfig) -> Finding | None:
    """The rank the others wait for, from per-rank summaries; None when ranks are even."""
    if len(rows) < 2:
        return None
    comm = np.array([x["collective_us"] for x in rows], dtype=float)
    mean_step = float(np.mean([x["mean_step_us"] for x in rows]))
    spread = float(comm.max() - comm.min())
    if not (comm.max() > 0 and mean_step > 0 and spread / mean_step >= config.straggler_min_spread_fraction):
        return None
    slow = rows[int(np.argmin(comm))]
    others = [x for x in rows if x is not slow]
    waited = float(np.mean([x["collective_us"] for x in others]) - slow["collective_us"])
    loads_more = slow["loader_us"] > max(x["loader_us"] for x in others)
    return Finding(
        id="straggler",
        severity="warning",
        rank=int(slow["rank"]),
        title=f"Rank {slow['rank']} is the straggler: the other ranks wait {waited / 1000:.1f} ms longer in collectives",
        evidence={"ranks": rows, "spread_us": round(spread, 3), "mean_step_us": round(mean_step, 3),
                  "straggler_loader_us": slow["loader_us"]},
        recommendation=(
            "Rank {r} spends more time loading data than the others: balance the input pipeline "
            "(workers per rank, shard sizes, storage locality)." if loads_more else
            "Rank {r} does more work or runs slower: check uneven batch/sequence lengths, its GPU's clocks "
            "and thermals, and host contention on its node."
        ).format(r=slow["rank"]),
        impact_us=waited,
    )


@register("straggler", "Straggler rank", scope="job")
def analyze_straggler(trace: Trace, config: AnalysisConfig) -> AnalysisResult:
    """Compares ranks: the one spending least time in collectives is the one the others wait for."""
    if len(trace.ranks) < 2:
        return AnalysisResult(key="straggler", metrics={})
    rows = [rank_summary(r) for r in trace.ranks]
    finding = straggler_finding(rows, config)
    return AnalysisResult(key="straggler", metrics={"ranks": rows}, findings=(finding,) if finding else ())
