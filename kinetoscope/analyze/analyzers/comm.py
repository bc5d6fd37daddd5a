"""Communication: collective kernels (NCCL/RCCL, every generation's names), what the trace says about
each (process group, sequence number, message size), and their overlap with compute. The matching
across ranks is ``distributed``; the job-level analyzer is in ``straggler``."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.registry import AnalysisResult, register
from kinetoscope.analyze.model.distributed import normalise_op
from kinetoscope.analyze.model.timeline import gpu_work, kernels, kind_mask, missing_activity, name_mask, window
from kinetoscope.analyze.model.trace import RankTrace, trace_view
from kinetoscope.analyze.model.units import frac, us

#: ncclKernel_AllReduce_RING_LL_Sum_float (<= 2.18), ncclDevKernel_AllReduce_Sum_f32_RING_LL (>= 2.19), rccl
COLLECTIVE_RE = re.compile(r"^(?:void )?(?:nccl|rccl)(?:Dev)?Kernel|nccl:|^(?:void )?rccl", re.IGNORECASE)
_OP_RE = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)", re.IGNORECASE)


#: a process group's ranks written out longer than this are named by their first and last ranks, their count and a
#: hash of the whole list: a 1,024-rank group's list is ~6 KB, repeated on every collective of every rank's summary
GROUP_RANKS_MAX_CHARS = 64


def group_name(pg_name: object, pg_ranks: object) -> str:
    """A process group's name as the matching across ranks keys it: its name and its ranks as written
    ("0 [0, 1, 2, 3]"), the ranks abbreviated past GROUP_RANKS_MAX_CHARS ("0 [0, 1, …, 1023] (1024 ranks,
    #3f2a9c1b)": the same group is named alike on every rank, and two groups differing anywhere are told apart)."""
    if pg_ranks is None or pg_ranks != pg_ranks:
        return str(pg_name) if pg_name is not None and pg_name == pg_name else "default"
    text = str(pg_ranks)
    if len(text) > GROUP_RANKS_MAX_CHARS:
        items = [x.strip() for x in text.strip("[]() ").split(",")]
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        text = f"[{items[0]}, {items[1]}, …, {items[-1]}] ({len(items)} ranks, #{digest})" if len(items) > 2 else \
            f"({len(text)} chars, #{digest})"
    return f"{pg_name} {text}"


@trace_view
def collectives(trace: RankTrace) -> pd.DataFrame:
    """Collective kernels in the window, in start order, with what the trace says about each: operation,
    process group, sequence number, message sizes (from the kernel's own args, else from the
    ``record_param_comms`` op that launched it, matched on External id)."""
    k = kernels(trace)
    coll = k[name_mask(k, COLLECTIVE_RE, search=True)]
    w = window(trace)
    # a collective kernel of no duration is a broken record (a negative duration clamped at load): never evidence
    coll = coll[((coll["end_ns"] > w.start_ns) & (coll["ts_ns"] < w.end_ns) & (coll["dur_ns"] > 0)).to_numpy()]
    coll = coll.sort_values("ts_ns", kind="stable")
    meta = trace.comm_args.set_index("row")
    # metadata on the kernel itself, else on the op that launched it (same External id)
    ev = trace.events
    ops_meta = meta[meta.index.isin(np.flatnonzero(kind_mask(ev, ("cpu_op",))))]
    by_external = ops_meta.assign(ext=ev["external_id"].to_numpy()[ops_meta.index.to_numpy()])
    by_external = by_external[by_external["ext"].notna()].drop_duplicates("ext").set_index("ext")
    own = meta.reindex(coll.index)
    via = by_external.reindex(coll["external_id"].to_numpy())
    via.index = coll.index

    def pick(col: str) -> pd.Series:
        return own[col].astype(object).where(own[col].notna(), via[col].astype(object))

    name_op = coll["name"].astype(str).str.extract(_OP_RE, expand=False).fillna("other")
    coll_name = pick("coll_name")
    op = [normalise_op(str(c)) if c is not None and c == c else normalise_op(str(n)) for c, n in zip(coll_name, name_op)]
    group = pick("pg_name")
    ranks = pick("pg_ranks")
    keys: dict[tuple[object, object], str] = {}
    group_key = []
    for g, r in zip(group, ranks):
        k = keys.get((g, r))
        if k is None:
            k = keys[(g, r)] = group_name(g, r)
        group_key.append(k)
    return coll.assign(op=op, group=group_key, seq=pd.array(pick("seq"), dtype="Int64"),
                       in_nelems=pd.array(pick("in_nelems"), dtype="Int64"),
                       out_nelems=pd.array(pick("out_nelems"), dtype="Int64"))


@trace_view
def comm_compute_sets(trace: RankTrace) -> tuple[iv.Intervals, iv.Intervals]:
    """The window's time in collective kernels and in the other (compute) kernels, each a union."""
    coll = collectives(trace)
    w = window(trace)
    work = gpu_work(trace)
    compute = work[(work["kind"] == "kernel") & ~work.index.isin(coll.index)]
    comm_set = iv.clip(iv.union(coll["ts_ns"].to_numpy(), coll["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    compute_set = iv.clip(iv.union(compute["ts_ns"].to_numpy(), compute["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    return comm_set, compute_set


def _exposed_by_op(coll: pd.DataFrame, exposed: iv.Intervals, w: Any) -> dict[str, int]:
    """Exposed time per collective kind (a union per kind: concurrent collectives of two kinds count for each)."""
    out = {}
    for op, g in coll.groupby("op", sort=True):
        mine = iv.clip(iv.union(g["ts_ns"].to_numpy(), g["end_ns"].to_numpy()), w.start_ns, w.end_ns)
        out[str(op)] = iv.measure(iv.intersect(mine, exposed))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


_OVERLAP_ADVICE = {
    "allreduce": "DDP's gradient all-reduce: let it overlap backward (smaller bucket_cap_mb so buckets start earlier, "
                  "gradient_as_bucket_view=True, static_graph=True; under gradient accumulation, no_sync() on the "
                  "micro-steps that do not step)",
    "allgather": "FSDP's parameter all-gathers: prefetch them (forward_prefetch / backward_prefetch, FSDP2's "
                  "reshard_after_forward) so each runs behind the previous layer's compute",
    "reducescatter": "FSDP's gradient reduce-scatters: let them overlap backward (backward_prefetch, a limit on "
                      "in-flight all-gathers that leaves room for them)",
    "alltoall": "all-to-all (embedding or expert exchange): pipeline it with the previous batch's compute (TorchRec's "
                  "TrainPipelineSparseDist, MoE overlap schedules)",
}


def _exposed_finding(trace: RankTrace, config: AnalysisConfig, w: Any, exposed_ns: int, comm_ns: int,
                     by_op: dict[str, int], where: str, unknown_ns: int = 0) -> Finding | None:
    if not w.dur_ns or exposed_ns < config.exposed_comm_min_fraction * w.dur_ns:
        return None
    parts = ", ".join(f"{op} {ns / w.dur_ns:.1%}" for op, ns in by_op.items() if ns)
    advice = [_OVERLAP_ADVICE[op] for op in by_op if by_op[op] and op in _OVERLAP_ADVICE]
    return Finding(
        id="exposed_comm", rank=trace.rank,
        title=(f"Communication not overlapped with compute takes {exposed_ns / w.dur_ns:.0%} of the "
               f"{w.dur_ns / 1e6:.1f} ms window ({parts})"),
        evidence={"exposed_us": us(exposed_ns), "exposed_fraction_of_window": frac(exposed_ns, w.dur_ns),
                  "communication_us": us(comm_ns), "exposed_by_op_us": {op: us(ns) for op, ns in by_op.items()},
                  "where": where, "steps": int(len(trace.steps)), "window_us": us(w.dur_ns),
                  "unknown_us": us(unknown_ns),
                  "measure": "collective time (a union) during which no compute runs"
                             + (" on the GPU, where the trace shows the GPU's activity (unknown: the collective time "
                                "where it does not)" if where == "gpu" else " on the training process's compute threads")},
        recommendation=("Overlap communication with compute: " + "; ".join(advice or [
            "issue collectives asynchronously and wait for them only where their result is needed"])
            + ". Part of the exposed time can be waiting for slower ranks: compare ranks (kinetoscope analyze on the "
              "job's directory) before tuning overlap."),
        impact_us=exposed_ns / 1000.0,
    )


@register("comm", "Communication overlap")
def analyze_comm(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Collective time (union), how much of it overlaps compute kernels, and the exposed remainder, by kind."""
    coll = collectives(trace)
    if coll.empty:
        return _host_collectives(trace, config)
    w = window(trace)
    comm_set, compute_set = comm_compute_sets(trace)
    comm_ns = iv.measure(comm_set)
    # where the trace misses GPU work (queued before recording, unrecorded graph replays) the compute a collective
    # overlapped may be what is missing: exposure is counted only where the GPU's activity is known; a file with
    # events cut out of it (sampled, trimmed) may lack compute anywhere: there exposure is not judged at all
    missing = missing_activity(trace)
    blind = missing.blind
    exposed = iv.subtract(iv.subtract(comm_set, compute_set), blind)
    unknown_ns = iv.measure(iv.intersect(comm_set, blind))
    judged = unknown_ns < comm_ns and missing.holes_ns <= config.missing_activity_max_fraction * w.dur_ns
    exposed_ns = iv.measure(exposed)
    overlap_ns = comm_ns - unknown_ns - exposed_ns  # known collective time is overlapped or exposed
    exposed_by_op = _exposed_by_op(coll, exposed, w) if judged else {}
    found = _exposed_finding(trace, config, w, exposed_ns, comm_ns, exposed_by_op, "gpu", unknown_ns) \
        if judged else None
    by_op = coll.groupby("op")["dur_ns"].agg(["count", "sum"])
    metrics = {
        "collectives": int(len(coll)),
        "time_us": us(comm_ns),
        "fraction": frac(comm_ns, w.dur_ns),
        "fraction_of": "window",
        "overlap_fraction": frac(overlap_ns, comm_ns - unknown_ns) if judged else None,
        "overlap_fraction_of": "collective time",
        "exposed_us": us(exposed_ns) if judged else None,
        "exposed_by_op_us": {op: us(ns) for op, ns in exposed_by_op.items()} if judged else None,
        "unknown_us": us(unknown_ns),
        "by_op": {str(k): {"count": int(r["count"]), "time_us": us(r["sum"])} for k, r in by_op.iterrows()},
        "where": "gpu",
    }
    return AnalysisResult(key="comm", metrics={"comm": metrics}, tables={"collectives": coll},
                          findings=(found,) if found else ())


#: host-side collective annotations ("gloo:all_reduce", "nccl:all_reduce"): CPU-only runs have only these
_COLLECTIVE_ANNOTATION_RE = re.compile(r"^(?:nccl|rccl|gloo):", re.IGNORECASE)


@trace_view
def host_collectives(trace: RankTrace) -> pd.DataFrame:
    """Collectives as the host records them (``gloo:all_reduce`` ...), in the window: a CPU-only run's only
    record of its communication (on GPU runs the kernels are the better record)."""
    ev = trace.events
    w = window(trace)
    sel = ev[kind_mask(ev, ("annotation", "cpu_op")) & name_mask(ev, _COLLECTIVE_ANNOTATION_RE)
             & (ev["end_ns"] > w.start_ns).to_numpy() & (ev["ts_ns"] < w.end_ns).to_numpy()]
    return sel.assign(op=[normalise_op(str(n).split(":", 1)[-1]) for n in sel["name"]], group="default",
                      seq=pd.array([None] * len(sel), dtype="Int64"), in_nelems=pd.array([None] * len(sel), dtype="Int64"),
                      out_nelems=pd.array([None] * len(sel), dtype="Int64"))


#: host ops that are communication or its bookkeeping, or containers of other work: not compute
_NOT_HOST_COMPUTE_RE = re.compile(r"^(?:c10d::|record_param_comms|nccl:|gloo:|rccl:|aten::wait|ProfilerStep#|"
                                  r"enumerate\(|Optimizer\.|## |DistributedDataParallel\.)")


def _host_compute(trace: RankTrace, comm_threads: set[str], w: Any) -> iv.Intervals:
    """CPU compute of a run without GPU work: the ops on threads other than the collectives' own, less
    communication, its bookkeeping and containers."""
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & ~name_mask(ev, _NOT_HOST_COMPUTE_RE)]
    ops = ops[~ops["tid"].astype(str).isin(comm_threads).to_numpy()]
    return iv.clip(iv.union(ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy()), w.start_ns, w.end_ns)


def _host_collectives(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    coll = host_collectives(trace)
    if coll.empty:
        return AnalysisResult(key="comm", metrics={"comm": None})
    w = window(trace)
    comm_set = iv.clip(iv.union(coll["ts_ns"].to_numpy(), coll["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    comm_ns = iv.measure(comm_set)
    by_op = coll.groupby("op")["dur_ns"].agg(["count", "sum"])
    found = None
    exposed_ns: int | None = None
    exposed_by_op: dict[str, int] = {}
    if not trace.has_gpu:  # a CPU run: the collectives' time against the CPU compute of the other threads
        compute = _host_compute(trace, {str(t) for t in coll["tid"].unique()}, w)
        if iv.measure(compute):  # no compute traced at all (a trimmed trace): overlap cannot be told
            exposed = iv.subtract(comm_set, compute)
            exposed_ns = iv.measure(exposed)
            exposed_by_op = _exposed_by_op(coll, exposed, w)
            found = _exposed_finding(trace, config, w, exposed_ns, comm_ns, exposed_by_op, "host")
    return AnalysisResult(key="comm", metrics={"comm": {
        "collectives": int(len(coll)),
        "time_us": us(comm_ns),
        "fraction": frac(comm_ns, w.dur_ns),
        "fraction_of": "window",
        "overlap_fraction": frac(comm_ns - exposed_ns, comm_ns) if exposed_ns is not None else None,
        "overlap_fraction_of": "collective time",
        "exposed_us": us(exposed_ns),
        "exposed_by_op_us": {op: us(ns) for op, ns in exposed_by_op.items()} or None,
        "by_op": {str(k): {"count": int(r["count"]), "time_us": us(r["sum"])} for k, r in by_op.iterrows()},
        "where": ("host (a CPU run: gloo)" if not trace.has_gpu
                  else "host (no collective kernels recorded: GPU activity not recorded)"),
    }}, tables={"collectives": coll}, findings=(found,) if found else ())




def without_waits(finding: Finding, wait_us: float, config: AnalysisConfig) -> Finding:
    """A rank's exposed communication less what the job's matched collectives show it spent waiting for later ranks
    (one rank's trace cannot tell a collective's wait from its transfer; the matching across ranks can): what
    overlap could hide is the rest. Its estimate (the exposed time per step, measured) scales with it: no view of
    the rank is needed again, so a job whose ranks' views were dropped keeps them dropped."""
    ev = dict(finding.evidence)
    before = float(ev.get("exposed_us") or 0)
    exposed = max(before - float(wait_us), 0.0)
    estimate = finding.estimate
    if estimate and estimate.get("saving_us_per_step") is not None and before > 0:
        mean = float(estimate["step_us_after"]) + float(estimate["saving_us_per_step"])
        saving = float(estimate["saving_us_per_step"]) * exposed / before
        estimate = {**estimate, "step_us_after": round(mean - saving, 3), "saving_us_per_step": round(saving, 3),
                    "saving_fraction": round(saving / mean, 4) if mean > 0 else None,
                    "assumptions": list(estimate.get("assumptions") or [])
                    + [f"its {wait_us / 1000:,.2f} ms of waiting for other ranks in the window is not exposure "
                       "overlap can hide (it is the late ranks' cost)"]}
    window = float(ev.get("window_us") or 0)
    ev.update({"exposed_including_waits_us": ev.get("exposed_us"), "waiting_for_other_ranks_us": round(wait_us, 3),
               "exposed_us": round(exposed, 3),
               "exposed_fraction_of_window": exposed / window if window else None})
    title = (f"Communication not overlapped with compute takes {exposed / window:.0%} of the {window / 1000:.1f} ms "
             f"window once its {wait_us / 1000:,.2f} ms waiting for other ranks is left out (collectives matched "
             "across the job)" if window else finding.title)
    return replace(finding, evidence=ev, title=title, impact_us=exposed, estimate=estimate, worth=None,
                   severity="info")
