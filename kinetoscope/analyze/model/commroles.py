"""What each collective serves: the parallelism behind it, from its operation, where the host issued it (inside an
FSDP annotation, in the step's forward or backward) and its kind of transfer.

Roles, first match in this order:
  pipeline     send / recv / sendrecv (pipeline stages passing activations and gradients)
  alltoall     all-to-all (MoE expert exchange, embedding exchange)
  fsdp_allgather       an all-gather issued inside an ``FSDP::``/``fsdp::`` annotation: FSDP gathering parameters
  fsdp_reducescatter   a reduce-scatter issued inside one, or in backward: FSDP (or ZeRO) reducing gradients
  dp_allreduce         an all-reduce issued in backward (DDP's gradient buckets), or inside an FSDP annotation
                       (HSDP's replicate all-reduce)
  tp_forward           an all-reduce, all-gather or reduce-scatter issued in the forward: tensor parallelism
  other        the rest (a loss or grad-norm all-reduce, broadcasts, barriers)
The host issues a collective kernel where its launch call is (correlation id); a CPU (gloo) collective runs on
a worker thread after the ``c10d::`` op that queued it, matched first in, first out, and takes that op's operation
(gloo reduces-scatters with all-reduces: the ``c10d::`` op says what it is).

A kernel whose name does not tell its operation (RCCL's ``ncclDevKernel_Generic``; the ``SendRecv`` kernel NCCL runs
all-to-all and grouped send/recv with) and carries no ``Collective name`` takes the operation of the host op that
launched it: the innermost ``record_param_comms`` with a ``Collective name``, ``nccl:<op>`` or ``c10d::<op>`` enclosing
its launch call on the launching thread. A kernel name that names another operation wins."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.collectives import collectives, host_collectives
from kinetoscope.analyze.model.distributed import normalise_op
from kinetoscope.analyze.model.phases import PHASES, host_phases, phase_lookup
from kinetoscope.analyze.model.timeline import kind_mask, name_mask, runtime_calls
from kinetoscope.analyze.model.trace import RankTrace, trace_view

ROLES = ("fsdp_allgather", "fsdp_reducescatter", "dp_allreduce", "tp_forward", "pipeline", "alltoall", "other")
FSDP_RE = re.compile(r"^(?:FSDP::|fsdp::|FullyShardedDataParallel)")
#: the c10d ops that queue a collective (not its bookkeeping: c10d::wait, c10d::allreduce_coalesced's parts)
C10D_COLLECTIVE_RE = re.compile(r"^c10d::(?:_?all|_?reduce|broadcast|send|recv|alltoall|gather|scatter|barrier)")
_P2P = frozenset({"send", "recv", "sendrecv"})
#: host ops that name the collective they launch (record_param_comms through its "Collective name" arg)
HOST_COMM_RE = re.compile(r"^(?:nccl:|c10d::|record_param_comms$)")
#: operations the host op says better than the kernel's name: none named, or NCCL's send/recv kernel
_KERNEL_GENERIC = frozenset({"other", "sendrecv"})
_KNOWN_OPS = frozenset({"allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv", "send", "recv",
                        "reduce", "barrier", "gather", "scatter"})


def _role(op: str, phase: str, in_fsdp: bool) -> str:
    if op in _P2P:
        return "pipeline"
    if op == "alltoall":
        return "alltoall"
    if op == "allgather" and in_fsdp:
        return "fsdp_allgather"
    if op == "reducescatter" and (in_fsdp or phase == "backward"):
        return "fsdp_reducescatter"
    if op == "allreduce" and (phase == "backward" or in_fsdp):
        return "dp_allreduce"
    if op in ("allreduce", "allgather", "reducescatter") and phase == "forward":
        return "tp_forward"
    return "other"


def _per_thread(frame: pd.DataFrame) -> dict[str, iv.Intervals]:
    out = {}
    for tid, g in frame.groupby(frame["tid"].astype(str), observed=True, sort=False):
        out[str(tid)] = iv.union(g["ts_ns"].to_numpy(), g["end_ns"].to_numpy())
    return out


def _inside(sets: dict[str, iv.Intervals], tids: np.ndarray, t: np.ndarray) -> np.ndarray:
    out = np.zeros(len(t), dtype=bool)
    for k, (tid, at) in enumerate(zip(tids, t, strict=False)):
        s = sets.get(str(tid))
        if s is not None and at >= 0:
            i = int(np.searchsorted(s[0], at, side="right")) - 1
            out[k] = i >= 0 and at < s[1][i]
    return out


def _phase_at(trace: RankTrace, t: np.ndarray) -> np.ndarray:
    starts, ends, labels = phase_lookup(host_phases(trace))
    if not starts.size:
        return np.full(len(t), "other", dtype=object)
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = (idx >= 0) & (t < ends[np.maximum(idx, 0)]) & (t >= 0)
    return np.asarray(PHASES, dtype=object)[np.where(ok, labels[np.maximum(idx, 0)], PHASES.index("other"))]


def issued_gpu(trace: RankTrace, coll: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each collective kernel's launch call (matched on its correlation id): its start (-1: not recorded) and
    thread."""
    rt = runtime_calls(trace)
    rt = rt[rt["correlation"].notna().to_numpy()].drop_duplicates("correlation")
    by_corr = pd.Series(np.arange(len(rt)), index=rt["correlation"].to_numpy(np.int64))
    corr = coll["correlation"].fillna(-1).to_numpy(np.int64)
    pos = by_corr.reindex(corr).to_numpy(dtype=float, na_value=np.nan)
    has = ~np.isnan(pos)
    p = np.where(has, pos, 0).astype(np.int64)
    ts = np.where(has, rt["ts_ns"].to_numpy(np.int64)[p] if len(rt) else -1, -1)
    tid = np.where(has, rt["tid"].astype(str).to_numpy(object)[p] if len(rt) else "", "")
    return ts, tid


