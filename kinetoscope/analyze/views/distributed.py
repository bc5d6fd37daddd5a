"""The Distributed view (what the TensorBoard profiler plugin's Distributed page showed, and more): per rank,
where a step's time goes on the GPU (computation only, computation overlapped with communication,
communication only, neither), how long it waited in collectives for the others, the rank it waited for and
its clock skew; per matched collective, who arrived last and how long the others waited. Pure functions of
the loaded trace and its report: screens only show them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.collectives import collectives, comm_compute_sets
from kinetoscope.analyze.model.results import CommRoles, StepsResult
from kinetoscope.analyze.model.timeline import window
from kinetoscope.analyze.model.trace import RankTrace, Trace, trace_view
from kinetoscope.analyze.report.builder import Report

#: the per-rank table's columns: ms per step unless named otherwise
RANK_COLUMNS = ("rank", "steps", "step_ms", "compute_only_ms", "overlap_ms", "communication_only_ms", "other_ms",
                "collective_wait_ms", "waited_for_rank", "last_to_arrive", "others_wait_ms", "clock_skew_ms",
                "straggler")


#: the communication-by-role table's columns (ms per complete step, as the ranks table)
ROLE_COLUMNS = ("rank", "role", "serves", "collectives", "ops_unknown", "time_ms", "exposed_ms", "worth_ms",
                "fsdp_max_in_flight", "fsdp_queued")
#: what each role serves, in words
ROLE_WORDS = {"fsdp_allgather": "FSDP: gathering parameters", "fsdp_reducescatter": "FSDP: reducing gradients",
              "dp_allreduce": "data parallel (DDP): gradient all-reduce", "tp_forward": "tensor parallel (forward)",
              "pipeline": "pipeline stages (send/recv)", "alltoall": "all-to-all (MoE, embeddings)",
              "other": "other (loss, norms, broadcasts, barriers)"}


def roles_table(report: Report) -> pd.DataFrame:
    """One row per rank and role from each rank's ``comm_roles`` (ms per complete step; blank where unknown)."""
    rows = []
    for rr in report.rank_reports:
        block = rr.result(CommRoles)
        if block is None:
            continue
        stepped = rr.result(StepsResult)
        per_step = max(stepped.steps.count if stepped is not None else 0, 1)
        fsdp = block.fsdp
        for r in block.roles:
            is_ag = r.role == "fsdp_allgather"
            rows.append({"rank": rr.rank, "role": r.role, "serves": ROLE_WORDS.get(r.role, r.role),
                         "collectives": r.collectives, "ops_unknown": r.ops_unknown,
                         "time_ms": None if r.time_us is None else r.time_us / per_step / 1000,
                         "exposed_ms": None if r.exposed_us is None else r.exposed_us / per_step / 1000,
                         "worth_ms": None if r.worth_us_per_step is None else r.worth_us_per_step / 1000,
                         "fsdp_max_in_flight": fsdp.max_in_flight if is_ag and fsdp is not None else None,
                         "fsdp_queued": fsdp.queued_behind_previous if is_ag and fsdp is not None else None})
    out = pd.DataFrame(rows, columns=list(ROLE_COLUMNS))
    for col in ("time_ms", "exposed_ms", "worth_ms"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    for col in ("fsdp_max_in_flight", "fsdp_queued"):
        out[col] = pd.array(out[col], dtype="Int64")
    return out


#: the pipeline-stage table's columns (ms per complete step, as the ranks table)
STAGE_COLUMNS = ("stage", "rank", "upstream_rank", "downstream_rank", "steps", "step_ms", "bubble_ms",
                 "bubble_fraction", "worth_ms", "where")


def stage_order(links: Mapping[int, tuple[int | None, int | None]]) -> dict[int, int | None]:
    """Each rank's stage (0: the first) from each one's (upstream, downstream) ranks: the chains that start at a rank
    receiving from none and follow each rank's downstream one whose upstream it is. None for a rank on no such chain
    (a link one side does not confirm, a cycle as interleaved stages make, a rank not seen)."""
    out: dict[int, int | None] = dict.fromkeys(links)
    for head, (up, _) in links.items():
        if up is not None:
            continue
        rank: int | None = head
        k = 0
        while rank is not None and rank in links and out[rank] is None:
            out[rank] = k
            nxt = links[rank][1]
            rank = nxt if nxt is not None and nxt in links and links[nxt][0] == rank else None
            k += 1
    return out


def stages_table(report: Report) -> pd.DataFrame:
    """One row per rank that is a pipeline stage (``comm_roles.pipeline``), in stage order: its neighbours, its bubble
    and what removing the waits is worth (ms per complete step; blank where unknown)."""
    blocks = {}
    for rr in report.rank_reports:
        roles = rr.result(CommRoles)
        if roles is not None and roles.pipeline is not None:
            blocks[rr.rank] = roles.pipeline
    order = stage_order({r: (b.upstream_rank, b.downstream_rank) for r, b in blocks.items()})
    rows = []
    for rank, b in blocks.items():
        step_ms = float(np.mean([s.step_us for s in b.steps])) / 1000 if b.steps else None
        rows.append({"stage": order[rank], "rank": rank, "upstream_rank": b.upstream_rank,
                     "downstream_rank": b.downstream_rank, "steps": len(b.steps), "step_ms": step_ms,
                     "bubble_ms": None if b.bubble_us_per_step is None else b.bubble_us_per_step / 1000,
                     "bubble_fraction": b.bubble_fraction,
                     "worth_ms": None if b.worth_us_per_step is None else b.worth_us_per_step / 1000,
                     "where": b.where})
    out = pd.DataFrame(rows, columns=list(STAGE_COLUMNS))
    for col in ("stage", "upstream_rank", "downstream_rank"):
        out[col] = pd.array(out[col], dtype="Int64")
    for col in ("step_ms", "bubble_ms", "bubble_fraction", "worth_ms"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    return out.sort_values(["stage", "rank"], kind="stable", na_position="last").reset_index(drop=True)


@dataclass(frozen=True)
class DistributedView:
    #: one row per rank (``RANK_COLUMNS``); GPU columns are null where the rank recorded no GPU collectives
    ranks: pd.DataFrame
    #: one row per matched collective: group, op, the rank waited for, the longest wait, transfer time (ms)
    collectives: pd.DataFrame
    #: the job in a sentence's worth of numbers: straggler, most waited-for rank, largest skew, wait spread
    headline: dict[str, Any]
    #: what the columns mean, and over which window
    about: str
    #: per rank and role (``ROLE_COLUMNS``): communication by what it serves, from each rank's ``comm_roles``
    roles: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(ROLE_COLUMNS)))
    #: per pipeline stage (``STAGE_COLUMNS``), in stage order: its bubble per step, from each rank's ``comm_roles``
    stages: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(STAGE_COLUMNS)))


