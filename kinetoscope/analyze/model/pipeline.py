"""A rank as a pipeline stage (``PipelineStage``): the neighbours it passes activations and gradients to, and its
bubble in each complete step, the time it waited for them (the schedule's warm-up and cool-down, and the waits in
between). ``whatif.commroles`` writes it in ``comm_roles`` with what the replay says removing the waits is worth;
the ``pipeline_bubble`` finding rests on it.

The stage's neighbours are the other members of the two-rank process groups its send/recv kernels run in (a larger
group does not say who the peer is); on the host (gloo), the rank argument of the ``c10d::send``/``c10d::recv_`` op
that queued each one, where ``record_shapes`` recorded it and the job had one process group; in a two-rank job, the
other rank. In a step (the first complete one), the recv that ends first, where it ends before
the first send starts, brought activations from the upstream stage (a recv is posted early and ends when its data is
there); the first send to another rank goes to the downstream one. The first stage has nothing before it sends, the
last sends only upstream (gradients). On the GPU, the bubble is the time a send or recv kernel ran and
no compute kernel did: NCCL's send/recv kernels spin until the peer is there, so a stage waiting for its neighbour
shows as one of them alone on the GPU."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.collectives import comm_compute_sets, host_compute
from kinetoscope.analyze.model.commroles import collective_roles
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.missing import missing_activity
from kinetoscope.analyze.model.results import BubbleStep, PipelineStage
from kinetoscope.analyze.model.timeline import window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us

#: each step lists this many of its bubble's intervals at most (a real schedule has one or two per microbatch)
BUBBLE_INTERVALS_MAX = 64
_RANKS_RE = re.compile(r"-?\d+")
#: the host ops that queue a send or a recv (their third argument is the peer's rank in the group)
_C10D_P2P = ("c10d::send", "c10d::recv_")

MEASURE_GPU = ("the time a send or recv kernel ran and no compute kernel did (the stage's GPU waiting for a "
               "neighbour's activations or gradients)")
MEASURE_HOST = ("the time the training thread was held by send/recv beside no compute op: a recv from its start (a "
                "schedule waits for it at once), a send from the end of the last compute op inside it (its wait comes "
                "after other work)")
WINDOW = "each complete profiler step's span (host clock); intervals in us from its start"
WORTH_GPU = ("the replayed mean step less the same with this stage's send/recv kernels taking no time: the stage "
             "never waiting for its neighbours, an upper bound on what a schedule with fewer bubbles (more "
             "microbatches, interleaved stages, zero-bubble) gives this stage; the neighbours' own work bounds it too")
WORTH_HOST = ("not replayed: the replay holds no host send/recv; removing the bubble saves this stage at most "
              "bubble_us_per_step")


def _group_peer(ranks: object, me: int | None) -> int | None:
    """The other rank of a two-rank group written as the trace writes it ("[0, 1]"); None otherwise."""
    if me is None or ranks is None or ranks != ranks:
        return None
    found = [int(x) for x in _RANKS_RE.findall(str(ranks))]
    if len(found) != 2 or me not in found:
        return None
    return found[1] if found[0] == me else found[0]


def _single_group(trace: RankTrace) -> bool:
    """Whether the job had one process group, the default one (``distributedInfo``'s ``pg_count``): a send/recv's
    peer, a rank in its group, is then a global rank."""
    info = trace.meta.distributed_info or {}
    return info.get("pg_count") == 1


def _host_peers(trace: RankTrace, p2p: pd.DataFrame) -> list[int | None]:
    """Each host send/recv's peer from the ``c10d::send``/``c10d::recv_`` op that queued it: its rank argument (the
    third of its "Concrete Inputs", recorded with ``record_shapes``), a rank in its process group, taken as global
    only where the job had one group."""
    out: list[int | None] = [None] * len(p2p)
    if not _single_group(trace) or trace.shapes.empty:
        return out
    ev = trace.events
    concrete = trace.shapes.set_index("row")["concrete_inputs"]
    c10d = ev[(ev["kind"] == "cpu_op").to_numpy() & ev["name"].astype(str).isin(_C10D_P2P).to_numpy()]
    at = {(str(t), int(ts)): row for row, t, ts in zip(c10d.index, c10d["tid"], c10d["ts_ns"], strict=False)}
    for k, (tid, issued) in enumerate(zip(p2p["tid"].astype(str), p2p["issued_ns"].to_numpy(np.int64), strict=False)):
        row = at.get((tid, int(issued)))
        text = concrete.get(row) if row is not None else None
        try:
            args = json.loads(str(text)) if text is not None and text == text else None
            out[k] = int(args[2]) if isinstance(args, list) and len(args) > 2 and str(args[2]).strip() else None
        except (ValueError, TypeError):
            out[k] = None
    return out


def _peers(trace: RankTrace, p2p: pd.DataFrame) -> list[int | None]:
    """Each send/recv's peer: the other member of its two-rank group (kernels), the rank argument of the op that
    queued it (host), else the other rank of a two-rank job; None where the trace cannot say."""
    me = trace.rank
    if str(p2p["where"].iloc[0]) == "gpu":
        peers = [_group_peer(r, me) for r in p2p["group_ranks"]]
    else:
        peers = _host_peers(trace, p2p)
    world = trace.meta.world_size
    if world == 2 and me in (0, 1):
        peers = [1 - me if p is None else p for p in peers]
    return [p if p != me else None for p in peers]


def _neighbours(p2p: pd.DataFrame, peers: list[int | None],
                first: tuple[int, int] | None) -> tuple[int | None, int | None]:
    """Upstream and downstream ranks from the send/recv of one step (the first complete one; else all of them)."""
    peer = np.array(peers, dtype=object)
    if first is not None:
        inside = ((p2p["ts_ns"] >= first[0]) & (p2p["ts_ns"] < first[1])).to_numpy()
        if inside.any():
            p2p, peer = p2p[inside], peer[inside]
    ops = p2p["op"].astype(str).to_numpy(object)
    sends, recvs = ops == "send", ops == "recv"
    first_send = int(p2p["ts_ns"].to_numpy(np.int64)[sends].min()) if sends.any() else None
    up = None
    if recvs.any():  # a recv is posted early and ends when the data is there: its end says when the stage had it
        ends = p2p["end_ns"].to_numpy(np.int64)[recvs]
        k = int(np.argmin(ends))
        if first_send is None or ends[k] <= first_send:
            up = peer[recvs][k]
    order = np.argsort(p2p["ts_ns"].to_numpy(np.int64)[sends], kind="stable")
    down = next((p for p in peer[sends][order] if p is not None and p != up), None)
    return up, down


def _complete_steps(trace: RankTrace) -> pd.DataFrame:
    steps = trace.steps
    if len(steps) and "partial" in steps:
        steps = steps[~steps["partial"].to_numpy()]
    return steps.sort_values("start_ns", kind="stable")


def _bubbles(trace: RankTrace, p2p: pd.DataFrame, where: str,
             config: AnalysisConfig) -> tuple[iv.Intervals | None, str | None]:
    """The window's bubble as one union (None where it cannot be told, and why)."""
    w = window(trace)
    p2p_set = iv.clip(iv.union(p2p["ts_ns"].to_numpy(), p2p["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    if where == "gpu":
        _, compute = comm_compute_sets(trace)
        missing = missing_activity(trace)
        if iv.measure(iv.intersect(p2p_set, missing.blind)) >= iv.measure(p2p_set) \
                or missing.holes_ns > config.missing_activity_max_fraction * w.dur_ns:
            return None, "the trace misses part of the GPU's activity"
        return iv.subtract(iv.subtract(p2p_set, compute), missing.blind), None
    if trace.has_gpu:
        return None, "send/recv recorded on the host only: the GPU's activity is not recorded"
    # gloo runs a send/recv on the thread that called it (the training thread): every thread's ops but communication
    compute = host_compute(trace, set(), w)
    if not iv.measure(compute):
        return None, "no compute traced beside the send/recv"
    return iv.subtract(_host_blocked(p2p, compute), compute), None


def _host_blocked(p2p: pd.DataFrame, compute: iv.Intervals) -> iv.Intervals:
    """Where the training thread was held by send/recv on the host: a recv from its start (a schedule waits for it at
    once), a send from the end of the last compute inside it (its wait comes later, after other work: before then
    the gaps between ops are Python, not waiting)."""
    ts = p2p["ts_ns"].to_numpy(np.int64)
    end = p2p["end_ns"].to_numpy(np.int64)
    start = ts.copy()
    sends = (p2p["op"].astype(str) == "send").to_numpy()
    c0, c1 = compute
    for k in np.flatnonzero(sends):
        # the compute intervals that end inside the send, the latest of them
        j = int(np.searchsorted(c1, end[k], side="right")) - 1
        if j >= 0 and c1[j] > ts[k]:
            start[k] = int(c1[j])
        i = int(np.searchsorted(c0, end[k], side="left")) - 1  # an interval running past the send's end
        if i >= 0 and c1[i] > end[k]:
            start[k] = end[k]
    return iv.union(start, np.maximum(start, end))


def _per_step(bubble: iv.Intervals | None, steps: pd.DataFrame) -> list[BubbleStep]:
    out = []
    for n, s0, s1 in zip(steps["step"], steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64),
                         strict=False):
        if bubble is None:
            out.append(BubbleStep(step=int(n), step_us=us(s1 - s0) or 0.0, bubble_us=None, bubble_fraction=None,
                                  intervals_us=[], intervals_left_out=0))
            continue
        mine = iv.clip(bubble, int(s0), int(s1))
        shown = [[us(a - s0) or 0.0, us(b - s0) or 0.0]
                 for a, b in zip(mine[0][:BUBBLE_INTERVALS_MAX], mine[1][:BUBBLE_INTERVALS_MAX], strict=False)]
        out.append(BubbleStep(step=int(n), step_us=us(s1 - s0) or 0.0, bubble_us=us(iv.measure(mine)),
                              bubble_fraction=frac(iv.measure(mine), s1 - s0), intervals_us=shown,
                              intervals_left_out=max(len(mine[0]) - BUBBLE_INTERVALS_MAX, 0)))
    return out


def pipeline_stage(trace: RankTrace, config: AnalysisConfig, worth_ns: float | None) -> PipelineStage | None:
    """The rank as a pipeline stage; None without send/recv. ``worth_ns``: what the replay gives with this rank's
    send/recv kernels taking no time (``whatif.commroles``), None where not replayed."""
    coll = collective_roles(trace)
    p2p = coll[(coll["role"] == "pipeline").to_numpy()] if len(coll) else coll
    if p2p.empty:
        return None
    where = str(p2p["where"].iloc[0])
    steps = _complete_steps(trace)
    first = (int(steps["start_ns"].iloc[0]), int(steps["end_ns"].iloc[0])) if len(steps) else None
    each = _peers(trace, p2p)
    up, down = _neighbours(p2p, each, first)
    peers = sorted({p for p in each if p is not None})
    bubble, why = _bubbles(trace, p2p, where, config)
    per_step = _per_step(bubble, steps)
    known = [s.bubble_us for s in per_step if s.bubble_us is not None]
    mean_bubble = float(np.mean(known)) if known and len(known) == len(per_step) else None
    mean_step = float(np.mean([s.step_us for s in per_step])) if per_step else None
    return PipelineStage(
        where=where, peers=peers, upstream_rank=up, downstream_rank=down, p2p_ops=int(len(p2p)),
        measure=MEASURE_GPU if where == "gpu" else MEASURE_HOST, window=WINDOW, fraction_of="the mean step",
        steps=per_step,
        bubble_us_per_step=round(mean_bubble, 3) if mean_bubble is not None else None,
        bubble_fraction=frac(mean_bubble, mean_step),
        worth_us_per_step=round(worth_ns / 1000, 3) if worth_ns is not None else None,
        worth_of=WORTH_GPU if where == "gpu" else WORTH_HOST,
        bubble_unknown=why if why is not None else (None if per_step else "no complete profiler step"))
