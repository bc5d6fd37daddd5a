"""Communication: collective kernels (NCCL/RCCL, every generation's names), what the trace says about
each (process group, sequence number, message size), and their overlap with compute. The matching
across ranks is ``distributed``; the job-level analyzer is in ``straggler``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.collectives import Exposure, exposure, sharding_said
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.hostfacts import count, host_memory_share, world_size
from kinetoscope.analyze.model.pipeline import pipeline_stage
from kinetoscope.analyze.model.results import Comm, CommResult, OpTime
from kinetoscope.analyze.model.timeline import category_mask, main_thread, window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us


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


#: the record_function names FSDP2 (``fully_shard``) gives its own work on the training thread: its hooks, its
#: all-gathers' copy-in/out and waits, its reduce-scatters (FSDP1's ``FullyShardedDataParallel.forward`` holds the
#: module's compute too, and FSDP1 was not measured: not read)
_FSDP2_PREFIXES = ("FSDP::", "fsdp::")

_REPLICATE_ADVICE = (
    "every rank of this job runs on this host and its whole state fits each rank's memory many times over: "
    "replicate instead of sharding - DistributedDataParallel (one all-reduce of the gradients, in buckets, instead of "
    "FSDP's all-gathers in forward and backward and its reduce-scatters, with their per-module hooks and copies; on "
    "this host class six FSDP2 programs ran 31-42% faster as DDP), or fully_shard(..., reshard_after_forward=False) "
    "and fewer, larger units")


def _sharding(trace: RankTrace, config: AnalysisConfig, w: Any) -> dict[str, Any]:
    """FSDP2's own time on the training thread in the window (a union of its spans: hooks, all-gather copies and
    waits, reduce-scatters) and whether replicating the model instead (DDP) is a fix the trace supports: a CPU run
    (gloo) whose ranks all run on this host and fill its CPUs with their torch threads, with the peak memory the
    trace records, times the job's ranks, at most ``replicate_max_memory_share`` of this rank's share of the host's
    memory (the unsharded state fits many times over). Empty where the trace holds no FSDP2 span on the training
    thread; ``replicate_instead`` None where a fact it rests on is not recorded (``replicate_why`` says which)."""
    ev = trace.events
    tid = main_thread(trace)
    if tid is None:
        return {}
    fsdp = category_mask(ev, "name", lambda name: str(name).startswith(_FSDP2_PREFIXES))
    mine = ev[fsdp & (ev["tid"].astype(str) == tid).to_numpy()] if fsdp.any() else ev.iloc[:0]
    if mine.empty:
        return {}
    spans = iv.clip(iv.union(mine["ts_ns"].to_numpy(), mine["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    sharding_ns = iv.measure(spans)
    out: dict[str, Any] = {"sharding_us": us(sharding_ns), "sharding_fraction_of_window": frac(sharding_ns, w.dur_ns),
                           "replicate_instead": None, "replicate_why": None}
    host = (trace.meta.capture or {}).get("host") or {}
    world, here = world_size(trace), count(host.get("ranks_on_host"))
    cpus, threads = count(host.get("cpus")), count(host.get("torch_threads"))
    share, what = host_memory_share(trace)
    mem = trace.memory
    cpu = mem[(mem["device_type"] == 0).to_numpy()] if len(mem) else mem
    inside = cpu[((cpu["ts_ns"] >= w.start_ns) & (cpu["ts_ns"] <= w.end_ns)).to_numpy()] if len(cpu) else cpu
    peak = inside["total_allocated_bytes"].dropna()
    peak_bytes = int(peak.max()) if len(peak) else None
    out["state_peak_bytes"] = peak_bytes
    out["host_memory_per_rank_bytes"] = share
    if trace.has_gpu:
        out.update(replicate_instead=False, replicate_why="a run with a GPU: replicating was measured on CPU runs only")
    elif world is None:
        out["replicate_why"] = "the job's size is not recorded"
    elif world < 2:
        out.update(replicate_instead=False, replicate_why="a job of one rank: FSDP shards across nothing, and "
                   "dropping it was not measured")
    elif here is None:
        out["replicate_why"] = "how many of the job's ranks run on this host is not recorded"
    elif here < world:
        out.update(replicate_instead=False, replicate_why=f"{here} of the job's {world} ranks run on this host: the "
                   "collectives cross hosts, which replicating was not measured against")
    elif cpus is None or threads is None:
        out["replicate_why"] = "the CPUs it may run on or its torch threads are not recorded"
    elif threads * here < cpus:
        out.update(replicate_instead=False, replicate_why=(
            f"the job's {here} ranks of {threads} torch thread(s) leave {cpus - threads * here} of the {cpus} CPUs "
            "free: replicating was measured on hosts the ranks fill"))
    elif share is None:
        out["replicate_why"] = what
    elif peak_bytes is None:
        out["replicate_why"] = ("the trace records no CPU allocator total (profile_memory off, or totals not "
                                "written): whether the state fits unsharded is not known")
    else:
        fits = peak_bytes * world <= config.replicate_max_memory_share * share
        out.update(replicate_instead=fits, replicate_why=(
            f"the peak memory the trace records ({peak_bytes / 2**20:,.1f} MiB) times the job's {world} ranks is "
            f"{peak_bytes * world / share:.2%} of this rank's {share / 2**30:,.1f} GiB ({what})"
            + ("" if fits else f", over the {config.replicate_max_memory_share:.0%} that leaves room: sharding may "
               "be what makes it fit")))
    return out


def _exposed_finding(trace: RankTrace, config: AnalysisConfig, w: Any, exposed: iv.Intervals, comm_ns: int,
                     by_op: dict[str, int], where: str, unknown_ns: int = 0) -> Finding | None:
    exposed_ns = iv.measure(exposed)
    if not w.dur_ns or exposed_ns < config.exposed_comm_min_fraction * w.dur_ns:
        return None
    steps = trace.steps
    # where in the window it lies, per step: an epoch's end (a test pass's all-gathers and barriers) counts as often
    # as the run has such steps, not as often as the window (was: spread evenly, so a 10-step window holding one
    # test pass of a 60-step run with two counted it six times over)
    starts = steps["start_ns"].to_numpy()
    by_step = [(int(t0), int(x)) for t0, x in zip(starts, iv.overlap_each(starts, steps["end_ns"].to_numpy(), exposed),
                                                  strict=True)]
    parts = ", ".join(f"{op} {ns / w.dur_ns:.1%}" for op, ns in by_op.items() if ns)
    sharding = _sharding(trace, config, w) if where == "host" else {}
    replicate = bool(sharding.get("replicate_instead"))
    # FSDP's reduce-scatters run as gloo all-reduces: DDP's knobs are not its
    ops = ("allgather", "reducescatter") if sharding else [op for op in by_op if by_op[op]]
    advice = [_OVERLAP_ADVICE[op] for op in ops if op in _OVERLAP_ADVICE]
    return Finding(
        id="exposed_comm",
        rank=trace.rank,
        title=(
            f"Communication not overlapped with compute takes {exposed_ns / w.dur_ns:.0%} of the "
            f"{w.dur_ns / 1e6:.1f} ms window ({parts})" + sharding_said(sharding)
        ),
        evidence={
            "exposed_us": us(exposed_ns),
            "exposed_fraction_of_window": frac(exposed_ns, w.dur_ns),
            "communication_us": us(comm_ns),
            "exposed_by_op_us": {op: us(ns) for op, ns in by_op.items()},
            "where": where,
            "steps": int(len(trace.steps)),
            "window_us": us(w.dur_ns),
            "unknown_us": us(unknown_ns),
            "measure": "collective time (a union) during which no compute runs"
            + (
                " on the GPU, where the trace shows the GPU's activity (unknown: the collective time where it does not)"
                if where == "gpu"
                else " on the training process's compute threads"
            ),
            **sharding,
        },
        recommendation=(
            (f"FSDP's own work holds the training thread {sharding['sharding_fraction_of_window']:.0%} of the window: "
             + _REPLICATE_ADVICE + ". Otherwise, o" if replicate else "O")
            + "verlap communication with compute: "
            + "; ".join(
                advice or ["issue collectives asynchronously and wait for them only where their result is needed"]
            )
            + ". Part of the exposed time can be waiting for slower ranks: compare ranks (kinetoscope analyze on the "
            "job's directory) before tuning overlap."
        ),
        impact_us=exposed_ns / 1000.0,
        extra={"exposed_ns_by_step": by_step},
    )


_BUBBLE_ADVICE = (
    "More microbatches per step shrink the schedule's warm-up and cool-down (with GPipe or 1F1B and stages of equal "
    "time they idle (p - 1) / (m + p - 1) of it, for p stages and m microbatches); an interleaved schedule (several "
    "stages per rank: torch.distributed.pipelining's ScheduleInterleaved1F1B) divides that by the stages per rank, "
    "and a zero-bubble one (ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble) fills it with weight-gradient work. "
    "Waits in the middle of the steady state point at a slower neighbour: balance the layers across the stages. "
    "Compare the stages (kinetoscope analyze on the job's directory) before tuning.")


def _bubble_finding(trace: RankTrace, config: AnalysisConfig) -> Finding | None:
    """The stage's bubble, where the trace shows the rank is a stage (a neighbour known) and tells every step's."""
    stage = pipeline_stage(trace, config, None)
    if stage is None or stage.bubble_us_per_step is None or stage.bubble_fraction is None or not stage.steps:
        return None
    if stage.upstream_rank is None and stage.downstream_rank is None:
        return None  # send/recv to no known neighbour: not evidence of pipeline stages
    if stage.bubble_fraction < config.pipeline_bubble_min_fraction:
        return None
    mean_step_us = sum(s.step_us for s in stage.steps) / len(stage.steps)
    total_us = sum(s.bubble_us or 0.0 for s in stage.steps)
    where = ("receives from rank " + str(stage.upstream_rank) if stage.upstream_rank is not None else "first stage") \
        + (", sends to rank " + str(stage.downstream_rank) if stage.downstream_rank is not None else ", last stage")
    return Finding(
        id="pipeline_bubble",
        rank=trace.rank,
        title=(f"Pipeline stage ({where}) waits for its neighbours {stage.bubble_fraction:.0%} of each step "
               f"({stage.bubble_us_per_step / 1000:,.2f} ms of {mean_step_us / 1000:,.2f} ms)"),
        evidence={
            "bubble_us_per_step": stage.bubble_us_per_step,
            "bubble_fraction_of_step": stage.bubble_fraction,
            "bubble_us_by_step": {str(s.step): s.bubble_us for s in stage.steps},
            "steps": len(stage.steps),
            "upstream_rank": stage.upstream_rank,
            "downstream_rank": stage.downstream_rank,
            "where": stage.where,
            "measure": stage.measure,
        },
        recommendation=_BUBBLE_ADVICE,
        impact_us=total_us,
    )


@register("comm", "Communication overlap")
def analyze_comm(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Collective time (union), how much of it overlaps compute kernels, and the exposed remainder, by kind; and a
    pipeline stage's bubble."""
    res = _overlap(trace, config)
    bubble = _bubble_finding(trace, config)
    return replace(res, findings=(*res.findings, bubble)) if bubble is not None else res