@trace_view
def gpu_split_ns(r: RankTrace) -> dict[str, int] | None:
    """The window split four ways by the GPU's kernels: computation only, computation and communication
    at once, communication only, neither (ns). None where the rank recorded no collective kernels."""
    if collectives(r).empty:
        return None
    w = window(r)
    comm_set, comp_set = comm_compute_sets(r)
    both = iv.measure(iv.intersect(comm_set, comp_set))
    comm, comp = iv.measure(comm_set), iv.measure(comp_set)
    return {"compute_only": comp - both, "overlap": both, "communication_only": comm - both,
            "other": w.dur_ns - comp - comm + both}


def _per_step_ms(ns: float | None, steps: int) -> float | None:
    return None if ns is None else round(ns / steps / 1e6, 4)


def distributed_view(trace: Trace, report: Report) -> DistributedView:
    coll = report.job.get("collectives") or {}
    per = {r["rank"]: r for r in coll.get("ranks", [])}
    stragglers = {f.rank: f for f in report.findings if f.id == "straggler"}
    rows = []
    for entry in report.ranks:
        rank = entry["rank"]
        r = trace.rank(rank)
        steps_info = entry.get("steps") or {}
        n = int(steps_info.get("count") or 0)
        per_step = max(n, 1)  # no complete step: the window counts as one
        split: Mapping[str, int | None] | None = gpu_split_ns(r)
        gpu = entry.get("gpu") or {}
        if split is not None and gpu and gpu.get("idle_fraction") is None:
            # the trace misses the GPU's activity for part of the window: what the kernels do not cover is not
            # known to be idle (the Overview says "not judged"; so does this view)
            split = {**split, "other": None}
        c = per.get(rank, {})
        wait_us = c.get("wait_us")
        skew_us = c.get("clock_skew_us")
        rows.append({
            "rank": rank,
            "steps": n,
            "step_ms": None if steps_info.get("mean_us") is None else round(steps_info["mean_us"] / 1000, 4),
            **{f"{k}_ms": _per_step_ms(split[k] if split else None, per_step)
               for k in ("compute_only", "overlap", "communication_only", "other")},
            "collective_wait_ms": None if wait_us is None else round(wait_us / per_step / 1000, 4),
            "waited_for_rank": c.get("waited_for_rank"),
            "last_to_arrive": c.get("waited_for_count"),
            # the others' waits at the collectives it arrived last at, per step: what the most waited-for rank is by
            "others_wait_ms": (None if c.get("waited_for_us") is None
                               else round(c["waited_for_us"] / per_step / 1000, 4)),
            "clock_skew_ms": None if skew_us is None else round(skew_us / 1000, 4),
            "straggler": rank in stragglers,
        })
    ranks = pd.DataFrame(rows, columns=list(RANK_COLUMNS))
    for col in ("waited_for_rank", "last_to_arrive"):
        ranks[col] = pd.array(ranks[col], dtype="Int64")
    for col in RANK_COLUMNS:
        if col.endswith("_ms"):  # unknown is NaN in a float column (None made it an object column)
            ranks[col] = pd.to_numeric(ranks[col], errors="coerce").astype("float64")
    res = report.job_results.get("collectives")
    table = res.tables.get("collectives") if res is not None else None
    if table is None:
        table = pd.DataFrame(columns=["group", "op", "transfer_us", "waited_for_rank", "max_wait_us"])
    collectives_ms = pd.DataFrame({
        "collective": np.arange(1, len(table) + 1),
        "group": table["group"].astype(str).to_numpy(),
        "op": table["op"].astype(str).to_numpy(),
        "waited_for_rank": pd.array(table["waited_for_rank"], dtype="Int64"),
        "max_wait_ms": pd.to_numeric(table["max_wait_us"]).to_numpy(np.float64) / 1000,
        "transfer_ms": pd.to_numeric(table["transfer_us"]).to_numpy(np.float64) / 1000,
    })
    straggler = next(iter(stragglers.values()), None)
    skews = ranks["clock_skew_ms"].dropna()
    waits = ranks["collective_wait_ms"].dropna()
    headline = {
        "ranks": len(ranks),
        #: ranks of the job no file holds: the straggler is then not judged (None below means "not judged")
        "missing_ranks": list(report.job.get("missing_ranks") or []),
        "world_size": report.job.get("world_size"),
        "matched_collectives": coll.get("matched"),
        "unmatched_collectives": coll.get("unmatched"),
        "straggler_rank": straggler.rank if straggler else None,
        "straggler_cause": straggler.evidence.get("cause") if straggler else None,
        "most_waited_for_rank": coll.get("most_waited_for_rank"),
        "max_abs_clock_skew_ms": float(skews.abs().max()) if len(skews) else None,
        "wait_ms_per_step_min": float(waits.min()) if len(waits) else None,
        "wait_ms_per_step_max": float(waits.max()) if len(waits) else None,
    }
    about = ("Per rank, ms per complete step (the window divided by its steps): the GPU's time split by its kernels "
             "into computation only, computation overlapped with communication, communication only, and neither "
             "(idle or other work); collective wait: the time the rank's collectives started before the last "
             "rank arrived (clocks aligned on collective completion); waited for: the rank this one waited for "
             "most often; last to arrive: how many collectives waited for this rank; clock skew: its clock's offset "
             "from the reference rank. Blank: the trace cannot say (no collective kernels, no matched collectives).")
    return DistributedView(ranks=ranks, collectives=collectives_ms, headline=headline, about=about,
                           roles=roles_table(report), stages=stages_table(report))
