"""Communication: collective kernels (NCCL/RCCL, every generation's names), their overlap with compute,
and — across ranks — clock skew, wait versus transfer, and which rank each collective waited for."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze import intervals as iv
from kinetoscope.analyze.config import AnalysisConfig
from kinetoscope.analyze.registry import AnalysisResult, register
from kinetoscope.analyze.timeline import gpu_work, kernels, name_mask, window
from kinetoscope.analyze.trace import RankTrace, Trace
from kinetoscope.analyze.units import frac, us

#: ncclKernel_AllReduce_RING_LL_Sum_float (<= 2.18), ncclDevKernel_AllReduce_Sum_f32_RING_LL (>= 2.19), rccl
COLLECTIVE_RE = re.compile(r"^(?:void )?(?:nccl|rccl)(?:Dev)?Kernel|nccl:|^(?:void )?rccl", re.IGNORECASE)
_OP_RE = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)", re.IGNORECASE)


@lru_cache(maxsize=16)
def collectives(trace: RankTrace) -> pd.DataFrame:
    """Collective kernels in the window, in start order, with their operation name."""
    k = kernels(trace)
    coll = k[name_mask(k, COLLECTIVE_RE, search=True)]
    w = window(trace)
    coll = coll[(coll["end_ns"] > w.start_ns) & (coll["ts_ns"] < w.end_ns)].sort_values("ts_ns", kind="stable")
    op = coll["name"].astype(str).str.extract(_OP_RE, expand=False).fillna("other")
    return coll.assign(op=op.str.lower())


@register("comm", "Communication overlap")
def analyze_comm(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Collective time (union), how much of it overlaps compute kernels, and the exposed remainder."""
    coll = collectives(trace)
    if coll.empty:
        return AnalysisResult(key="comm", metrics={"comm": None})
    w = window(trace)
    work = gpu_work(trace)
    compute = work[(work["kind"] == "kernel") & ~work.index.isin(coll.index)]
    comm_set = iv.clip(iv.union(coll["ts_ns"].to_numpy(), coll["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    compute_set = iv.clip(iv.union(compute["ts_ns"].to_numpy(), compute["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    comm_ns = iv.measure(comm_set)
    overlap_ns = iv.measure(iv.intersect(comm_set, compute_set))
    by_op = coll.groupby("op")["dur_ns"].agg(["count", "sum"])
    metrics = {
        "collectives": int(len(coll)),
        "time_us": us(comm_ns),
        "fraction": frac(comm_ns, w.dur_ns),
        "fraction_of": "window",
        "overlap_fraction": frac(overlap_ns, comm_ns),
        "overlap_fraction_of": "collective time",
        "exposed_us": us(comm_ns - overlap_ns),
        "by_op": {str(k): {"count": int(r["count"]), "time_us": us(r["sum"])} for k, r in by_op.iterrows()},
    }
    return AnalysisResult(key="comm", metrics={"comm": metrics}, tables={"collectives": coll})


def _match(ranks: list[RankTrace]) -> list[pd.DataFrame]:
    """Collectives of each rank, truncated to a common count (the n-th collective of every rank is one call)."""
    tables = [collectives(r).reset_index(drop=True) for r in ranks]
    n = min(len(t) for t in tables)
    return [t.iloc[:n] for t in tables]


@register("collectives", "Collectives across ranks", scope="job")
def analyze_collectives(trace: Trace, config: AnalysisConfig) -> AnalysisResult:
    """Align rank clocks on collective ends, then split each collective into transfer (its shortest
    duration on any rank) and waiting (the rest), and name the rank each one waited for (the last to arrive)."""
    ranks = [r for r in trace.ranks if not collectives(r).empty]
    if len(ranks) < 2:
        return AnalysisResult(key="collectives", metrics={})
    tables = _match(ranks)
    n = len(tables[0])
    if n == 0:
        return AnalysisResult(key="collectives", metrics={})
    same_ops = all((t["op"].to_numpy() == tables[0]["op"].to_numpy()).all() for t in tables[1:])
    ends = np.vstack([t["end_ns"].to_numpy() for t in tables])      # ranks x collectives
    starts = np.vstack([t["ts_ns"].to_numpy() for t in tables])
    # a collective completes at the same instant on every rank: the median end offset is the clock skew
    skew = np.median(ends - ends[0], axis=1).astype(np.int64)
    aligned_starts = starts - skew[:, None]
    durations = ends - starts
    transfer = durations.min(axis=0)
    wait = durations - transfer
    last = aligned_starts.argmax(axis=0)
    rank_ids = [r.rank for r in ranks]
    per_rank = []
    for i, r in enumerate(rank_ids):
        per_rank.append({
            "rank": r,
            "clock_skew_us": us(int(skew[i])),
            "wait_us": us(int(wait[i].sum())),
            "transfer_us": us(int(transfer.sum())),
            "waited_for_count": int((last == i).sum()),
        })
    table = pd.DataFrame({
        "index": np.arange(n),
        "op": tables[0]["op"].to_numpy(),
        "transfer_us": transfer / 1000.0,
        "waited_for_rank": np.asarray(rank_ids)[last],
        **{f"wait_us_rank{r}": wait[i] / 1000.0 for i, r in enumerate(rank_ids)},
    })
    metrics: dict[str, Any] = {
        "matched": int(n),
        "ops_agree": bool(same_ops),
        "reference_rank": rank_ids[0],
        "ranks": per_rank,
        "most_waited_for_rank": int(rank_ids[int(np.bincount(last, minlength=len(rank_ids)).argmax())]),
    }
    return AnalysisResult(key="collectives", metrics=metrics, tables={"collectives": table})
