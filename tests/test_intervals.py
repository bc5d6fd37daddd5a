"""Interval arithmetic against a brute-force reference (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kinetoscope.analyze import intervals as iv

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
    for s, e in zip(*ivs):
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
    want = [ma[s:e].sum() for s, e in zip(qs, qe)]
    assert got.tolist() == want


def test_sum_of_durations_would_overstate():
    # two kernels on two streams overlapping for 5 of their 10 units each: busy is 15, not 20
    u = iv.union(np.array([0, 5]), np.array([10, 15]))
    assert iv.measure(u) == 15


def test_intersect_and_subtract_match_a_bitmap_on_random_sets():
    import numpy as np

    from kinetoscope.analyze import intervals as iv

    rng = np.random.default_rng(3)

    def random_set():
        n = int(rng.integers(0, 10))
        starts = rng.integers(0, 80, n)
        return iv.union(starts, starts + rng.integers(0, 20, n))

    def bitmap(s):
        m = np.zeros(100, dtype=bool)
        for lo, hi in zip(*s):
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
