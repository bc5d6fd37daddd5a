"""Communication by what it serves (``model.commroles``): per role, its time, the part no compute hid (exposed), and
what hiding it entirely would be worth through the replay; FSDP's all-gathers in flight and queued behind each
other on one communicator."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.collectives import comm_compute_sets, host_compute
from kinetoscope.analyze.model.commroles import ROLES, collective_roles
from kinetoscope.analyze.model.config import DEFAULT_CONFIG, AnalysisConfig
from kinetoscope.analyze.model.missing import missing_activity
from kinetoscope.analyze.model.pipeline import pipeline_stage
from kinetoscope.analyze.model.results import CommRole, CommRoles, FsdpGathers
from kinetoscope.analyze.model.timeline import window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us
from kinetoscope.analyze.whatif.graph import replay_graph
from kinetoscope.analyze.whatif.replay import Edits, baseline, replay

#: an all-gather that started within this of the previous one's end, on its stream (or gloo thread), after being
#: issued before that end, waited in line behind it
QUEUE_TOL_NS = 5_000


def _exposed(trace: RankTrace, coll: pd.DataFrame, where: str,
             config: AnalysisConfig) -> tuple[iv.Intervals | None, str | None]:
    """The window's collective time no compute ran beside (None where it cannot be told, and why)."""
    w = window(trace)
    if where == "gpu":
        comm_set, compute_set = comm_compute_sets(trace)
        missing = missing_activity(trace)
        unknown = iv.measure(iv.intersect(comm_set, missing.blind))
        if unknown >= iv.measure(comm_set) or missing.holes_ns > config.missing_activity_max_fraction * w.dur_ns:
            return None, "the trace misses part of the GPU's activity"
        return iv.subtract(iv.subtract(comm_set, compute_set), missing.blind), None
    if trace.has_gpu:
        return None, "collectives recorded on the host only: the GPU's activity is not recorded"
    comm_set = iv.clip(iv.union(coll["ts_ns"].to_numpy(), coll["end_ns"].to_numpy()), w.start_ns, w.end_ns)
    compute = host_compute(trace, {str(t) for t in coll["tid"].unique()}, w)
    if not iv.measure(compute):
        return None, "no compute traced beside the collectives"
    return iv.subtract(comm_set, compute), None


def _worth_ns(trace: RankTrace, labels: np.ndarray) -> float | None:
    """The replayed mean step less the same with these collective kernels taking no time."""
    g = replay_graph(trace)
    if not g.steps:
        return None
    pos = pd.Series(np.arange(len(g.op_label)), index=g.op_label)
    ops = pos.reindex(labels).dropna().astype(np.int64).to_numpy()
    if not len(ops):
        return None
    after = replay(g, Edits(op_dur={int(j): 0 for j in ops}))
    return baseline(trace).mean_step_ns - after.mean_step_ns


def _fsdp(coll: pd.DataFrame) -> FsdpGathers | None:
    ag = coll[(coll["role"] == "fsdp_allgather").to_numpy()]
    if ag.empty:
        return None
    issued = ag["issued_ns"].to_numpy(np.int64)
    start = ag["ts_ns"].to_numpy(np.int64)
    end = ag["end_ns"].to_numpy(np.int64)
    known = issued >= 0
    # in flight: issued and not yet done (a sweep over issue and end times)
    t = np.r_[issued[known], end[known]]
    d = np.r_[np.ones(known.sum(), dtype=np.int64), -np.ones(known.sum(), dtype=np.int64)]
    order = np.lexsort((d, t))  # an end before an issue at the same time
    in_flight = int(np.cumsum(d[order]).max()) if len(order) else None
    lane = (ag["device"].astype(str) + "/" + ag["stream"].astype(str)).to_numpy(object) \
        if ag["device"].notna().all() else ag["tid"].astype(str).to_numpy(object)
    queued, queued_ns = 0, 0
    for key in dict.fromkeys(lane):
        mine = np.flatnonzero(lane == key)
        mine = mine[np.argsort(start[mine], kind="stable")]
        for a, b in zip(mine[:-1], mine[1:], strict=False):
            if 0 <= issued[b] < end[a] and start[b] - end[a] <= QUEUE_TOL_NS:
                queued += 1
                queued_ns += int(start[b] - issued[b])
    return FsdpGathers(allgathers=int(len(ag)), issue_recorded=int(known.sum()), max_in_flight=in_flight,
                       queued_behind_previous=queued, queued_us=us(queued_ns))


def comm_roles_entry(trace: RankTrace, config: AnalysisConfig = DEFAULT_CONFIG) -> CommRoles | None:
    """The report's ``comm_roles`` block; None without collectives."""
    coll = collective_roles(trace)
    if coll.empty:
        return None
    where = str(coll["where"].iloc[0])
    w = window(trace)
    exposed, why = _exposed(trace, coll, where, config)
    g = replay_graph(trace)
    roles = []
    worth_by_role: dict[str, float | None] = {}
    for role in ROLES:
        mine = coll[(coll["role"] == role).to_numpy()]
        if mine.empty:
            continue
        busy = iv.clip(iv.union(mine["ts_ns"].to_numpy(), mine["end_ns"].to_numpy()), w.start_ns, w.end_ns)
        exp_ns = iv.measure(iv.intersect(busy, exposed)) if exposed is not None else None
        worth = worth_by_role[role] = _worth_ns(trace, mine.index.to_numpy()) if where == "gpu" else None
        roles.append(CommRole(role=role, collectives=int(len(mine)),
                              ops=sorted({"unknown" if o == "other" else str(o) for o in mine["op"]}),
                              ops_unknown=int((mine["op"] == "other").sum()),
                              time_us=us(iv.measure(busy)),
                              exposed_us=us(exp_ns) if exp_ns is not None else None,
                              exposed_fraction=frac(exp_ns, w.dur_ns) if exp_ns is not None else None,
                              worth_us_per_step=round(worth / 1000, 3) if worth is not None else None))
    return CommRoles(where=where, fraction_of="window", roles=roles, exposed_unknown=why,
                     worth_of=("the replayed mean step less the same with the role's collective kernels taking no "
                               "time (hidden entirely: an upper bound on what overlapping them gives)"
                               if where == "gpu" and g.steps else None),
                     fsdp=_fsdp(coll), pipeline=pipeline_stage(trace, config, worth_by_role.get("pipeline")))
