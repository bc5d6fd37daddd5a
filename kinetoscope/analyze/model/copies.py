"""Memory copies as a rank's trace records them (direction, pageable or pinned host memory, blocking or not):
the view shared by the copies, loader and straggler analyzers and the what-if."""

from __future__ import annotations

import re
from typing import cast

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.timeline import gpu_work, runtime_calls
from kinetoscope.analyze.model.trace import RankTrace, trace_view

# "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memcpy DtoD (Device -> Device)"
_DIRECTION_RE = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP|HtoH)\b")


_HOST_MEMORY_RE = re.compile(r"\b(Pageable|Pinned)\b")


#: shortest copy whose launching call's duration can show it blocked the host
BLOCKING_MIN_COPY_NS = 20_000


_SYNC_COPY_RE = re.compile(r"^(cuda|hip)Memcpy(WithStream)?$|^cuMemcpy(HtoD|DtoH)(_v2)?$")


@trace_view
def copies(trace: RankTrace) -> pd.DataFrame:
    """Every memcpy on the device: direction, host memory (``pageable``/``pinned``/``unknown`` from its
    name), the call that launched it, whether that call is a blocking copy API (``synchronous``) and
    whether it held the host for the copy's whole duration (``blocking``)."""
    work = gpu_work(trace)
    mem = work[(work["kind"] == "memcpy").to_numpy()]
    names = mem["name"].astype(str)
    direction = names.str.extract(_DIRECTION_RE, expand=False).fillna("other")
    host_kind = names.str.extract(_HOST_MEMORY_RE, expand=False).str.lower().fillna("unknown")
    runtime = runtime_calls(trace)
    runtime = runtime[runtime["correlation"].notna().to_numpy()].drop_duplicates("correlation")
    keys = runtime["correlation"].to_numpy(np.int64)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    call_name = runtime["name"].astype(str).to_numpy(object)[order]
    call_ts, call_end = runtime["ts_ns"].to_numpy()[order], runtime["end_ns"].to_numpy()[order]
    has = mem["correlation"].notna().to_numpy()
    corr = mem["correlation"].fillna(0).to_numpy(np.int64)
    pos = np.minimum(np.searchsorted(keys, corr), max(len(keys) - 1, 0))
    found = has & (keys[pos] == corr) if len(keys) else np.zeros(len(mem), dtype=bool)
    # numpy's stubs take the second and third arguments None for the one-argument form
    launched_by = cast(np.ndarray, np.where(found, call_name[pos] if len(keys) else None, None))
    synchronous = np.array([bool(n) and bool(_SYNC_COPY_RE.match(n)) for n in launched_by], dtype=bool)
    ts, end = mem["ts_ns"].to_numpy(), mem["end_ns"].to_numpy()
    # a call that holds the host for the whole copy blocks on it - shown only when the copy is long enough
    # to be more than the call's own overhead (a 4 us copy inside a 12 us async call proves nothing)
    dur = end - ts
    covered = found & (call_ts[pos] <= ts if len(keys) else False) & (call_end[pos] >= end if len(keys) else False)
    call_dur = (call_end[pos] - call_ts[pos]) if len(keys) else np.zeros(len(mem), dtype=np.int64)
    blocking = covered & (dur >= BLOCKING_MIN_COPY_NS) & (2 * dur >= call_dur)
    return mem.assign(
        direction=direction.to_numpy(object),
        host_memory=host_kind.to_numpy(object),
        pageable=(host_kind == "pageable").to_numpy(bool),
        pinned=(host_kind == "pinned").to_numpy(bool),
        launched_by=pd.array(launched_by, dtype="string"),
        synchronous=synchronous,
        blocking=np.asarray(blocking, dtype=bool),
    )


def h2d_copies(trace: RankTrace) -> pd.DataFrame:
    c = copies(trace)
    return c[(c["direction"] == "HtoD").to_numpy()]