def _overlap(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    exp = exposure(trace)
    if exp is None:
        return AnalysisResult(key="comm", metrics=CommResult(comm=None))
    if exp.where == "host":
        return _host_collectives(trace, config, exp)
    coll = exp.collectives
    w = window(trace)
    comm_ns = iv.measure(exp.comm_set)
    unknown_ns = exp.unknown_ns
    judged = exp.judged(config.missing_activity_max_fraction, w.dur_ns)
    exposed_ns = iv.measure(exp.exposed)
    overlap_ns = comm_ns - unknown_ns - exposed_ns  # known collective time is overlapped or exposed
    exposed_by_op = _exposed_by_op(coll, exp.exposed, w) if judged else {}
    found = _exposed_finding(trace, config, w, exp.exposed, comm_ns, exposed_by_op, "gpu", unknown_ns) \
        if judged else None
    by_op = coll.groupby("op")["dur_ns"].agg(["count", "sum"])
    metrics = Comm(
        collectives=int(len(coll)),
        time_us=us(comm_ns),
        fraction=frac(comm_ns, w.dur_ns),
        fraction_of="window",
        overlap_fraction=frac(overlap_ns, comm_ns - unknown_ns) if judged else None,
        overlap_fraction_of="collective time",
        exposed_us=us(exposed_ns) if judged else None,
        exposed_by_op_us={op: us(ns) for op, ns in exposed_by_op.items()} if judged else None,
        unknown_us=us(unknown_ns),
        by_op={str(k): OpTime(count=int(r["count"]), time_us=us(r["sum"])) for k, r in by_op.iterrows()},
        where="gpu",
    )
    return AnalysisResult(key="comm", metrics=CommResult(comm=metrics), tables={"collectives": coll},
                          findings=(found,) if found else ())


def _host_collectives(trace: RankTrace, config: AnalysisConfig, exp: Exposure) -> AnalysisResult:
    """A CPU run's collectives (its host annotations) against the CPU compute of its other threads; on a GPU run
    whose trace has no collective kernels, their time only (overlap cannot be told from the host)."""
    coll = exp.collectives
    w = window(trace)
    comm_ns = iv.measure(exp.comm_set)
    by_op = coll.groupby("op")["dur_ns"].agg(["count", "sum"])
    found = None
    exposed_ns: int | None = None
    exposed_by_op: dict[str, int] = {}
    if exp.compute_known:
        exposed_ns = iv.measure(exp.exposed)
        exposed_by_op = _exposed_by_op(coll, exp.exposed, w)
        found = _exposed_finding(trace, config, w, exp.exposed, comm_ns, exposed_by_op, "host")
    return AnalysisResult(key="comm", metrics=CommResult(comm=Comm(
        collectives=int(len(coll)),
        time_us=us(comm_ns),
        fraction=frac(comm_ns, w.dur_ns),
        fraction_of="window",
        overlap_fraction=frac(comm_ns - exposed_ns, comm_ns) if exposed_ns is not None else None,
        overlap_fraction_of="collective time",
        exposed_us=us(exposed_ns),
        exposed_by_op_us={op: us(ns) for op, ns in exposed_by_op.items()} or None,
        by_op={str(k): OpTime(count=int(r["count"]), time_us=us(r["sum"])) for k, r in by_op.iterrows()},
        where=("host (a CPU run: gloo)" if not trace.has_gpu
               else "host (no collective kernels recorded: GPU activity not recorded)"),
    )), tables={"collectives": coll}, findings=(found,) if found else ())