def _host_ops(trace: RankTrace, op: np.ndarray, ts: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """``op`` with each generic one (``_KERNEL_GENERIC``) replaced by the innermost host op naming a collective that
    encloses its launch at ``ts`` on thread ``tid``; kept where there is none."""
    generic = np.array([str(o) in _KERNEL_GENERIC for o in op], dtype=bool) & (ts >= 0)
    if not generic.any():
        return op
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op", "annotation")) & name_mask(ev, HOST_COMM_RE)]
    if ops.empty:
        return op
    meta = trace.comm_args.set_index("row")
    coll_name = meta["coll_name"].reindex(ops.index) if "coll_name" in meta else pd.Series(None, index=ops.index)
    named = []
    for name, c in zip(ops["name"].astype(str), coll_name, strict=False):
        if name == "record_param_comms":
            named.append(normalise_op(str(c)) if c is not None and c == c else "")
        else:
            named.append(normalise_op(name.split(":")[-1]))
    known = np.array([n in _KNOWN_OPS for n in named], dtype=bool)
    ops, host_op = ops[known], np.asarray(named, dtype=object)[known]
    o_ts, o_end = ops["ts_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    o_tid = ops["tid"].astype(str).to_numpy(object)
    out = op.copy()
    for k in np.flatnonzero(generic):
        enclosing = np.flatnonzero((o_tid == tid[k]) & (o_ts <= ts[k]) & (ts[k] < o_end))
        if enclosing.size:  # the innermost: the latest to start
            out[k] = host_op[enclosing[np.argmax(o_ts[enclosing])]]
    return out


def _issued_host(trace: RankTrace, coll: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each host (gloo) collective's ``c10d::`` op, first queued first run: its start (-1: none), thread and
    operation (the collective's own where none)."""
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",)) & name_mask(ev, C10D_COLLECTIVE_RE)].sort_values("ts_ns", kind="stable")
    q_ts = ops["ts_ns"].to_numpy(np.int64)
    q_tid = ops["tid"].astype(str).to_numpy(object)
    q_op = np.array([normalise_op(str(n).split("::", 1)[-1]) for n in ops["name"]], dtype=object)
    order = np.argsort(coll["ts_ns"].to_numpy(np.int64), kind="stable")
    ts = np.full(len(coll), -1, dtype=np.int64)
    tid = np.full(len(coll), "", dtype=object)
    op = coll["op"].astype(str).to_numpy(object).copy()
    nxt = 0
    starts = coll["ts_ns"].to_numpy(np.int64)
    for k in order:
        if nxt < len(q_ts) and q_ts[nxt] <= starts[k]:
            ts[k], tid[k], op[k] = q_ts[nxt], q_tid[nxt], q_op[nxt]
            nxt += 1
    return ts, tid, op


@trace_view
def collective_roles(trace: RankTrace) -> pd.DataFrame:
    """The window's collectives (kernels, else the host's gloo/nccl annotations) with ``role``, ``issued_ns`` (the
    host's launch or queueing call; -1 where not recorded), ``phase`` there, ``in_fsdp`` and ``where`` (gpu/host)."""
    coll = collectives(trace)
    where = "gpu"
    if coll.empty:
        coll, where = host_collectives(trace), "host"
    if coll.empty:
        return coll.assign(role=pd.Series(dtype=object), issued_ns=pd.Series(dtype=np.int64),
                           phase=pd.Series(dtype=object), in_fsdp=pd.Series(dtype=bool), where=where)
    if where == "gpu":
        ts, tid = issued_gpu(trace, coll)
        op = _host_ops(trace, coll["op"].astype(str).to_numpy(object), ts, tid)
    else:
        ts, tid, op = _issued_host(trace, coll)
    ev = trace.events
    fsdp = ev[kind_mask(ev, ("cpu_op", "annotation")) & name_mask(ev, FSDP_RE)]
    in_fsdp = _inside(_per_thread(fsdp), tid, ts) if len(fsdp) else np.zeros(len(coll), dtype=bool)
    phase = _phase_at(trace, ts)
    role = [_role(str(o), str(p), bool(f)) for o, p, f in zip(op, phase, in_fsdp, strict=False)]
    return coll.assign(op=op, role=role, issued_ns=ts, phase=phase, in_fsdp=in_fsdp, where=where)
