"""Collectives as one rank's trace records them: the kernels (``collectives``), the host's annotations on CPU-only
runs (``host_collectives``), communication against compute (``comm_compute_sets``) and the process group's name.
Views shared by the communication, host and straggler analyzers and the Distributed page."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.distributed import normalise_op
from kinetoscope.analyze.model.missing import missing_activity
from kinetoscope.analyze.model.timeline import Window, gpu_work, kernels, kind_mask, name_mask, window
from kinetoscope.analyze.model.trace import RankTrace, trace_view

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
    process group (``group``, and ``group_ranks`` as the trace writes them), sequence number, message sizes (from
    the kernel's own args, else from the ``record_param_comms`` op that launched it, matched on External id)."""
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
    op = [
        normalise_op(str(c)) if c is not None and c == c else normalise_op(str(n))
        for c, n in zip(coll_name, name_op, strict=False)
    ]
    group = pick("pg_name")
    ranks = pick("pg_ranks")
    keys: dict[tuple[object, object], str] = {}
    group_key = []
    for g, r in zip(group, ranks, strict=False):
        k = keys.get((g, r))
        if k is None:
            k = keys[(g, r)] = group_name(g, r)
        group_key.append(k)
    return coll.assign(op=op, group=group_key, group_ranks=ranks.to_numpy(object),
                       seq=pd.array(pick("seq"), dtype="Int64"),
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


@dataclass(frozen=True)
class Exposure:
    """A rank's collective time in the window against its compute: ``exposed`` (a union) is collective time during
    which no compute runs, counted only where the trace shows it (``judged``). ``where``: "gpu" (kernels) or "host"
    (a CPU run's annotations)."""

    collectives: pd.DataFrame
    comm_set: iv.Intervals
    exposed: iv.Intervals
    #: collective time where the trace misses the GPU's activity (neither exposed nor overlapped: unknown)
    unknown_ns: int
    #: the window's time the trace misses GPU work in (``missing_activity``); 0 on the host
    holes_ns: int
    #: compute is traced at all (a CPU run's operators; on a GPU, known collective time)
    compute_known: bool
    where: Literal["gpu", "host"]

    def judged(self, max_missing_fraction: float, window_ns: int) -> bool:
        """Whether the trace can tell exposure: compute traced, and (GPU) no more than ``max_missing_fraction`` of
        the window missing its activity (a file with events cut out of it, sampled or trimmed, may lack compute
        anywhere)."""
        return self.compute_known and (self.where == "host" or self.holes_ns <= max_missing_fraction * window_ns)


@trace_view
def exposure(trace: RankTrace) -> Exposure | None:
    """Collective time not overlapped with compute (``Exposure``); None where the trace records no collective. On a
    GPU: collective kernels against the other kernels, counted only where the GPU's activity is known (where the
    trace misses GPU work - queued before recording, unrecorded graph replays - the compute a collective overlapped
    may be what is missing). On a CPU run: the host's collective annotations against the CPU compute of the other
    threads (``host_compute``). A GPU run whose trace has host annotations but no collective kernels: its overlap
    cannot be told from the host (``compute_known`` False)."""
    w = window(trace)
    coll = collectives(trace)
    if not coll.empty:
        comm_set, compute_set = comm_compute_sets(trace)
        missing = missing_activity(trace)
        unknown_ns = iv.measure(iv.intersect(comm_set, missing.blind))
        exposed = iv.subtract(iv.subtract(comm_set, compute_set), missing.blind)
        return Exposure(coll, comm_set, exposed, unknown_ns, missing.holes_ns, unknown_ns < iv.measure(comm_set),
                        "gpu")
    coll = host_collectives(trace)
    if coll.empty:
        return None
    comm_set = iv.clip(iv.union(coll["ts_ns"].to_numpy(), coll["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    if trace.has_gpu:
        return Exposure(coll, comm_set, iv.EMPTY, 0, 0, False, "host")
    compute = host_compute(trace, {str(t) for t in coll["tid"].unique()}, w)
    known = bool(iv.measure(compute))
    return Exposure(coll, comm_set, iv.subtract(comm_set, compute) if known else iv.EMPTY, 0, 0, known, "host")


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
    return sel.assign(
        op=[normalise_op(str(n).split(":", 1)[-1]) for n in sel["name"]],
        group="default",
        group_ranks=None,
        seq=pd.array([None] * len(sel), dtype="Int64"),
        in_nelems=pd.array([None] * len(sel), dtype="Int64"),
        out_nelems=pd.array([None] * len(sel), dtype="Int64"),
    )




#: host ops that are communication or its bookkeeping, or containers of other work: not compute (functional
#: collectives, ``_c10d_functional::``, are DTensor's, tensor parallelism's and compiled code's)
_NOT_HOST_COMPUTE_RE = re.compile(r"^(?:c10d::|_?c10d_functional(?:_autograd)?::|record_param_comms|nccl:|gloo:|rccl:|"
                                  r"aten::wait|ProfilerStep#|enumerate\(|Optimizer\.|## |DistributedDataParallel\.)")
#: host ops in which their thread waits: for a functional collective (``wait_tensor``: whatever op holds one,
#: DTensor's ``aten::sum`` around the wait for its Partial output's all-reduce, computes nothing meanwhile), or for
#: a TorchScript fork (``aten::wait``: the forked work counts on its own thread). ``Work.wait()`` after
#: ``async_op=True`` records no op of its own: its wait is not seen here
_HOST_COLLECTIVE_WAIT_RE = re.compile(r"^(?:_?c10d_functional::wait_tensor|aten::wait)$")


#: host ops of a process group's collective call (their thread inside one: enqueueing it, or waiting for it); a
#: functional collective's wait (``wait_tensor``) is its own op, whose time alone is taken off its holder
_HOST_COLLECTIVE_CALL_RE = re.compile(r"^(?:c10d::|record_param_comms)")


def _holding_a_collective(starts: np.ndarray, ends: np.ndarray, calls: np.ndarray) -> np.ndarray:
    """Of one thread's ops (nested: each inside the one before it or after its end), those that hold a collective
    call (``calls``: which ops are one) inside them."""
    order = np.lexsort((-ends, starts))
    out = np.zeros(len(starts), bool)
    stack: list[int] = []
    for k in order:
        while stack and ends[stack[-1]] <= starts[k]:
            stack.pop()
        if calls[k]:
            for j in stack:
                if ends[j] >= ends[k]:
                    out[j] = True
        stack.append(int(k))
    return out


def host_compute(trace: RankTrace, comm_threads: set[str], w: Window) -> iv.Intervals:
    """CPU compute of a run without GPU work: the ops on threads other than the collectives' own, less
    communication, its bookkeeping and containers, and less the time each thread waits inside an op for a collective
    (was: a tensor-parallel forward's ``aten::sum`` holding the wait for its all-reduce read as compute, and 30% of
    a window spent waiting as 99% overlapped). An op that holds a collective call is a container of it, not compute:
    its other ops inside it count (was: FSDP's all-gathers, waited for by ``Work.wait()``, which records no op, inside
    the ops around its pre-forward and post-backward hooks, ``AccumulateGrad``'s, read as compute: 6% of a window
    exposed where the collectives were 17% of it and nothing computed meanwhile)."""
    ev = trace.events
    cpu = kind_mask(ev, ("cpu_op",))
    tids = ev["tid"].astype(str).to_numpy()
    keep = cpu & ~name_mask(ev, _NOT_HOST_COMPUTE_RE) & ~np.isin(tids, list(comm_threads))
    calls = cpu & name_mask(ev, _HOST_COLLECTIVE_CALL_RE) & ~np.isin(tids, list(comm_threads))
    for tid in np.unique(tids[calls]):
        mine = np.flatnonzero(cpu & (tids == tid))
        holding = _holding_a_collective(ev["ts_ns"].to_numpy()[mine], ev["end_ns"].to_numpy()[mine], calls[mine])
        keep[mine[holding]] = False
    ops, op_tids = ev[keep], tids[keep]
    held = cpu & name_mask(ev, _HOST_COLLECTIVE_WAIT_RE)
    if not held.any():
        return iv.clip(iv.union(ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    waits, wait_tids = ev[held], tids[held]
    busy = []
    for tid in np.unique(op_tids):  # a wait stops only its own thread
        mine = ops[op_tids == tid]
        own = iv.union(mine["ts_ns"].to_numpy(), mine["end_ns"].to_numpy())
        its = waits[wait_tids == tid]
        busy.append(iv.subtract(own, iv.union(its["ts_ns"].to_numpy(), its["end_ns"].to_numpy())) if len(its)
                    else own)
    starts = np.concatenate([b[0] for b in busy]) if busy else np.zeros(0, np.int64)
    ends = np.concatenate([b[1] for b in busy]) if busy else np.zeros(0, np.int64)
    return iv.clip(iv.union(starts, ends), w.start_ns, w.end_ns)


def sharding_said(evidence: dict[str, Any]) -> str:
    """What a title adds where replicating is priced: FSDP's own share of the window on the training thread."""
    share = evidence.get("sharding_fraction_of_window")
    return (f"; FSDP's own work holds the training thread {share:.0%} of it, and the job's state fits each rank "
            "unsharded" if evidence.get("replicate_instead") and share is not None else "")


#: the estimate of overlapping a rank's exposed collectives with compute (``exposed_comm``'s first fix)
OVERLAP_METHOD = "measured: exposed communication"
OVERLAP_ASSUMPTION = ("the collectives' exposed time overlaps compute (bucketing, prefetching, pipelining the step); "
                      "what they spend waiting for other ranks, and what the next work needs from them before it can "
                      "start, would stay: not something one rank's trace shows")
#: the estimate of replicating an FSDP2 model (DDP) on a CPU host its ranks fill (``exposed_comm``'s second fix)
REPLICATE_METHOD = "measured: FSDP's own time on the training thread (replicated instead: DDP)"
REPLICATE_ASSUMPTION = (
    "the model replicated on every rank (DistributedDataParallel) instead of sharded: FSDP's own work on the "
    "training thread goes - its hooks, its all-gathers' copies and waits, its reduce-scatters - and DDP's bucketed "
    "all-reduce of the gradients takes its place, the rank's waits for later ranks staying; measured on six FSDP2 "
    "programs on 2 ranks of one 2-CPU host: their FSDP spans held 25-39% of the profiled windows and DDP ran 31-42% "
    "faster (an estimate, not a bound: DDP's all-reduce costs time FSDP's spans do not show, and FSDP's DTensor "
    "optimizer step and its threads' CPU, which DDP also removes, are not in them)")


@dataclass(frozen=True)
class CommFix:
    """``exposed_comm``'s fix worth more, per step, in the unit its caller gave: overlap (an upper bound, at most the
    cores' free share where known, ``limited_by`` saying so where that decides) or replicating (an estimate)."""

    saving: float
    method: str
    bound: str | None
    assumptions: tuple[str, ...]
    limited_by: str | None


def comm_fix(exposed: float, room: float | None, room_why: str | None, sharding: float | None, waits: float,
             replicate_why: str) -> CommFix:
    """The fix worth more of a rank's exposed collectives per step: overlapping ``exposed`` (at most ``room``, the
    cores' free share, where known), or - where ``sharding``, FSDP's own time, is given - replicating, which saves that
    time less the rank's ``waits`` for later ranks (DDP's all-reduce waits for them too)."""
    overlap = min(exposed, room) if room is not None else exposed
    limited = room_why if room is not None and room < exposed else None
    replicate = max(sharding - waits, 0.0) if sharding is not None else None
    if replicate is not None and replicate > overlap:
        return CommFix(replicate, REPLICATE_METHOD, None, (REPLICATE_ASSUMPTION, replicate_why), None)
    return CommFix(overlap, OVERLAP_METHOD, "upper", (OVERLAP_ASSUMPTION, *((limited,) if limited else ())), limited)
