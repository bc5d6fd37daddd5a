"""Straggler: the rank that arrives last at the collectives and makes the others wait, and why.

One definition, used by ``analyze`` (job analyzer below), ``batch`` (its reduce over stored per-rank
summaries) and the app: collectives matched across ranks and clocks aligned (``distributed``), then
the rank that is the last to arrive in most matched collectives, and whose lateness costs the others
at least ``straggler_min_spread_fraction`` of a step. Its cause is the part of a step where it spends
most more than the median of the other ranks: input (waiting for data), copy (host-to-device),
compute (GPU kernels), host (the launching threads' own work).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.collectives import exposure, host_collectives
from kinetoscope.analyze.model.commroles import issued_gpu
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.copies import h2d_copies
from kinetoscope.analyze.model.distributed import (
    COMPONENTS,
    RUN_TAIL_MAX,
    Arrivals,
    Matching,
    RankSummary,
    arrivals,
    job_metrics,
    match,
)
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.missing import missing_activity
from kinetoscope.analyze.model.results import Collectives
from kinetoscope.analyze.model.timeline import (
    gpu_work,
    host_busy,
    intervals_of,
    kind_mask,
    loader_spans,
    main_thread,
    name_mask,
    step_at,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace, Trace, trace_view


@trace_view
def rank_summary(r: RankTrace) -> RankSummary:
    """What the job-level analysis needs from one rank (batch computes it where the rank was loaded)."""
    w = window(r)
    exp = exposure(r)
    frame = exp.collectives if exp is not None else host_collectives(r)
    steps = len(r.steps)
    per = max(steps, 1)
    comm_set = intervals_of(frame, w) if len(frame) else iv.EMPTY
    # the threshold of the default config: a summary is the same whatever config the report is judged by (batch
    # computes it once per rank); where exposure cannot be told the job falls back to the rank's whole wait
    exposed = exp.exposed if exp is not None and exp.judged(AnalysisConfig.missing_activity_max_fraction, w.dur_ns) \
        else None
    ev = r.events
    marks = {kind: intervals_of(ev[name_mask(ev, names=frozenset({f"kinetoscope::{kind}"}))], w)
             for kind in ("validation", "checkpoint")}
    marked = {kind: iv.subtract(spans, comm_set) for kind, spans in marks.items()}
    other_work = iv.merge(*marked.values())
    recorded = ((r.meta.capture or {}).get("loop") or {}).get("recorded") or []
    work = gpu_work(r)
    compute = work[(work["kind"] == "kernel").to_numpy() & ~work.index.isin(frame.index)]
    copies = h2d_copies(r) if r.has_gpu else work.iloc[0:0]
    # a CPU run computes on the host (its operators on the training thread); what runs inside validation or
    # checkpoint marks is theirs, not the step's own
    own_compute = iv.subtract(intervals_of(compute, w) if r.has_gpu else _cpu_compute(r, w), other_work)
    components: dict[str, float | None] = {
        "input": iv.measure(intervals_of(loader_spans(r), w)) / 1000.0 / per,
        "copy": iv.measure(intervals_of(copies, w)) / 1000.0 / per if r.has_gpu else None,
        "compute": iv.measure(own_compute) / 1000.0 / per,
        "host": iv.measure(iv.subtract(host_busy(r), other_work)) / 1000.0 / per if r.has_gpu else None,
        "untraced": iv.measure(iv.subtract(_untraced(r, w), iv.merge(comm_set, other_work))) / 1000.0 / per
        if steps else None,
        **{kind: iv.measure(spans) / 1000.0 / per if kind in recorded else None for kind, spans in marked.items()},
    }

    def ints(col: str) -> list[int | None]:
        return [None if pd.isna(v) else int(v) for v in frame[col]]


    return RankSummary(
        rank=r.rank,
        steps=steps,
        mean_step_us=float(r.steps["dur_ns"].mean()) / 1000.0 if steps else None,
        window_us=w.dur_ns / 1000.0,
        components_us=components,
        group=[str(g) for g in frame["group"]],
        seq=ints("seq"),
        op=[str(o) for o in frame["op"]],
        in_nelems=ints("in_nelems"),
        out_nelems=ints("out_nelems"),
        start_ns=[int(v) for v in frame["ts_ns"]],
        end_ns=[int(v) for v in frame["end_ns"]],
        collective_us=iv.measure(comm_set) / 1000.0,
        unknown_fraction=missing_activity(r).blind_ns() / w.dur_ns if w.dur_ns else 0.0,
        after_marked=_after_marked(frame, iv.merge(*marks.values()), w.start_ns),
        step=_issued_in_step(r, frame),
        exposed_start_ns=[int(v) for v in exposed[0]] if exposed is not None else None,
        exposed_end_ns=[int(v) for v in exposed[1]] if exposed is not None else None,
        step_cpu_us=_cpu_per_step(r),
        **_run_walls(r),
        **_before_each(frame, own_compute, _compute_starts(r, compute), w.start_ns),
        **_runqueue_by_step(r),
    )


def _compute_starts(r: RankTrace, kernels: pd.DataFrame) -> np.ndarray:
    """When each of the rank's compute events started (sorted, ns): its kernels on a GPU run, its training thread's
    operators on a CPU run (communication and containers left out)."""
    ops = kernels if r.has_gpu else _compute_ops(r)
    return np.sort(ops["ts_ns"].to_numpy(np.int64)) if ops is not None else np.zeros(0, np.int64)


def _before_each(frame: pd.DataFrame, compute: iv.Intervals, starts: np.ndarray,
                 window_start_ns: int) -> dict[str, Any]:
    """Per collective (the frame's order): the rank's compute time (us) and compute events started, since the last of
    its collectives that ended before this one started (the window's start for none), up to this one's start
    (``RankSummary.compute_before_us``, ``ops_before``)."""
    if frame.empty:
        return {}
    begin = frame["ts_ns"].to_numpy(np.int64)
    since = _since_previous(begin, frame["end_ns"].to_numpy(np.int64), window_start_ns)
    spent = iv.overlap_each(since, begin, compute)
    count = np.searchsorted(starts, begin, side="left") - np.searchsorted(starts, since, side="left")
    return {"compute_before_us": [round(float(v) / 1000.0, 3) for v in spent],
            "ops_before": [int(v) for v in count]}


def _runqueue_by_step(r: RankTrace) -> dict[str, Any]:
    """Per ProfilerStep of the window (``RankSummary.step_numbers``): the training thread's run-queue wait in it from
    the capture's step timings (us; None where not recorded)."""
    steps = r.steps
    if steps.empty:
        return {}
    numbers = [int(v) for v in steps["step"]]
    rq: list[float | None] = [None] * len(numbers)
    rs = r.run_steps
    if rs is not None and "runqueue_wait_ns" in rs:
        by = dict(zip(rs["step"].tolist(), rs["runqueue_wait_ns"].to_numpy(float).tolist(), strict=True))
        rq = [None if (v := by.get(n)) is None or math.isnan(v) else v / 1000.0 for n in numbers]
    return {"step_numbers": numbers, "runqueue_us_by_step": rq}


#: fewest ordinary steps, profiled and not, whose CPU time per step stands for each
_MIN_CPU_STEPS = 3


def _usual(rs: pd.DataFrame) -> np.ndarray:
    """Which of the run's timed steps are ordinary: not the run's first (start-up), no trace writing, validation,
    compile or checkpoint in it - work other steps may not share."""
    usual = rs["step"].to_numpy() > 0
    for other in ("capture_busy_ns", "validation_ns", "compile_ns", "checkpoint_ns"):
        if other in rs:
            usual &= ~(np.nan_to_num(rs[other].to_numpy(float)) > 0)
    return usual


def _run_walls(r: RankTrace) -> dict[str, Any]:
    """The run the capture timed (``RankSummary.run_steps`` ... ``run_tail_us``): only where the capture says the run
    ended as written (no exception or signal ended it) and counts the steps it timed, and some were ordinary."""
    rs = r.run_steps
    run = (r.meta.capture or {}).get("run") or {}
    n = run.get("steps_run")
    if rs is None or rs.empty or not isinstance(n, int) or run.get("ended_by") is not None:
        return {}
    steps = rs["step"].to_numpy(np.int64)
    usual = _usual(rs)
    if steps.min() < 0 or steps.max() >= n or not usual.any():  # the manifest does not count the steps timed
        return {}
    walls_us = rs["wall_ns"].to_numpy(float) / 1000.0
    first = max(n - RUN_TAIL_MAX, 0)
    tail: list[float | None] = [None] * (n - first)
    for k, wall in zip(steps.tolist(), walls_us.tolist(), strict=True):
        if k >= first:
            tail[k - first] = round(wall, 3)
    loop = (r.meta.capture or {}).get("loop") or {}
    return {"run_steps": n, "run_timed_steps": len(rs), "run_wall_us": round(float(walls_us.sum()), 3),
            "run_usual_step_us": float(np.median(walls_us[usual])), "run_tail_us": tail,
            "run_step_source": f"{loop.get('step_source')}, optimizers: {loop.get('optimizers')}"}


def _cpu_per_step(r: RankTrace) -> dict[str, dict[str, float]]:
    """CPU time per step (us) by measure - the training thread's ("thread"), the process's ("process") - as its median
    over the run's profiled steps and over its ordinary unprofiled ones (``_usual``), with how many of those, from the
    capture's step timings (``RankSummary.step_cpu_us``). Medians: a step of work of its own (a save only one rank
    makes, unmarked) is not the rank's usual step."""
    rs = r.run_steps
    if rs is None or rs.empty:
        return {}
    usual = _usual(rs)
    profiled = rs["profiled"].to_numpy(bool)
    out: dict[str, dict[str, float]] = {}
    for measure, col in (("thread", "oncpu_ns"), ("process", "cpu_ns")):
        if col not in rs:
            continue
        cpu = rs[col].to_numpy(float)
        known = usual & ~np.isnan(cpu)
        on, off = known & profiled, known & ~profiled
        if on.sum() >= _MIN_CPU_STEPS and off.sum() >= _MIN_CPU_STEPS:
            out[measure] = {"profiled_us": float(np.median(cpu[on])) / 1000.0,
                            "unprofiled_us": float(np.median(cpu[off])) / 1000.0, "unprofiled_steps": int(off.sum())}
    return out


def _issued_in_step(r: RankTrace, frame: pd.DataFrame) -> list[int]:
    """Per collective (the frame's order): the ProfilerStep its host issued it in (-1 outside every step). A kernel's
    GPU start can lag its launch by more than a step and by a different amount on each rank, so a GPU collective is
    placed by the runtime call that launched it (``commroles.issued_gpu``), by its own start where no call is on
    record."""
    if frame.empty:
        return []
    ts = frame["ts_ns"].to_numpy(np.int64)
    if "correlation" in frame and r.has_gpu:
        launched, _ = issued_gpu(r, frame)
        ts = np.where(launched >= 0, launched, ts)
    return [int(v) for v in step_at(r, ts)]


def _after_marked(frame: pd.DataFrame, marks: iv.Intervals, start_ns: int) -> list[bool]:
    """Per collective (the frame's order): whether the rank's time since the last of its collectives that ended before
    this one started (the window's start for none), up to this one's end, holds validation or checkpoint work."""
    if frame.empty or not marks[0].size:
        return [False] * len(frame)
    starts = frame["ts_ns"].to_numpy(np.int64)
    ends = frame["end_ns"].to_numpy(np.int64)
    # since the latest end of a collective that ended before this one started (one that did started before it): the
    # buckets in flight together after a rank's own evaluation all follow it (was: since the latest end among those
    # started before, so a DDP rank's second bucket, started 0.4 ms after the first and ending after it, read as not
    # following the evaluation that held both back 93 ms: one collective of its own work, under the two a recurring
    # cause needs, and a straggler the consensus claimed was left as lateness that moves)
    since = _since_previous(starts, ends, start_ns)
    return [bool(v) for v in iv.overlap_each(since, ends, marks) > 0]


def _since_previous(starts: np.ndarray, ends: np.ndarray, window_start_ns: int) -> np.ndarray:
    """Per collective: the latest end of the rank's collectives that ended before it started (the window's start for
    none), at most its own start."""
    done = np.sort(ends)
    at = np.searchsorted(done, starts, side="right") - 1
    return np.minimum(np.where(at >= 0, done[np.clip(at, 0, None)], window_start_ns), starts)


def _compute_ops(r: RankTrace) -> pd.DataFrame | None:
    """The training thread's operators, communication and containers left out; None without a training thread."""
    ev = r.events
    tid = main_thread(r)
    if tid is None:
        return None
    return ev[kind_mask(ev, ("cpu_op",)) & (ev["tid"] == tid).to_numpy(bool) & ~name_mask(ev, _NOT_COMPUTE_RE)]


def _cpu_compute(r: RankTrace, w: Any) -> iv.Intervals:
    """A CPU run's compute: the training thread's operators (``_compute_ops``)."""
    ops = _compute_ops(r)
    if ops is None:
        return iv.EMPTY
    return iv.clip(iv.union(ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy()), w.start_ns, w.end_ns)


#: communication and its bookkeeping, containers of other work, and marks: not the step's own traced work
_NOT_COMPUTE_RE = re.compile(r"^(?:c10d::|record_param_comms|nccl:|gloo:|rccl:|ProfilerStep#|enumerate\()")


def _untraced(r: RankTrace, w: Any) -> iv.Intervals:
    """The training thread's time in its steps inside no traced event (operators, runtime calls, annotations, Python
    frames, data waits): Python the profiler did not record, I/O, sleeps - work a straggler can hide on its own
    training thread. (The caller leaves out the rank's time in collectives, where it waits for the others.)"""
    ev = r.events
    tid = main_thread(r)
    if tid is None or r.steps.empty:
        return iv.EMPTY
    mine = ev[kind_mask(ev, ("cpu_op", "annotation", "runtime", "driver", "python")) & (ev["tid"] == tid).to_numpy(bool)
              & ~name_mask(ev, _STEP_RE)]
    traced = iv.union(mine["ts_ns"].to_numpy(), mine["end_ns"].to_numpy())
    steps = iv.clip(iv.union(r.steps["start_ns"].to_numpy(), r.steps["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    return iv.subtract(steps, traced)


_STEP_RE = re.compile(r"^ProfilerStep#")


def straggler_finding(summaries: list[RankSummary], m: Matching, a: Arrivals, config: AnalysisConfig) -> Finding | None:
    """The rank the others wait for, from matched arrivals; None when no rank stands out."""
    if len(a.ranks) < 2 or not (a.last >= 0).any():
        return None
    by_rank = {s.rank: s for s in summaries}
    steps = [s.mean_step_us for s in summaries if s.mean_step_us]
    mean_step_us = float(np.mean(steps)) if steps else float(np.mean([s.window_us for s in summaries]))
    n_steps = max(max((s.steps for s in summaries), default=1), 1)
    member = ~np.isnan(a.arrival_ns)  # collectives x ranks: which ranks took part
    # a collective every rank of its group reaches from validation or a checkpoint save (a sharded evaluation's own
    # collectives, the first training one after it) waits on how that work split between them, not on a rank slow at
    # training: that imbalance is the validation's (the outlier steps say what it costs), left out here (was: counted,
    # so a Trainer job whose ranks both evaluate once in the window had rank 1 "the straggler, cause validation", told
    # to shard an evaluation already sharded, its partner's wait 16% of the mean step with that step, 9% without).
    # Where only the late rank ran it, the others wait on work they do not share: counted
    marked = a.after_marked
    shared_marked = ((marked | ~member).all(axis=1) & member.any(axis=1) if marked is not None
                     else np.zeros(len(a.last), bool))
    waited = (a.last >= 0) & ~shared_marked
    if not waited.any():
        return None
    # who is last is counted over one kind of collective, the one whose waits are the most (the gradient
    # all-reduces): kinds serve different parts of the step, and a metrics all-gather's or a barrier's lateness says
    # nothing of who holds up the all-reduce (was: all kinds together, so a Fabric job's rank 0, last in 16 of its 20
    # gradient all-reduces, was last in 21 of 33 with its test pass's all-gathers and barriers: under the
    # two-in-three bar, where two readers and their consensus read the straggler); what the lateness cost is counted
    # over the same collectives, the ones the title names (was: over every kind, so a Trainer job's rank 1, last at 20
    # of 29 gradient all-reduces that cost its partner 9.4% of the mean step, cost it 10.1% with the per-step
    # all-gathers it was last at now and then: over the bar, where both readers and their consensus read 9.4%)
    best: tuple[float, int, float, int] | None = None  # (cost per step, rank index, share, collectives)
    kinds: dict[int, tuple[np.ndarray, str | None, float]] = {}
    bar_us = config.straggler_min_spread_fraction * mean_step_us
    # rank index: (the others' wait per step (us) at those collectives, those collectives)
    explained: dict[int, tuple[float, np.ndarray]] = {}
    # rank index, where what explains it is compute the trace shows it ran alone: (those steps, its extra compute in
    # them, us per step on average)
    extra_work: dict[int, tuple[list[int], float]] = {}
    # collectives where only one rank arrives from validation or a checkpoint: work the others do not share
    alone = ((marked & member).sum(axis=1) == 1) if marked is not None else np.zeros(len(a.last), bool)
    for i in range(len(a.ranks)):
        # the collectives of its groups in which someone waited, of the kind among them whose waits are the most
        mine, kind, kind_share = heaviest_kind(a, member[:, i] & waited)
        kinds[i] = (mine, kind, kind_share)
        if not mine.any():
            continue
        last = mine & (a.last == i)
        share = float(last.sum() / mine.sum())
        partners = member[mine].any(axis=0)
        partners[i] = False
        if not partners.any():
            continue
        # what its lateness cost its partners: their waits where it arrived last, per partner and step
        cost_rows = mine & (a.last == i)
        cost_us = _partners_wait_us(a, partners, cost_rows, n_steps)
        # where it arrives last from validation or a checkpoint only it ran, at least twice, and the others' waits
        # there alone pass the bar, its lateness has a cause the capture recorded: recurring work of its own, not
        # lateness that moves (was: counted like any lateness, so a rank that alone evaluated every 3rd step, its
        # partner waiting 115 ms of a 398 ms window for it, was last in only 4 of 10 all-reduces and not told; two
        # readers: a warning)
        own = cost_rows & marked[:, i] & alone if marked is not None else np.zeros(len(a.last), bool)
        if int(own.sum()) >= 2 and (own_us := _partners_wait_us(a, partners, own, n_steps)) >= bar_us:
            explained[i] = (own_us, own)
        else:
            # no such marks, but the trace shows the work: in a few of the window's steps (two or more, at most half)
            # it ran compute its partners did not, enough to explain their waits there - an evaluation without
            # .eval(), a metric pass, work on one rank only - lateness with a cause, however rarely it is last (was:
            # lateness that moves, so a rank evaluating alone every 5th step, its partner waiting 229 ms each time,
            # 62% of the window, was information; two readers and their consensus: critical)
            rows_x, steps_x, extra_x = _extra_work(a, by_rank, i, partners, cost_rows)
            window_steps = len(by_rank[a.ranks[i]].step_numbers)
            if (2 <= len(steps_x) and 2 * len(steps_x) <= window_steps
                    and (own_us := _partners_wait_us(a, partners, rows_x, n_steps)) >= bar_us):
                explained[i] = (own_us, rows_x)
                extra_work[i] = (steps_x, extra_x)
        if ((share >= config.straggler_min_last_share or i in explained)
                and (best is None or cost_us > best[0])):
            best = (cost_us, i, share, int(mine.sum()))
    if best is None or best[0] < bar_us:
        return None
    cost_per_step_us, i, last_share, considered = best
    counted, kind, kind_share = kinds[i]
    with_wait = int((waited & member[:, i]).sum())
    of_kind = f"{kind} " if considered < with_wait else ""
    slow = a.ranks[i]
    others = [j for j in range(len(a.ranks)) if j != i and member[member[:, i]].any(axis=0)[j]]
    # as often last as chance would make one of its group's ranks: lateness that moves between ranks
    group_size = max(int(round(float(member[counted].sum(axis=1).mean()))) if counted.any() else 2, 2)
    last_k = int(round(last_share * considered))
    chance = chance_of_last(last_k, considered, group_size)
    # last at least ``odds`` times as often as each other rank of its group on average (in a 2-rank group, in two of
    # three collectives), and in at least half of them, the floor that found it (so of 3 ranks or more, half)
    odds = config.straggler_claim_min_odds
    floor = max(config.straggler_min_last_share, odds / (odds + group_size - 1))
    often = last_k * (odds + group_size - 1) >= odds * considered and last_share >= config.straggler_min_last_share
    needed = max(math.ceil(odds * considered / (odds + group_size - 1)),
                 math.ceil(config.straggler_min_last_share * considered))
    by_chance = chance >= config.straggler_chance_max
    # more than one rank late after work of its own (each at its own steps): whose work holds the job is not one
    # rank's - that lateness moves between them (a reviewer's case: ranks 0 and 1 each working alone in two steps)
    own_work = None if len(extra_work) > 1 and i in extra_work else explained.get(i)
    if own_work is not None and i in extra_work and often and not by_chance:
        # claimed by its arrivals: work of its own in a few steps is not what the claim rests on (a reviewer's case:
        # a rank given sequences three times as long, last at all 12 collectives, was told of "compute the others did
        # not" in 4 steps, advised to share it, and priced at half)
        own_work = None
    own_extra = extra_work.get(i) if own_work is not None else None
    if own_work is not None and (not often or by_chance):
        # told for its own work alone: the rest of its lateness moves between ranks, and sharding that work does not
        # remove it - what the claim rests on is what it costs, explains and a fix places (was: all of its lateness)
        cost_per_step_us, counted = own_work
    # validation or a checkpoint explains lateness only where the straggler arrives from its own such work at a
    # collective the others do not (a sharded evaluation both ran is left out above): else its time there is not why
    # the others wait
    own_marked = (marked is not None) and bool((marked[:, i] & waited & (a.last == i)).any())
    cause, excess = _cause(by_rank[slow], [by_rank[a.ranks[j]] for j in others], cost_per_step_us,
                           skip=() if own_marked else ("validation", "checkpoint"))
    skews = {str(r): (s / 1000.0 if (s := m.skew_ns.get(r)) is not None else None) for r in a.ranks}
    advice = {
        "input": f"Rank {slow} waits longer for data than the others: balance the input pipeline (workers per rank, "
        "shard sizes, storage locality) or prefetch more.",
        "copy": f"Rank {slow} spends longer copying inputs to its GPU: pinned memory and non_blocking copies, and "
        "check its PCIe/NUMA placement.",
        "compute": (f"Rank {slow}'s GPU takes longer for the same step: check uneven batch/sequence lengths across "
                    "ranks, its GPU's clocks, thermals and power limits." if by_rank[slow].components_us.get("copy")
                    is not None else
                    f"Rank {slow}'s operators take longer for the same step: check uneven batch/sequence lengths "
                    "across ranks and what else runs on its cores (CPU contention, thread counts, affinity)."),
        "host": f"Rank {slow}'s host takes longer to issue the step: check CPU contention on its node (other "
        "processes, too many DataLoader workers, CPU affinity).",
        "untraced": f"Rank {slow}'s training thread spends longer than the others' outside any traced operator "
        "(Python the profiler did not record, I/O, a sleep, logging): profile it with with_stack=True to "
        "see what it runs there, and make it run on every rank alike or off the training thread.",
        "validation": f"Rank {slow} runs validation the other ranks do not, and they wait for it at the next "
        "collective: shard the evaluation across the ranks (a DistributedSampler over the validation set, its "
        "metrics reduced), or evaluate less often.",
        "checkpoint": f"Rank {slow} saves checkpoints while the other ranks wait for it at the next collective: save "
        "asynchronously (torch.distributed.checkpoint's async_save), less often, or sharded across the ranks.",
        "unknown": f"Rank {slow} arrives last, but none of its input, copy, compute, host, untraced, validation or "
        "checkpoint time explains "
        "it: check what runs outside the profiled threads on its node.",
    }[cause]
    if own_extra is not None and cause == "compute":
        advice = (f"Rank {slow} runs compute the others do not in step{'s' if len(own_extra[0]) > 1 else ''} "
                  f"{', '.join(f'#{k}' for k in own_extra[0])} ({own_extra[1] / 1000:.1f} ms more than theirs there), "
                  "and they wait for it at the next collective: work on one rank only (an evaluation - also one "
                  "run without model.eval() -, metrics, logging, a save). Share it across the ranks (a "
                  "DistributedSampler over the evaluation data, its results reduced), run it less often, or "
                  "asynchronously.")
    # a collective kernel's start is the rank's arrival only when the trace shows everything queued before it
    incomplete = sorted(s.rank for s in summaries if s.unknown_fraction > config.missing_activity_max_fraction)
    doubt = (f" - but the GPU activity of rank{'s' if len(incomplete) > 1 else ''} "
             f"{', '.join(map(str, incomplete))} is incomplete in the trace, so arrivals are not reliable"
             if incomplete else "")
    # lateness the run's other steps do not show: where the straggler's extra CPU time in the profiled steps explains
    # its lateness, the share of that excess the run's ordinary unprofiled steps keep is the share of its lateness a
    # fix gives over the run, and where they keep under a quarter the profiler slowed it, not the run (was: the
    # window's lateness alone, so a DDP job whose rank 0 ran 62 ms of CPU per profiled step against 35 ms outside the
    # window, while the other rank's steps were alike in both, had rank 0 "the straggler, cause compute", worth 22%:
    # both readers and their consensus read it as the capture's cost, information)
    run_cpu = (None if (own_work is not None and own_extra is None) or incomplete
               else _run_cpu(by_rank[slow], [by_rank[a.ranks[j]] for j in others], cost_per_step_us))
    profiler_only = run_cpu is not None and run_cpu.profiler_only
    if run_cpu is not None:
        advice = (f"Most of rank {slow}'s lateness in the profiled steps is the profiler's: over the run's "
                  f"{run_cpu.steps} ordinary unprofiled steps its {run_cpu.measure}'s CPU is "
                  f"{run_cpu.mine_off_us / 1000:.1f} ms a step against the others' {run_cpu.theirs_off_us / 1000:.1f} "
                  "ms. " + ("What remains is its own: " + advice if run_cpu.excess_us > 0 else
                            "Nothing in the run to fix; to see its steps as they run, profile with lighter options "
                            "(no stacks, shapes or memory) or profile every rank alike.")
                  if profiler_only else advice)
    held = bool(incomplete) or ((not often or by_chance) and own_work is None)
    return Finding(
        id="straggler",
        # a rank last not much more often than the others, or as often as chance would make any rank, is not told
        # from lateness that moves between ranks (a loaded host, noise): said, not claimed
        ceiling="info" if held else "critical",
        ceiling_reason=(
            None
            if incomplete or not held
            else f"it is the last in {last_k} of {considered} of them, fewer than {needed} ({floor:.0%}: "
            f"{odds:g} times as often as each of its group's other {group_size - 1} "
            f"rank{'s' if group_size > 2 else ''}): lateness that moves between ranks (a loaded or noisy host), "
            "not a straggler"
            if not often
            else f"any of its group's {group_size} ranks would be last this often by chance "
            f"{chance:.1%} of the time: lateness that moves between ranks, not a straggler"
        ),
        rank=int(slow),
        title=(
            (f"Rank {slow} arrives last most often in the profiled steps" if profiler_only
             else f"Rank {slow} arrives last most often" if held and not incomplete
             else f"Rank {slow} is the straggler")
            + f": it arrives last at {last_share:.0%} of the {considered} {of_kind}collectives of its "
            f"groups in which a rank waited"
            + ("" if not own_work else
               f" ({int(own_work[1].sum())} of them from validation or a checkpoint only it runs)" if own_extra is None
               else f" ({int(own_work[1].sum())} of them in step{'s' if len(own_extra[0]) > 1 else ''} "
               f"{', '.join(f'#{k}' for k in own_extra[0])}, where it ran {own_extra[1] / 1000:.1f} ms of compute "
               "the others did not)")
            + ", "
            f"and the others wait {cost_per_step_us / 1000:.2f} ms per step for it"
            + (f" (cause: {cause})" if cause != "unknown" else "")
            + (f"; over the run's {run_cpu.steps} ordinary unprofiled steps its {run_cpu.measure}'s CPU is "
               f"{run_cpu.mine_off_us / 1000:.1f} ms a step against the others' {run_cpu.theirs_off_us / 1000:.1f} ms"
               + (": most of its lateness in the window is the profiler's" if profiler_only else "")
               if run_cpu is not None else "")
            + doubt
        ),
        evidence={
            "rank": int(slow),
            "cause": cause,
            "ranks_with_incomplete_gpu_activity": incomplete,
            "cause_excess_us_per_step": round(excess, 3) if excess is not None else None,
            "last_to_arrive_share": round(float(last_share), 4),
            "last_to_arrive_share_of": (f"the {kind} collectives of its process groups in which some rank waited: the "
                                        f"kind whose waits are the most ({kind_share:.0%} of them)"),
            "collectives_kind": kind,
            "collectives_with_a_wait": with_wait,
            "last_this_often_by_chance": round(chance, 4),
            # collectives it reached last from validation or a checkpoint only it ran, and the others' wait there
            "last_after_its_own_marked_work": int(own_work[1].sum()) if own_work and own_extra is None else 0,
            "others_wait_after_its_own_marked_work_us_per_step": round(own_work[0], 3)
            if own_work and own_extra is None else None,
            # where the trace shows the work instead: the steps it ran compute the others did not, how much (us per
            # such step, beyond theirs and its run-queue wait), and what the others waited for it there
            "extra_work_steps": own_extra[0] if own_extra else None,
            "extra_work_us_per_step": round(own_extra[1], 3) if own_extra else None,
            "others_wait_after_its_extra_work_us_per_step": round(own_work[0], 3) if own_work and own_extra else None,
            "group_size": group_size,
            "collectives_considered": considered,
            "matched_collectives": int(len(a.last)),
            "collectives_after_shared_validation_or_checkpoint": int((shared_marked & (a.last >= 0)).sum()),
            "others_wait_us_per_step": round(cost_per_step_us, 3),
            "mean_step_us": round(mean_step_us, 3),
            "clock_skew_us": skews,
            "components_us_per_step": {str(s.rank): s.components_us for s in summaries},
            # where the straggler's extra CPU in the profiled steps explains its lateness: the measure compared (the
            # training thread's where every rank's was timed, else the process's), each rank's median CPU per profiled
            # and ordinary unprofiled step, the straggler's excess over the others' in the unprofiled ones, the share
            # of its excess in the profiled steps they keep (the share of its lateness a fix gives over the run: the
            # estimate scales by it), and whether most of its lateness is the profiler's
            "cpu_measure": run_cpu.measure if run_cpu else None,
            "cpu_us_per_profiled_step": run_cpu.profiled_us if run_cpu else None,
            "cpu_us_per_unprofiled_step": run_cpu.unprofiled_us if run_cpu else None,
            "run_cpu_excess_us_per_step": round(run_cpu.excess_us, 3) if run_cpu else None,
            "run_keeps_share_of_window_excess": run_cpu.kept if run_cpu else None,
            "lateness_cpu_share": round(run_cpu.cpu_share, 4) if run_cpu else None,
            "late_in_profiled_steps_only": profiler_only,
        },
        recommendation=advice,
        impact_us=cost_per_step_us * n_steps,
        # where the others waited, on the straggler's own clock: the estimate places its saving in those steps
        extra={"late_arrivals_ns": _late_arrivals(a, i, m.skew_ns.get(int(slow)), counted)},
    )


@dataclass(frozen=True)
class _RunCpu:
    """The straggler's CPU per step against the others', over the run's profiled and ordinary unprofiled steps."""

    measure: str  # "thread" (the training thread's) or "process"
    profiled_us: dict[str, float]  # rank: median CPU per profiled step
    unprofiled_us: dict[str, float]  # rank: median CPU per ordinary unprofiled step
    steps: int  # the straggler's ordinary unprofiled steps
    mine_off_us: float
    theirs_off_us: float  # the others' median
    excess_us: float  # the straggler's excess over the others' in the unprofiled steps, at least 0
    kept: float  # the share of its excess in the profiled steps that the unprofiled ones keep (0 to 1)
    cpu_share: float  # the share of its lateness its extra CPU in the profiled steps explains (1/2 to 1)
    # they keep under a quarter of it, and its CPU explains three quarters of its lateness or more: most of its
    # lateness in the window is the profiler's (where less, what else it waits for is not known outside the window)
    profiler_only: bool


def _run_cpu(slow: RankSummary, others: list[RankSummary], lateness_us: float) -> _RunCpu | None:
    """Where the straggler's extra CPU per profiled step over the others' (median) explains at least half its lateness,
    its CPU against theirs over the run's ordinary unprofiled steps, on one measure for every rank (the training
    thread's where each rank's was timed, else the process's); None where its lateness is not its CPU, or the capture
    did not time enough steps."""
    ranks = [slow, *others]
    measure = next((m for m in ("thread", "process") if all(m in r.step_cpu_us for r in ranks)), None)
    if measure is None or not others or lateness_us <= 0:
        return None
    mine, theirs = slow.step_cpu_us[measure], [o.step_cpu_us[measure] for o in others]
    their_on = float(np.median([t["profiled_us"] for t in theirs]))
    their_off = float(np.median([t["unprofiled_us"] for t in theirs]))
    in_window = mine["profiled_us"] - their_on
    if in_window < 0.5 * lateness_us:
        return None
    excess = mine["unprofiled_us"] - their_off
    # CPU time against CPU time: under contention a rank's work takes more wall time than CPU time (a busy-wait of
    # 30 ms wall, 22 ms on the CPU), so the run keeps the share of the window's excess its own steps show, which
    # scales the window's lateness (was: the run's excess itself as the cap, so such a rank, 42 ms late a step, was
    # worth 17 ms of CPU, a warning where the readers read critical)
    kept = min(max(excess, 0.0) / in_window, 1.0)
    return _RunCpu(measure=measure,
                   profiled_us={str(r.rank): round(r.step_cpu_us[measure]["profiled_us"], 3) for r in ranks},
                   unprofiled_us={str(r.rank): round(r.step_cpu_us[measure]["unprofiled_us"], 3) for r in ranks},
                   steps=int(mine["unprofiled_steps"]), mine_off_us=mine["unprofiled_us"], theirs_off_us=their_off,
                   excess_us=max(excess, 0.0), kept=kept, cpu_share=min(in_window / lateness_us, 1.0),
                   profiler_only=kept < 0.25 and in_window >= 0.75 * lateness_us)


#: the compute a rank did before arriving at a collective, beyond what its partners did before theirs (their median),
#: explains their wait for it there when it is at least this share of that wait ...
EXTRA_WORK_EXPLAINS = 0.75
#: ... and at least this share of the partners' own compute there ...
EXTRA_WORK_MIN_SHARE = 0.5
#: ... and it ran more compute operators or kernels than they did, by at least this share of theirs and this many:
#: work they did not do, not the same work slowed (a longer batch, a contended core: the same calls, each longer)
EXTRA_WORK_MIN_OPS_SHARE = 0.1
EXTRA_WORK_MIN_OPS = 3


def _extra_work(a: Arrivals, by_rank: dict[int, RankSummary], i: int, partners: np.ndarray,
                rows: np.ndarray) -> tuple[np.ndarray, list[int], float]:
    """Of the collectives ``rows`` (those rank ``i`` came last to), the ones it reached after work its partners did not
    do (``EXTRA_WORK_*``): its compute since its previous collective beyond theirs - less its run-queue wait in that
    step beyond theirs, where the capture timed it - and more calls than theirs. Not in the run's first step (a start
    of its own: warm-up, lazy set-up). Returns (those collectives, the steps holding them, its mean extra compute
    in those steps, us)."""
    none: tuple[np.ndarray, list[int], float] = (np.zeros(len(a.last), bool), [], 0.0)
    me = by_rank.get(a.ranks[i])
    if a.step is None or a.index is None or me is None or len(me.compute_before_us) != len(me.start_ns):
        return none

    def runqueue(s: RankSummary) -> dict[int, float]:
        if len(s.runqueue_us_by_step) != len(s.step_numbers):
            return {}
        return {n: v for n, v in zip(s.step_numbers, s.runqueue_us_by_step, strict=True) if v is not None}

    others = [j for j in np.flatnonzero(partners) if a.ranks[j] in by_rank]
    my_rq, their_rq = runqueue(me), [runqueue(by_rank[a.ranks[j]]) for j in others]
    labels = np.asarray(a.step)
    found = np.zeros(len(a.last), bool)
    extra_by_step: dict[int, float] = {}
    for row in np.flatnonzero(rows):
        st, k = int(labels[row]), int(a.index[row, i])
        if st <= 0 or k < 0:  # not the run's first step (ProfilerStep#0): warm-up, lazy set-up, autotuning
            continue
        theirs = [(float(s.compute_before_us[x]), int(s.ops_before[x])) for j in others
                  if (x := int(a.index[row, j])) >= 0 and len((s := by_rank[a.ranks[j]]).compute_before_us) > x]
        if not theirs:
            continue
        base = float(np.median([c for c, _ in theirs]))
        base_ops = float(np.median([n for _, n in theirs]))
        extra = float(me.compute_before_us[k]) - base
        if st in my_rq:
            rq = [q[st] for q in their_rq if st in q]
            extra -= max(my_rq[st] - (float(np.median(rq)) if rq else 0.0), 0.0)
        surplus = int(me.ops_before[k]) - base_ops
        waited_ns = float(np.mean([a.wait_ns[row, j] for j in others if not np.isnan(a.wait_ns[row, j])] or [0.0]))
        if (waited_ns > 0 and extra >= EXTRA_WORK_EXPLAINS * waited_ns / 1000.0 and extra >= EXTRA_WORK_MIN_SHARE * base
                and surplus >= max(EXTRA_WORK_MIN_OPS, EXTRA_WORK_MIN_OPS_SHARE * base_ops)):
            found[row] = True
            extra_by_step[st] = extra_by_step.get(st, 0.0) + extra
    steps = sorted(extra_by_step)
    return found, steps, (float(np.mean([extra_by_step[st] for st in steps])) if steps else 0.0)


def _partners_wait_us(a: Arrivals, partners: np.ndarray, rows: np.ndarray, n_steps: int) -> float:
    """What a rank's partners waited at ``rows`` (the collectives it arrived last at), per partner and step (us)."""
    waited_ns = [float(a.new_wait_ns(int(j), rows).sum()) for j in np.flatnonzero(partners)]
    return sum(waited_ns) / 1000.0 / len(waited_ns) / n_steps


def heaviest_kind(a: Arrivals, rows: np.ndarray) -> tuple[np.ndarray, str | None, float]:
    """Of the matched collectives ``rows`` picks, those of the kind (operation) whose collectives carry the most
    waits (each collective's longest wait, summed); that kind, and its share of their waits."""
    if not rows.any():
        return rows, None, 0.0
    waits = np.where(rows, np.nan_to_num(np.nanmax(a.wait_ns, axis=1), nan=0.0), 0.0)
    ops = np.asarray(a.op, dtype=object)
    by_kind = {str(op): float(waits[rows & (ops == op)].sum()) for op in dict.fromkeys(ops[rows])}
    kind = max(by_kind, key=lambda k: by_kind[k])
    total = float(waits.sum())
    return rows & (ops == kind), kind, (by_kind[kind] / total if total > 0 else 1.0)


def chance_of_last(k: int, n: int, ranks: int) -> float:
    """The chance that one rank is last in ``k`` or more of ``n`` collectives were each of ``ranks`` ranks equally
    likely to be last in each (the binomial tail, exact: integers up to a few thousand collectives, then a normal
    approximation)."""
    if k <= 0 or n <= 0:
        return 1.0
    if n > 3000:
        mu, sd = n / ranks, math.sqrt(n * (1 / ranks) * (1 - 1 / ranks))
        return 0.5 * math.erfc((k - 0.5 - mu) / (sd * math.sqrt(2))) if sd > 0 else float(k <= mu)
    other = ranks - 1
    tail = sum(math.comb(n, j) * other ** (n - j) for j in range(k, n + 1))
    return tail / ranks ** n


def _late_arrivals(a: Arrivals, i: int, skew_ns: int | None,
                   counted: np.ndarray | None = None) -> list[tuple[int, float]]:
    """(the straggler's own arrival time, ns; its partners' mean wait there, ns) for each collective it came last to
    (of ``counted``, where given)."""
    mine = (a.last == i) if counted is None else (a.last == i) & counted
    partners = [j for j in range(len(a.ranks)) if j != i and not np.isnan(a.wait_ns[mine, j]).all()]
    if not partners:
        return []
    # each partner's wait counted once where collectives in flight together overlap (the union), averaged over the
    # partners in each collective's group (a rank in two groups waits with each apart)
    total = np.sum([a.new_wait_ns(j, mine) for j in partners], axis=0)
    present = (~np.isnan(a.wait_ns[:, partners])).sum(axis=1)
    return [(int(a.arrival_ns[row, i] + (skew_ns or 0)), float(total[row]) / max(int(present[row]), 1))
            for row in np.flatnonzero(mine)]


def _cause(slow: RankSummary, others: list[RankSummary], lateness_us: float,
           skip: tuple[str, ...] = ()) -> tuple[str, float | None]:
    """The component of a step (but ``skip``) in which the slow rank exceeds the others' median most, if that excess
    explains at least a quarter of its lateness."""
    best, best_excess = "unknown", None
    for c in COMPONENTS:
        if c in skip:
            continue
        mine = slow.components_us.get(c)
        theirs = [t for o in others if (t := o.components_us.get(c)) is not None]
        if mine is None or not theirs:
            continue
        excess = float(mine) - float(np.median(theirs))
        if best_excess is None or excess > best_excess:
            best, best_excess = c, excess
    if best_excess is None or best_excess < 0.25 * lateness_us:
        return "unknown", best_excess
    return best, best_excess


def uneven_steps_finding(summaries: list[RankSummary], config: AnalysisConfig) -> Finding | None:
    """The ranks whose runs hold more steps than the others' - uneven shards under ``Join``, or any loop that gives
    some ranks more batches - from every rank's step timings over the run: the job lasts as long as their loops,
    while the others shadow their extra steps' collectives (or wait at the end) untimed. Worth, over the run of the
    one whose extra steps took longest: those steps past the fewest any rank ran, less the steps equal shards would
    still give it at its ordinary step (the ranks' total split evenly), and at most how much longer its run was than
    any other rank's (ranks that do not step together end together however their counts differ). None where a
    rank's run is not known to have ended as written, the ranks step on different optimizers, the counts differ by
    fewer than ``uneven_steps_min_extra``, or equal shards would not shorten it."""
    if len(summaries) < 2 or any(s.run_steps is None or s.run_usual_step_us is None or s.run_wall_us is None
                                 or s.run_tail_us is None for s in summaries):
        return None
    if len({s.run_step_source for s in summaries}) > 1:  # a step is not the same thing on every rank
        return None
    counts = {s.rank: int(s.run_steps or 0) for s in summaries}
    fewest, most = min(counts.values()), max(counts.values())
    if most - fewest < config.uneven_steps_min_extra:
        return None
    extra = most - fewest

    def tail_us(s: RankSummary) -> float:
        """Its steps past the fewest any rank ran (us): the walls kept, the usual step for the rest."""
        usual, kept = float(s.run_usual_step_us or 0.0), s.run_tail_us or []
        past = int(s.run_steps or 0) - fewest
        known = kept[-past:] if past <= len(kept) else kept
        return sum(w if w is not None else usual for w in known) + (past - len(known)) * usual

    top = [s for s in summaries if counts[s.rank] == most]
    slow = max(top, key=tail_us)
    usual = float(slow.run_usual_step_us or 0.0)
    extra_us = tail_us(slow)
    even = sum(counts.values()) / len(counts)
    longer_us = float(slow.run_wall_us or 0.0) - max(float(s.run_wall_us or 0.0) for s in summaries
                                                     if counts[s.rank] < most)
    cost_us = min(extra_us - (even - fewest) * usual, longer_us)
    if cost_us <= 0:
        return None
    run_us = float(slow.run_wall_us or 0.0)
    low = sorted(r for r, n in counts.items() if n == fewest)

    def who(ranks: list[int], cap: bool) -> str:
        word = ("Rank" if cap else "rank") + ("s" if len(ranks) > 1 else "")
        return f"{word} {', '.join(str(r) for r in ranks)}"

    many = len(top) > 1
    them = who(sorted(s.rank for s in top), True)
    return Finding(
        id="straggler",
        rank=int(slow.rank),
        title=(f"{them} {'are the stragglers' if many else 'is the straggler'}: "
               f"{'each ran' if many else 'it ran'} {most} steps, {extra} more than {who(low, False)} ({fewest}), "
               f"and the job ran on after {who(low, False)} had ended {'their loops' if len(low) > 1 else 'its loop'}: "
               f"rank {slow.rank}'s last "
               f"{extra} took {extra_us / 1000:.1f} ms" + (f" ({extra_us / run_us:.0%} of its run)" if run_us > 0
                                                           else "")),
        evidence={
            "rank": int(slow.rank),
            "cause": "uneven_steps",
            "steps_by_rank": {str(r): n for r, n in sorted(counts.items())},
            "ranks_with_most_steps": sorted(int(s.rank) for s in top),
            "extra_steps": extra,
            "extra_steps_us": round(extra_us, 3),
            "usual_step_us": round(usual, 3),
            "even_steps": round(even, 3),
            "longer_than_other_ranks_us": round(longer_us, 3),
            "saving_us": round(cost_us, 3),
            "run_us": round(run_us, 3),
            "others_wait_us_per_step": None,
            "cause_excess_us_per_step": None,
        },
        recommendation=(f"Give every rank the same number of batches: the data of "
                        f"{who(sorted(s.rank for s in top), False)} hold{'' if many else 's'} more than that of "
                        f"{who(low, False)}, so the job runs on after the others' loops end (under DDP's Join they "
                        "shadow the longer ranks' collectives). Shard with a "
                        "DistributedSampler over the whole dataset (it pads the shards to one length), or cut each "
                        f"rank's shard to the shortest (drop_last); the estimate spreads the ranks' "
                        f"{sum(counts.values())} steps evenly, {even:g} each, at rank {slow.rank}'s ordinary step "
                        f"({usual / 1000:.2f} ms)."),
        run_cost_us=cost_us,
    )


def _with_uneven(found: Finding | None, uneven: Finding | None) -> Finding | None:
    """The job's straggler: the one its collectives name where it is claimed; else a rank whose run has more steps
    than the others', with what the collectives said of the window kept in its evidence."""
    if uneven is None:
        return found
    if found is not None and found.ceiling != "info":
        return replace(found, evidence={**found.evidence, "uneven_steps": {
            k: uneven.evidence[k] for k in ("steps_by_rank", "extra_steps", "extra_steps_us", "saving_us")}})
    if found is None:
        return uneven
    return replace(uneven, evidence={**uneven.evidence, "window_lateness": found.title})


def job_analysis(
    summaries: list[RankSummary], config: AnalysisConfig
) -> tuple[Collectives, pd.DataFrame, Finding | None]:
    """The job-level result from per-rank summaries: metrics, the matched collectives, the straggler (by the
    collectives' arrivals, else by the run's step counts)."""
    m = match(summaries)
    a = arrivals(summaries, m)
    metrics = job_metrics(summaries, m, a)
    table = pd.DataFrame({
        "group": a.group, "op": a.op, "transfer_us": a.transfer_ns / 1000.0,
        "waited_for_rank": pd.array([a.ranks[i] if i >= 0 else None for i in a.last], dtype="Int64"),
        "max_wait_us": np.nanmax(a.wait_ns, axis=1) / 1000.0 if len(a.wait_ns) else np.zeros(0),
    })
    return metrics, table, _with_uneven(straggler_finding(summaries, m, a, config),
                                        uneven_steps_finding(summaries, config))


@register("collectives", "Collectives across ranks", scope="job", per_rank=rank_summary, reduce=job_analysis)
def analyze_collectives(trace: Trace, config: AnalysisConfig) -> AnalysisResult:
    """Match collectives across ranks (process group, sequence number, operation and size), align the
    ranks' clocks on collective completion, and name the rank each collective waited for and the straggler."""
    if len(trace.ranks) < 2:
        return AnalysisResult(key="collectives", metrics=None)
    summaries = [rank_summary(r) for r in trace.ranks]
    if sum(1 for s in summaries if s.op) < 2:
        return AnalysisResult(key="collectives", metrics=None)
    metrics, table, finding = job_analysis(summaries, config)
    return AnalysisResult(key="collectives", metrics=metrics, tables={"collectives": table},
                          findings=(finding,) if finding else ())
