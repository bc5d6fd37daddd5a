"""The counted work of a rank's host ops and the GPU kernels that did it.

An op is counted (``flops.is_counted``: matrix ops for FLOPs, memory-bound ops for bytes) unless an op of its thread
that holds it is counted too: ``aten::convolution`` is counted, not the ``aten::_convolution`` inside it, as
FlopCounterMode counts the op it sees first. Its kernels are those launched from inside it: the runtime/driver calls
of its thread within its span, joined to the GPU work of their correlation ids (backward ops too: autograd's thread
launches their kernels inside them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.flops import MATRIX_OPS, is_counted, op_work
from kinetoscope.analyze.model.timeline import kernels, kind_mask, launches
from kinetoscope.analyze.model.trace import RankTrace, trace_view

OP_COLUMNS = ("row", "name", "tid", "ts_ns", "end_ns", "kind", "flops", "bytes", "input_type", "why")


def _outermost(tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per op (already sorted by thread, start, longest first): whether no earlier op of its thread holds it."""
    keep = np.ones(len(ts), dtype=bool)
    last_tid, reach = None, -1
    for i in range(len(ts)):
        if tid[i] != last_tid:
            last_tid, reach = tid[i], -1
        if ts[i] < reach:
            keep[i] = False
        else:
            reach = end[i]
    return keep


@trace_view
def counted_ops(trace: RankTrace) -> pd.DataFrame:
    """Every counted op (outermost of its thread) with its work: ``flops`` and ``bytes`` (float, NaN where the
    shapes do not tell; ``why`` says why), the first tensor input's ``input_type``; sorted by thread then start."""
    ev = trace.events
    ops = ev[kind_mask(ev, ("cpu_op",))]
    names = ops["name"]
    counted_names = [c for c in names.cat.categories if is_counted(str(c))] if hasattr(names, "cat") else []
    ops = ops[names.isin(counted_names).to_numpy()]
    if ops.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in OP_COLUMNS})
    rows = np.flatnonzero(kind_mask(ev, ("cpu_op",)))[names.isin(counted_names).to_numpy()]
    frame = pd.DataFrame({"row": rows.astype(np.int64), "name": ops["name"].astype(str).to_numpy(object),
                          "tid": ops["tid"].astype(str).to_numpy(object), "ts_ns": ops["ts_ns"].to_numpy(np.int64),
                          "end_ns": ops["end_ns"].to_numpy(np.int64)})
    frame = frame.sort_values(["tid", "ts_ns", "end_ns"], ascending=[True, True, False], kind="stable")
    frame = frame[_outermost(frame["tid"].to_numpy(object), frame["ts_ns"].to_numpy(np.int64),
                             frame["end_ns"].to_numpy(np.int64))].reset_index(drop=True)
    shapes = trace.shapes.set_index("row")
    joined = shapes.reindex(frame["row"].to_numpy())
    keys = list(zip(frame["name"], joined["input_dims"].astype(object), joined["input_types"].astype(object),
                    joined["concrete_inputs"].astype(object), strict=True))
    memo: dict[tuple[object, ...], tuple[object, ...]] = {}
    out = []
    for key in keys:
        got = memo.get(key)
        if got is None:
            name, dims, types, concrete = key
            if not isinstance(dims, str):
                got = ("matrix" if name in MATRIX_OPS else "memory", np.nan, np.nan, None,
                       "shapes not recorded (record_shapes=False)")
            else:
                w = op_work(name, dims, types if isinstance(types, str) else None,
                            concrete if isinstance(concrete, str) else None)
                assert w is not None
                got = (w.kind, np.nan if w.flops is None else float(w.flops),
                       np.nan if w.bytes is None else float(w.bytes), w.input_type, w.why)
            memo[key] = got
        out.append(got)
    frame["kind"] = [o[0] for o in out]
    frame["flops"] = np.array([o[1] for o in out], dtype=np.float64)
    frame["bytes"] = np.array([o[2] for o in out], dtype=np.float64)
    frame["input_type"] = [o[3] for o in out]
    frame["why"] = [o[4] for o in out]
    return frame[list(OP_COLUMNS)]


@trace_view
def op_kernels(trace: RankTrace) -> pd.DataFrame:
    """The kernels each counted op launched: ``op`` (its position in ``counted_ops``), the kernel's name, device,
    start and duration; kernels no counted op launched are not listed."""
    ops = counted_ops(trace)
    cols = ["op", "name", "device", "ts_ns", "dur_ns"]
    k = kernels(trace)
    if ops.empty or k.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    calls = launches(trace)
    calls = calls[calls["correlation"].notna().to_numpy()]
    c_tid = calls["tid"].astype(str).to_numpy(object)
    c_ts = calls["ts_ns"].to_numpy(np.int64)
    c_corr = calls["correlation"].to_numpy(np.int64)
    op_tid = ops["tid"].to_numpy(object)
    op_ts, op_end = ops["ts_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    corr_to_op: dict[int, int] = {}
    for t in np.unique(op_tid):
        mine = np.flatnonzero(op_tid == t)  # sorted by start, none holding another
        sel = np.flatnonzero(c_tid == t)
        if not len(sel):
            continue
        at = np.searchsorted(op_ts[mine], c_ts[sel], side="right") - 1
        ok = at >= 0
        ok[ok] = c_ts[sel][ok] < op_end[mine[at[ok]]]
        for corr, op in zip(c_corr[sel][ok].tolist(), mine[at[ok]].tolist(), strict=True):
            corr_to_op[corr] = op
    kc = k[k["correlation"].notna().to_numpy()]
    corr = kc["correlation"].to_numpy(np.int64)
    op = np.array([corr_to_op.get(c, -1) for c in corr.tolist()], dtype=np.int64)
    hit = op >= 0
    kc = kc[hit]
    return pd.DataFrame({"op": op[hit], "name": kc["name"].astype(str).to_numpy(object),
                         "device": kc["device"].to_numpy(np.int64), "ts_ns": kc["ts_ns"].to_numpy(np.int64),
                         "dur_ns": kc["dur_ns"].to_numpy(np.int64)})
