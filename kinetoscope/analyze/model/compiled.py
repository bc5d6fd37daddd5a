"""torch.compile's code as the trace records it: the compiled regions the host entered (``Torch-Compiled Region:
F/C``, frame F's compilation C; the backward of a compiled region runs as ``CompiledFunctionBackward``), the GPU work
launched inside each, and Inductor's Triton kernels (``triton_<kind>_fused_<ops>_<n>``: the kind of kernel and the
aten ops it fused, as Inductor names them)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.timeline import gpu_work, kind_mask, name_mask, runtime_calls
from kinetoscope.analyze.model.trace import RankTrace, trace_view

REGION_RE = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
BACKWARD_REGION_RE = re.compile(r"^CompiledFunctionBackward$")
#: Inductor's Triton kernels: pointwise, reduction, persistent reduction, template (matmul/conv), foreach
TRITON_RE = re.compile(r"^triton_(poi|red|per|tem|for|mm|bmm|conv)_(?:fused_)?(.*?)(?:_\d+)?$")
TRITON_KINDS = {"poi": "pointwise", "red": "reduction", "per": "persistent reduction", "tem": "template",
                "for": "foreach", "mm": "template", "bmm": "template", "conv": "template"}
#: the label of the backward of compiled regions (its compile id is not recorded)
BACKWARD = "backward"


@trace_view
def compiled_regions(trace: RankTrace) -> pd.DataFrame:
    """Each compiled region entered, outermost only: ``region`` ("0/1", or ``BACKWARD``), ``frame`` and
    ``compile_id`` (-1 for the backward), ts_ns, end_ns, tid."""
    ev = trace.events
    sel = ev[kind_mask(ev, ("cpu_op", "annotation")) & (name_mask(ev, REGION_RE) | name_mask(ev, BACKWARD_REGION_RE))]
    if sel.empty:
        return pd.DataFrame({"region": pd.Series(dtype=object), "frame": pd.Series(dtype=np.int64),
                             "compile_id": pd.Series(dtype=np.int64), "ts_ns": pd.Series(dtype=np.int64),
                             "end_ns": pd.Series(dtype=np.int64), "tid": pd.Series(dtype=object)})
    names = sel["name"].astype(str).to_numpy(object)
    ids = [REGION_RE.match(n) for n in names]
    frame = np.array([int(m.group(1)) if m else -1 for m in ids], dtype=np.int64)
    comp = np.array([int(m.group(2)) if m else -1 for m in ids], dtype=np.int64)
    out = pd.DataFrame({"region": [f"{f}/{c}" if f >= 0 else BACKWARD for f, c in zip(frame, comp, strict=False)],
                        "frame": frame, "compile_id": comp, "ts_ns": sel["ts_ns"].to_numpy(np.int64),
                        "end_ns": sel["end_ns"].to_numpy(np.int64), "tid": sel["tid"].astype(str).to_numpy(object)})
    out = out.sort_values(["tid", "ts_ns", "end_ns"], ascending=[True, True, False], kind="stable")
    keep = np.ones(len(out), dtype=bool)
    for _, idx in out.groupby("tid", sort=False).indices.items():  # drop regions inside another on their thread
        ends = out["end_ns"].to_numpy()[idx]
        outer_end = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, ends[:-1]])
        keep[idx] = out["ts_ns"].to_numpy()[idx] >= outer_end
    return out[keep].sort_values("ts_ns", kind="stable").reset_index(drop=True)


@trace_view
def gpu_region_of(trace: RankTrace) -> pd.Series:
    """For each GPU op (index of ``gpu_work``), the compiled region whose span held its launch call on the launching
    thread, else None (eager, or launched before the trace began)."""
    work = gpu_work(trace)
    regions = compiled_regions(trace)
    out = pd.Series([None] * len(work), index=work.index, dtype=object)
    if regions.empty or work.empty:
        return out
    rt = runtime_calls(trace)
    rt = rt[rt["correlation"].notna().to_numpy()].drop_duplicates("correlation")
    by_corr = rt.set_index(rt["correlation"].to_numpy(np.int64))
    corr = work["correlation"].fillna(-1).to_numpy(np.int64)
    found = np.isin(corr, by_corr.index.to_numpy())
    launch_ts = np.full(len(work), -1, dtype=np.int64)
    launch_tid = np.full(len(work), "", dtype=object)
    if found.any():
        calls = by_corr.loc[corr[found]]
        launch_ts[found] = calls["ts_ns"].to_numpy(np.int64)
        launch_tid[found] = calls["tid"].astype(str).to_numpy(object)
    labels = np.full(len(work), None, dtype=object)
    for tid, g in regions.groupby("tid", sort=False):
        mine = np.flatnonzero(found & (launch_tid == tid))
        if not len(mine):
            continue
        starts, ends = g["ts_ns"].to_numpy(), g["end_ns"].to_numpy()
        k = np.searchsorted(starts, launch_ts[mine], side="right") - 1
        inside = (k >= 0) & (launch_ts[mine] < ends[np.maximum(k, 0)])
        labels[mine[inside]] = g["region"].to_numpy(object)[k[inside]]
    return pd.Series(labels, index=work.index, dtype=object)


def triton_kind(name: str) -> tuple[str, str] | None:
    """(kind, fused ops as Inductor wrote them) of a Triton kernel's name; None for any other kernel."""
    m = TRITON_RE.match(name)
    if m is None:
        return None
    return TRITON_KINDS[m.group(1)], m.group(2)
