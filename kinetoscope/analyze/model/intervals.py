"""Interval arithmetic on int64 nanosecond intervals.

Busy time is always the measure of a union, never a sum of durations:
overlapping kernels on two streams must not count twice.
An interval set is a pair of sorted int64 arrays ``(starts, ends)`` with
``starts[i] < ends[i] <= starts[i+1]`` (disjoint, half-open).
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]

EMPTY: Intervals = (np.empty(0, np.int64), np.empty(0, np.int64))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge possibly overlapping intervals into a disjoint sorted set."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    if not (starts[1:] >= starts[:-1]).all():  # event tables are time-ordered already: no sort then
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    # a new run begins where the start lies beyond every earlier end
    new_run = np.empty(starts.size, dtype=bool)
    new_run[0] = True
    new_run[1:] = starts[1:] > running_end[:-1]
    # a run ends at its last interval, where the running end is the run's furthest end
    last = np.empty(starts.size, dtype=bool)
    last[:-1] = new_run[1:]
    last[-1] = True
    return starts[new_run], running_end[last]


def merge(*sets: Intervals) -> Intervals:
    """The union of several interval sets."""
    if not sets:
        return EMPTY
    return union(np.concatenate([x[0] for x in sets]), np.concatenate([x[1] for x in sets]))


def measure(s: Intervals) -> int:
    return int((s[1] - s[0]).sum())


def clip(s: Intervals, lo: int, hi: int) -> Intervals:
    starts = np.clip(s[0], lo, hi)
    ends = np.clip(s[1], lo, hi)
    keep = ends > starts
    return starts[keep], ends[keep]


def complement(s: Intervals, lo: int, hi: int) -> Intervals:
    """The gaps of ``s`` inside [lo, hi)."""
    s = clip(s, lo, hi)
    starts = np.concatenate(([lo], s[1]))
    ends = np.concatenate((s[0], [hi]))
    keep = ends > starts
    return starts[keep].astype(np.int64), ends[keep].astype(np.int64)


def covered_before(s: Intervals, t: np.ndarray) -> np.ndarray:
    """For each time t, the measure of ``s`` in (-inf, t)."""
    t = np.asarray(t, dtype=np.int64)
    if s[0].size == 0:
        return np.zeros(t.shape, dtype=np.int64)
    lengths = s[1] - s[0]
    prefix = np.concatenate(([0], np.cumsum(lengths)))
    idx = np.searchsorted(s[0], t, side="right")  # intervals starting at or before t
    full = prefix[np.maximum(idx - 1, 0)]
    last = np.maximum(idx - 1, 0)
    partial = np.clip(t - s[0][last], 0, lengths[last])
    return np.where(idx > 0, full + partial, 0)


def overlap_each(starts: np.ndarray, ends: np.ndarray, s: Intervals) -> np.ndarray:
    """For each query interval, the measure of its intersection with set ``s``."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.maximum(np.asarray(ends, dtype=np.int64), starts)
    return covered_before(s, ends) - covered_before(s, starts)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two disjoint sorted sets."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    # each interval of a against the run of b's intervals it overlaps (both sets are sorted and
    # disjoint, so the pairs number at most len(a) + len(b) and come out in order)
    first = np.searchsorted(b[1], a[0], side="right")  # b's first interval ending after a starts
    stop = np.searchsorted(b[0], a[1], side="left")  # b's intervals starting before a ends
    counts = np.maximum(stop - first, 0)
    total = int(counts.sum())
    if total == 0:
        return EMPTY
    ai = np.repeat(np.arange(a[0].size), counts)
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
    bj = first[ai] + (np.arange(total) - offsets[ai])
    lo = np.maximum(a[0][ai], b[0][bj])
    hi = np.minimum(a[1][ai], b[1][bj])
    keep = hi > lo
    return union(lo[keep], hi[keep])  # merges pieces that touch, as a set's representation requires


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` minus ``b``."""
    if a[0].size == 0:
        return EMPTY
    if b[0].size == 0:
        return a
    lo = int(a[0].min())
    hi = int(a[1].max())
    return intersect(a, complement(b, lo, hi))
