"""The GPU idle that synchronising calls cause: shared by the GPU idle and the training-loop hygiene analyzers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.timeline import (
    pending_work,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace


def sync_cost(trace: RankTrace, calls: pd.DataFrame, idle: iv.Intervals, refill_max_ns: int) -> iv.Intervals:
    """The GPU idle a set of synchronising calls causes. A sync drains the queue: the GPU runs out of
    work while the host waits, and stays idle until the host, released, launches again. So a sync - an
    episode of nested calls (``.item()`` holding its copy and ``cudaStreamSynchronize``) - costs the idle
    gap that begins while it waits, up to ``refill_max_ns`` after it returns, provided the GPU had work
    when it began (running, or launched and not yet started) - and at most as long as the host spent in the
    sync: without it the host would have done what it does next that much earlier, so the gap shrinks by at
    most the sync's own time (the rest of the gap is the host's own work, which idles the GPU with or without
    the sync). A sync on an already idle GPU drained nothing; one that drains only a few microseconds of work
    (its own small copy) costs at most those microseconds; one that returns with the GPU still busy costs
    nothing."""
    if calls.empty or idle[0].size == 0:
        return iv.EMPTY
    episodes = iv.union(calls["ts_ns"].to_numpy(), calls["end_ns"].to_numpy())
    s, e = episodes
    w = window(trace)
    busy = iv.complement(idle, w.start_ns, w.end_ns)
    pending = pending_work(trace)
    work_or_queue = iv.union(np.concatenate((busy[0], pending[0])), np.concatenate((busy[1], pending[1])))
    had_work = iv.overlap_each(s, s + 1, work_or_queue) > 0
    # the idle interval each episode's end falls in, if any
    k = np.searchsorted(idle[0], e, side="right") - 1
    kk = np.maximum(k, 0)
    inside = (k >= 0) & (e <= idle[1][kk])
    began_during = inside & (idle[0][kk] >= s) & had_work
    starts = idle[0][kk][began_during]
    held = (e - s)[began_during]  # the host's time in the sync
    ends = np.minimum(np.minimum(idle[1][kk], e + refill_max_ns)[began_during], starts + held)
    return iv.union(starts, ends)


