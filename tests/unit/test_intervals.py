"""Interval arithmetic against a brute-force reference (hypothesis)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from kinetoscope.analyze.model import intervals as iv

spans = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 60)), max_size=25)


def _arrays(pairs):
    s = np.array([p[0] for p in pairs], dtype=np.int64)
    return s, s + np.array([p[1] for p in pairs], dtype=np.int64)


def _cover(pairs, size=300):
    m = np.zeros(size, dtype=bool)
    for s, d in pairs:
        m[s : s + d] = True
    return m


def _mask(ivs, size=300):
    m = np.zeros(size, dtype=bool)
    for s, e in zip(*ivs, strict=True):
        m[s:e] = True
    return m


@settings(max_examples=200, deadline=None)
@given(spans)
def test_union_is_disjoint_and_covers_the_same_points(pairs):
    u = iv.union(*_arrays(pairs))
    assert (u[1] > u[0]).all() and (u[0][1:] > u[1][:-1]).all()
    assert (_mask(u) == _cover(pairs)).all()
    assert iv.measure(u) == _cover(pairs).sum()


@settings(max_examples=200, deadline=None)
@given(spans, spans)
def test_intersect_subtract_complement(a_pairs, b_pairs):
    a, b = iv.union(*_arrays(a_pairs)), iv.union(*_arrays(b_pairs))
    ma, mb = _cover(a_pairs), _cover(b_pairs)
    assert (_mask(iv.intersect(a, b)) == (ma & mb)).all()
    assert (_mask(iv.subtract(a, b)) == (ma & ~mb)).all()
    gaps = iv.complement(a, 10, 250)
    expect = ~ma
    expect[:10] = False
    expect[250:] = False
    assert (_mask(gaps) == expect).all()
    # busy + idle = window
    assert iv.measure(iv.clip(a, 10, 250)) + iv.measure(gaps) == 240


@settings(max_examples=200, deadline=None)
@given(spans, spans)
def test_overlap_each_matches_brute_force(a_pairs, q_pairs):
    a = iv.union(*_arrays(a_pairs))
    ma = _cover(a_pairs)
    qs, qe = _arrays(q_pairs)
    got = iv.overlap_each(qs, qe, a)
    want = [ma[s:e].sum() for s, e in zip(qs, qe, strict=True)]
    assert got.tolist() == want


def test_sum_of_durations_would_overstate():
    # two kernels on two streams overlapping for 5 of their 10 units each: busy is 15, not 20
    u = iv.union(np.array([0, 5]), np.array([10, 15]))
    assert iv.measure(u) == 15


def test_intersect_and_subtract_match_a_bitmap_on_random_sets():
    import numpy as np

    from kinetoscope.analyze.model import intervals as iv

    rng = np.random.default_rng(3)

    def random_set():
        n = int(rng.integers(0, 10))
        starts = rng.integers(0, 80, n)
        return iv.union(starts, starts + rng.integers(0, 20, n))

    def bitmap(s):
        m = np.zeros(100, dtype=bool)
        for lo, hi in zip(*s, strict=True):
            m[lo:hi] = True
        return m

    def from_bitmap(m):
        edges = np.flatnonzero(np.diff(np.concatenate(([0], m.astype(np.int8), [0]))))
        return edges[0::2], edges[1::2]

    for _ in range(3000):
        a, b = random_set(), random_set()
        for got, want in ((iv.intersect(a, b), bitmap(a) & bitmap(b)), (iv.subtract(a, b), bitmap(a) & ~bitmap(b))):
            exp = from_bitmap(want)
            assert np.array_equal(got[0], exp[0]) and np.array_equal(got[1], exp[1])


def test_codes_in_matches_membership_for_few_and_many_wanted():
    from kinetoscope.analyze.model.timeline import codes_in

    codes = np.array([-1, 0, 1, 2, 3, 4, 5, 6, 7, 2, -1], dtype=np.int8)
    # up to four wanted: equality tests; -1 (missing) is never wanted
    assert codes_in(codes, [2, 5]).tolist() == [False, False, False, True, False, False, True, False, False, True,
                                                False]
    assert not codes_in(codes, []).any()
    # more: a lookup table; codes past the largest wanted and -1 fall in its last slot
    assert codes_in(codes, [0, 1, 3, 4, 6]).tolist() == [False, True, True, False, True, True, False, True, False,
                                                        False, False]


def _frame(rows):
    ts = np.array([r[1] for r in rows], dtype=np.int64)
    dur = np.array([r[2] for r in rows], dtype=np.int64)
    return pd.DataFrame({"ts_ns": ts, "dur_ns": dur, "end_ns": ts + dur}, index=[r[0] for r in rows])


TOP_LEVEL_ROWS = [  # (label, start, duration): the top-level ones are A, D, I and F
    ("A", 0, 10), ("B", 0, 5),  # B starts with A, shorter: inside it
    ("C", 2, 3),  # inside A
    ("D", 10, 4),  # starts as A ends: top level
    ("E", 12, 1),  # inside D
    ("H", 15, 1), ("I", 15, 6),  # starting together, the longer (listed second) is the top-level one
    ("F", 30, 2), ("G", 30, 2),  # equal: the first listed is top level, the second inside it
]


def test_top_level_of_time_ordered_events():
    from kinetoscope.analyze.model.timeline import top_level

    assert top_level(_frame(TOP_LEVEL_ROWS)).index.tolist() == ["A", "D", "I", "F"]


def test_top_level_of_events_out_of_time_order():
    from kinetoscope.analyze.model.timeline import top_level

    rows = [TOP_LEVEL_ROWS[i] for i in (3, 0, 7, 2, 6, 1, 4, 8, 5)]  # shuffled; F still before G, H before I
    assert top_level(_frame(rows)).index.tolist() == ["A", "D", "I", "F"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12)), min_size=1, max_size=30), st.booleans())
def test_top_level_against_brute_force(pairs, time_ordered):
    """An event is top level when no event before it (by start, longest first, then as listed) ends at or after
    its end."""
    from kinetoscope.analyze.model.timeline import top_level

    if time_ordered:
        pairs = sorted(pairs, key=lambda p: p[0])
    rows = [(i, s, d) for i, (s, d) in enumerate(pairs)]
    order = sorted(rows, key=lambda r: (r[1], -r[2], r[0]))
    expected = [e[0] for k, e in enumerate(order) if not any(f[1] + f[2] >= e[1] + e[2] for f in order[:k])]
    assert top_level(_frame(rows)).index.tolist() == expected
