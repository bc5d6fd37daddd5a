"""Collectives across ranks: which call on one rank is which on another, clock skew, who waited for whom,
and the straggler. Pure functions over small per-rank summaries (``RankSummary``), so the job-level
analysis is a reduce: ``kinetoscope analyze`` builds the summaries from loaded ranks, ``batch`` from
its workers' rows, and no process ever needs more than one rank's trace.

Matching, per process group (``Process Group Name``/``Ranks`` where the trace records them, else one
default group):
1. by sequence number (``Seq``) when every collective of the group carries one;
2. otherwise by aligning each rank's sequence of collectives against a reference rank's: every offset
   is scored by how many paired calls agree on what they are (operation, and message size where the
   trace records it and it is the same on every rank), and among the best-agreeing offsets the one
   whose implied clock skew is smallest wins. A skew larger than a step is a mismatch, not a skew:
   that rank's calls stay unmatched.
Collectives complete together on every rank, so the median difference of end times of matched calls
is the clock skew between two ranks; skews from several groups are combined by least squares.
Point-to-point calls (send, recv) complete on two peers at different times: they are never matched.
A call missing from one rank's capture, anywhere in the sequence, is skipped: pairs are made in order
on the aligned clock, the most calls whose completions agree within half a step, the closest among those.
Arrival = the collective's start on the rank's aligned clock; the last to arrive is the rank the others
waited for, and each rank's wait is the last arrival minus its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from msgspec import structs

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.results import CollectiveGroup, CollectiveRank, Collectives

#: ops whose message sizes are the same on every rank (alltoall and send/recv sizes are per rank)
_SIZE_INVARIANT = frozenset({"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "barrier"})
#: point-to-point operations complete on their two peers only, at different times: never matched
POINT_TO_POINT = frozenset({"send", "recv", "sendrecv"})
#: offsets tried when aligning two ranks' sequences without sequence numbers
MAX_OFFSET = 64
#: a matched collective's implied skew must be this consistent (median absolute deviation, as a share
#: of the mean step) for an alignment to count
#: (validation and checkpoint: the time inside the capture's marks of them, which compute and untraced leave out;
#: None in traces without the capture's marks)
COMPONENTS = ("input", "copy", "compute", "host", "untraced", "validation", "checkpoint")
#: arrivals closer than this are simultaneous: nobody waited
NO_WAIT_NS = 1000


#: the most step walls a rank's summary keeps from the end of its run (``RankSummary.run_tail_us``)
RUN_TAIL_MAX = 4096


@dataclass
class RankSummary:
    """What the job-level analysis needs from one rank: small, JSON-serialisable."""

    rank: int
    steps: int
    mean_step_us: float | None
    window_us: float
    #: per-step means of what the rank spends its time on (see ``COMPONENTS``)
    components_us: dict[str, float | None]
    #: collectives in the window, in start order: parallel lists
    group: list[str] = field(default_factory=list)
    seq: list[int | None] = field(default_factory=list)
    op: list[str] = field(default_factory=list)
    in_nelems: list[int | None] = field(default_factory=list)
    out_nelems: list[int | None] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    #: union of collective time in the window
    collective_us: float = 0.0
    #: share of the window whose GPU activity the trace misses (arrivals there are not evidence)
    unknown_fraction: float = 0.0
    #: per collective: whether the rank ran validation or saved a checkpoint (its capture's marks) since its previous
    #: collective ended, or during this one - the arrival follows that work, not a training step's
    after_marked: list[bool] = field(default_factory=list)
    #: per collective: the ProfilerStep number its start falls in (-1 outside every step); empty where a summary
    #: predates it (then no wait is known to move between the ranks inside a step)
    step: list[int] = field(default_factory=list)
    #: the rank's exposed collective time in the window (``collectives.exposure``: no compute beside it), as parallel
    #: lists of interval starts and ends; None where the trace cannot tell it
    exposed_start_ns: list[int] | None = None
    exposed_end_ns: list[int] | None = None
    #: CPU time per step from the capture's step timings, by measure ("thread": the training thread's, "process": the
    #: process's): its median over the run's profiled steps ("profiled_us") and over its other ordinary steps
    #: ("unprofiled_us": no trace writing, validation, compile or checkpoint; not the first), and how many of those
    #: ("unprofiled_steps"); a measure is absent where fewer than 3 steps of either kind timed it
    step_cpu_us: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the run the capture timed (``steps.json``), where it ended as it was written (no crash or signal; a manifest
    #: that counts the steps timed), else None: its steps (``run_steps``), those kept in the run's measures and their
    #: wall time (us; the capture's own trace writing left out), the median wall of its ordinary steps (not the
    #: first; no trace writing, validation, compile or checkpoint), and the walls of its last ``RUN_TAIL_MAX`` steps
    #: at most, in order (us; None for a step left out): bounded, whatever the run's length
    run_steps: int | None = None
    run_timed_steps: int | None = None
    run_wall_us: float | None = None
    run_usual_step_us: float | None = None
    run_tail_us: list[float | None] | None = None
    #: what ends a step on this rank, and how many optimizers stepped (the manifest's loop facts): ranks whose steps
    #: are not alike (a probe's optimizer stepping on one rank only) are not compared by their counts
    run_step_source: str | None = None
    #: per collective (the lists' order): the rank's compute (the ``compute`` component's time, us) and its compute
    #: operators or kernels started (a count) since its previous collective ended (or the window began) up to this
    #: one's start - the work it did before it arrived
    compute_before_us: list[float] = field(default_factory=list)
    ops_before: list[int] = field(default_factory=list)
    #: the window's ProfilerSteps (their numbers), and per step its training thread's run-queue wait (us, from the
    #: capture's step timings; None: not recorded)
    step_numbers: list[int] = field(default_factory=list)
    runqueue_us_by_step: list[float | None] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RankSummary:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


@dataclass
class GroupMatch:
    group: str
    ranks: list[int]
    method: str  # "sequence_numbers" | "alignment" | "single_rank"
    #: matched collectives: index into each rank's own list, one row per collective (ranks in ``ranks`` order)
    index: np.ndarray
    unmatched: dict[int, int]
    #: ranks whose sequence could not be aligned within a step of the reference
    misaligned: list[int]


@dataclass
class Matching:
    groups: list[GroupMatch]
    skew_ns: dict[int, int | None]
    #: per rank: collectives matched, unmatched; point-to-point calls (never matched)
    matched: dict[int, int]
    unmatched: dict[int, int]
    point_to_point: dict[int, int] = field(default_factory=dict)


def normalise_op(name: str) -> str:
    """'_allgather_base', 'all_gather_into_tensor', 'AllGather' -> 'allgather'."""
    n = name.lower().replace("_", "").replace("intotensor", "").replace("coalesced", "").replace("base", "")
    for op in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv", "send", "recv",
               "reduce", "barrier", "gather", "scatter"):
        if op in n:
            return op
    return n or "other"


def _signature(s: RankSummary, i: int) -> tuple[Any, ...]:
    op = s.op[i]
    if op in _SIZE_INVARIANT:
        return (op, s.in_nelems[i], s.out_nelems[i])
    return (op,)


def _align(ref: RankSummary, ref_idx: np.ndarray, other: RankSummary, other_idx: np.ndarray,
           step_ns: float) -> float | None:
    """The clock skew of ``other`` against ``ref`` from their sequences of collectives (see the module doc):
    the skew implied by the best-agreeing offset, the smallest among ties; None beyond a step."""
    ref_sig = [_signature(ref, int(i)) for i in ref_idx]
    oth_sig = [_signature(other, int(i)) for i in other_idx]
    ref_end = np.asarray(ref.end_ns, dtype=np.int64)[ref_idx]
    oth_end = np.asarray(other.end_ns, dtype=np.int64)[other_idx]
    n_ref, n_oth = len(ref_idx), len(other_idx)
    best: list[tuple[float, float, int, float]] = []  # (-agreement, |skew|, -pairs, skew)
    for d in range(-min(n_oth - 1, MAX_OFFSET), min(n_ref - 1, MAX_OFFSET) + 1):
        lo, hi = max(0, d), min(n_ref, n_oth + d)
        if hi <= lo:
            continue
        same = [i for i in range(lo, hi) if ref_sig[i] == oth_sig[i - d]]
        if not same:
            continue
        # the median holds when a call missing mid-sequence puts a minority of the pairs a step off
        skew = float(np.median(oth_end[[i - d for i in same]] - ref_end[same]))
        best.append((-len(same) / (hi - lo), abs(skew), -(hi - lo), skew))
    if not best:
        return None
    top = min(b[0] for b in best)
    _, skew_abs, _, skew = min((b for b in best if b[0] <= top + 1e-9), key=lambda b: (b[1], b[2]))
    if step_ns and skew_abs > step_ns:
        return None  # a "skew" beyond a step is a mismatch
    return skew


def _pair(ref: RankSummary, ref_idx: np.ndarray, other: RankSummary, other_idx: np.ndarray, skew: float,
          tolerance: float, tight: float) -> dict[int, int]:
    """Pair the two sequences in order on the aligned clock: the order-keeping pairing of calls that agree on
    what they are and complete within ``tolerance`` of each other that pairs the most calls, and among those the
    one whose completions agree best (a weighted longest common subsequence). A call of one with no counterpart
    (missing from its capture) is skipped, not shifted onto the next one; a completion that one rank records
    milliseconds after the other (CPU collectives on busy cores) is still its pair."""
    n, m = len(ref_idx), len(other_idx)
    if n * m > _DP_CELLS or n > _DP_ROWS:  # the table's rows are a Python loop: long references walk greedily
        return _pair_greedy(ref, ref_idx, other, other_idx, skew, tight)
    ref_end = np.asarray(ref.end_ns, dtype=np.float64)[ref_idx]
    oth_end = np.asarray(other.end_ns, dtype=np.float64)[other_idx] - skew
    gap = np.abs(oth_end[None, :] - ref_end[:, None])
    ref_sig = [_signature(ref, int(i)) for i in ref_idx]
    oth_sig = [_signature(other, int(i)) for i in other_idx]
    codes = {sig: k for k, sig in enumerate(dict.fromkeys(ref_sig + oth_sig))}
    same = np.asarray([codes[x] for x in ref_sig])[:, None] == np.asarray([codes[x] for x in oth_sig])[None, :]
    # a pair counts 1, plus under 1/(n+1) for how close its completions are: the count decides, closeness ties
    score = np.where(same & (gap <= tolerance), 1.0 + (1.0 - gap / tolerance) / (n + 1), -np.inf)
    best = np.zeros((n + 1, m + 1))
    for i in range(1, n + 1):
        row = np.maximum(best[i - 1, 1:], best[i - 1, :-1] + score[i - 1])
        best[i, 1:] = np.maximum.accumulate(np.maximum(row, 0.0))
    pairs: dict[int, int] = {}
    i, j = n, m
    while i > 0 and j > 0:
        if best[i, j] == best[i - 1, j]:
            i -= 1
        elif best[i, j] == best[i, j - 1]:
            j -= 1
        else:
            pairs[i - 1] = int(other_idx[j - 1])
            i -= 1
            j -= 1
    return pairs


#: above this many (calls x calls) the pairing walks the sequences greedily instead (same rule, in one pass)
_DP_CELLS = 4_000_000
_DP_ROWS = 20_000


def _pair_greedy(ref: RankSummary, ref_idx: np.ndarray, other: RankSummary, other_idx: np.ndarray, skew: float,
                 tolerance: float) -> dict[int, int]:
    """``_pair`` for very long sequences: one walk in order, pairing the first call that agrees within
    ``tolerance``."""
    ref_end = np.asarray(ref.end_ns, dtype=np.float64)[ref_idx]
    oth_end = np.asarray(other.end_ns, dtype=np.float64)[other_idx] - skew
    pairs: dict[int, int] = {}
    i = j = 0
    while i < len(ref_idx) and j < len(other_idx):
        gap = oth_end[j] - ref_end[i]
        if abs(gap) <= tolerance and _signature(ref, int(ref_idx[i])) == _signature(other, int(other_idx[j])):
            pairs[i] = int(other_idx[j])
            i += 1
            j += 1
        elif gap < 0:
            j += 1
        else:
            i += 1
    return pairs


def match(summaries: list[RankSummary]) -> Matching:
    """Match every rank's collectives, group by group, and solve the clock skews."""
    by_rank = {s.rank: s for s in summaries}
    steps = [s.mean_step_us for s in summaries if s.mean_step_us]
    step_ns = float(np.median(steps)) * 1000.0 if steps else 0.0
    groups: dict[str, dict[int, np.ndarray]] = {}
    point_to_point = {}
    for s in summaries:
        g = np.asarray(s.group, dtype=object)
        p2p = np.isin(np.asarray(s.op, dtype=object), list(POINT_TO_POINT))
        point_to_point[s.rank] = int(p2p.sum())
        for name in dict.fromkeys(s.group):
            idx = np.flatnonzero((g == name) & ~p2p)
            if len(idx):
                groups.setdefault(str(name), {})[s.rank] = idx
    results: list[GroupMatch] = []
    constraints: list[tuple[int, int, float, int]] = []  # (a, b, skew_b - skew_a, weight)
    matched = {s.rank: 0 for s in summaries}
    for name, members in sorted(groups.items()):
        ranks = sorted(members)
        if len(ranks) < 2:
            results.append(GroupMatch(name, ranks, "single_rank", np.zeros((0, len(ranks)), np.int64),
                                      {r: int(len(members[r])) for r in ranks}, []))
            continue
        gm = _match_group(name, ranks, members, by_rank, step_ns)
        results.append(gm)
        ref = gm.ranks[0]
        for j, r in enumerate(gm.ranks):
            matched[r] += int(len(gm.index))
            if j == 0 or not len(gm.index):
                continue
            a_end = np.asarray(by_rank[ref].end_ns, np.int64)[gm.index[:, 0]]
            b_end = np.asarray(by_rank[r].end_ns, np.int64)[gm.index[:, j]]
            constraints.append((ref, r, float(np.median(b_end - a_end)), int(len(gm.index))))
    unmatched = {s.rank: len(s.op) - point_to_point[s.rank] - matched[s.rank] for s in summaries}
    return Matching(groups=results, skew_ns=_solve_skews([s.rank for s in summaries], constraints),
                    matched=matched, unmatched=unmatched, point_to_point=point_to_point)


def _match_group(name: str, ranks: list[int], members: dict[int, np.ndarray], by_rank: dict[int, RankSummary],
                 step_ns: float) -> GroupMatch:
    seqs = {r: [by_rank[r].seq[i] for i in members[r]] for r in ranks}
    if all(v is not None for r in ranks for v in seqs[r]):
        # by sequence number: the collectives every member recorded
        common = set.intersection(*(set(seqs[r]) for r in ranks))
        order = sorted(common)
        pos = {r: {q: int(members[r][k]) for k, q in enumerate(seqs[r])} for r in ranks}
        index = np.array([[pos[r][q] for r in ranks] for q in order], dtype=np.int64).reshape(len(order), len(ranks))
        return GroupMatch(name, ranks, "sequence_numbers", index,
                          {r: len(seqs[r]) - len(order) for r in ranks}, [])
    # by alignment against the member with the most collectives
    ref = max(ranks, key=lambda r: (len(members[r]), -r))
    ordered = [ref] + [r for r in ranks if r != ref]
    ref_end = np.sort(np.asarray(by_rank[ref].end_ns, dtype=np.float64)[members[ref]])
    spacing = float(np.median(np.diff(ref_end))) if len(ref_end) > 1 else step_ns or float("inf")
    # a pair's ends agree within microseconds on GPUs, within milliseconds for CPU collectives on busy cores:
    # pairing keeps the most calls within half a step (half the spacing of calls in the greedy walk)
    tolerance = max(step_ns / 2 if step_ns else spacing / 2, 1000.0)
    tight = max(min(spacing / 2, tolerance), 1000.0)
    pairs: dict[int, dict[int, int]] = {}
    misaligned = []
    for r in ordered[1:]:
        skew = _align(by_rank[ref], members[ref], by_rank[r], members[r], step_ns)
        if skew is None:
            misaligned.append(r)
        else:
            pairs[r] = _pair(by_rank[ref], members[ref], by_rank[r], members[r], skew, tolerance, tight)
    kept = [ref] + [r for r in ordered[1:] if r in pairs]
    rows = [[int(members[ref][i])] + [pairs[r][i] for r in kept[1:]]
            for i in range(len(members[ref])) if all(i in pairs[r] for r in kept[1:])]
    index = np.array(rows, dtype=np.int64).reshape(len(rows), len(kept))
    unmatched = {r: int(len(members[r])) - (len(rows) if r in kept else 0) for r in ranks}
    return GroupMatch(name, kept, "alignment", index, unmatched, misaligned)


def _solve_skews(ranks: list[int], constraints: list[tuple[int, int, float, int]]) -> dict[int, int | None]:
    """Each rank's clock offset, least squares over all groups' constraints, per connected set of ranks
    (each anchored at its lowest rank: the offset between two unconnected sets is unknown, and unused)."""
    position = {r: i for i, r in enumerate(ranks)}
    parent = list(range(len(ranks)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b, _, _ in constraints:
        parent[find(position[a])] = find(position[b])
    out: dict[int, int | None] = {r: None for r in ranks}
    components: dict[int, list[int]] = {}
    for r in ranks:
        components.setdefault(find(position[r]), []).append(r)
    for members in components.values():
        if len(members) == 1:
            out[members[0]] = 0 if any(members[0] in (a, b) for a, b, _, _ in constraints) else None
            continue
        col = {r: i for i, r in enumerate(members)}
        rows, rhs, weights = [], [], []
        for a, b, d, w in constraints:
            if a in col and b in col:
                row = np.zeros(len(members))
                row[col[b]] += 1.0
                row[col[a]] -= 1.0
                rows.append(row)
                rhs.append(d)
                weights.append(np.sqrt(w))
        anchor = np.zeros(len(members))
        anchor[col[min(members)]] = 1e3
        rows.append(anchor)
        rhs.append(0.0)
        weights.append(1.0)
        a_mat = np.vstack(rows) * np.asarray(weights)[:, None]
        b_vec = np.asarray(rhs) * np.asarray(weights)
        solution = np.linalg.lstsq(a_mat, b_vec, rcond=None)[0]
        for r in members:
            out[r] = int(round(solution[col[r]]))
    return out


@dataclass
class Arrivals:
    """Per matched collective (rows) and rank (columns): aligned arrival, wait, the rank waited for."""

    group: list[str]
    op: list[str]
    ranks: list[int]
    arrival_ns: np.ndarray
    wait_ns: np.ndarray
    last: np.ndarray  # index into ranks; -1 where every rank arrived together
    transfer_ns: np.ndarray
    #: collectives x ranks: the rank's arrival follows its validation or checkpoint work (``RankSummary.after_marked``)
    after_marked: np.ndarray | None = None
    #: per collective: the ProfilerStep it belongs to, as the first of its ranks (in the group's order) that issued it
    #: inside a step numbers it (-1 where none did): one label per collective, so ranks that number their steps
    #: apart, or whose steps the trace places apart, still share it
    step: np.ndarray | None = None

    #: per rank (columns' order): its exposed collective time (``RankSummary.exposed_start_ns``) on the aligned clock,
    #: None where its trace cannot tell it
    exposed: list[iv.Intervals | None] | None = None
    #: collectives x ranks: the collective's index in that rank's own lists (-1 where the rank is not in it)
    index: np.ndarray | None = None

    def _wait_pieces(self, col: int, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rank ``col``'s wait intervals, [own arrival, last arrival], per collective of ``rows`` (all rows where
        None), less what an earlier-starting one already covers: (row index, piece starts, piece ends)."""
        pick = np.ones(len(self.last), bool) if rows is None else np.array(rows, dtype=bool, copy=True)
        if len(self.wait_ns):
            pick = pick & ~np.isnan(self.wait_ns[:, col])  # never the caller's mask: a new array
        idx = np.flatnonzero(pick)
        start = self.arrival_ns[idx, col]
        end = start + self.wait_ns[idx, col]
        lo, hi = np.zeros(len(idx)), np.zeros(len(idx))
        reach = -np.inf
        for k in np.argsort(start, kind="stable"):
            lo[k] = max(start[k], reach)
            hi[k] = max(lo[k], end[k])
            reach = max(reach, end[k])
        return idx, lo, hi

    def new_wait_ns(self, col: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Per collective (all rows, 0 outside ``rows``), the part of rank ``col``'s wait no other of ``rows``
        already covers: waits in collectives in flight together (DDP's buckets) are one wait, so these sum to the
        measure of the union of the rank's wait intervals, [own arrival, last arrival]."""
        out = np.zeros(len(self.last))
        idx, lo, hi = self._wait_pieces(col, rows)
        out[idx] = hi - lo
        return out

    def waits_ns(self, col: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Per collective, rank ``col``'s ``new_wait_ns`` over every row, and the part of it in which the rank computes
        nothing (its exposed collective time; None where its exposure is not known): a wait the rank spends computing
        (an overlapped bucket's, during backward) costs it nothing."""
        new, exposed = np.zeros(len(self.last)), self.exposed[col] if self.exposed is not None else None
        idx, lo, hi = self._wait_pieces(col, None)
        new[idx] = hi - lo
        if exposed is None:
            return new, None
        out = np.zeros(len(self.last))
        if len(idx):
            out[idx] = iv.overlap_each(np.rint(lo).astype(np.int64), np.rint(hi).astype(np.int64), exposed)
        return new, out

    def shared_wait_ns(self, waits: dict[int, np.ndarray | None]) -> float | None:
        """Waiting every rank does inside one step: per step, the least wait any rank has in its collectives of that
        step, summed over steps; ``waits``: per rank column with any wait known, its wait per collective
        (``waits_ns``'s either part; None where not known). Lateness that moves between the ranks inside a step
        (rank 0 late at one bucket, rank 1 at the next) is time collectives overlapped with compute would hide like
        their transfer; lateness that moves from one step to the next is not (the step ends in a barrier: its slowest
        rank sets it). Collectives outside every step count as one step together, so a trace whose steps are unknown
        (no ProfilerStep, a summary from before steps were kept) counts its window as one step: the least total wait
        of any rank. None where fewer than two ranks' waits are known."""
        if len(waits) < 2 or any(w is None for w in waits.values()):
            return None
        steps = self.step if self.step is not None and len(self.step) == len(self.last) \
            else np.full(len(self.last), -1, np.int64)
        per_rank = []
        for i, w in waits.items():
            assert w is not None
            ok = ~np.isnan(self.wait_ns[:, i])
            sums: dict[int, float] = {}
            for k, v in zip(steps[ok].tolist(), w[ok].tolist(), strict=True):
                sums[k] = sums.get(k, 0.0) + v
            per_rank.append(sums)
        keys = set().union(*per_rank)
        return float(sum(min(d.get(k, 0.0) for d in per_rank) for k in keys))


def arrivals(summaries: list[RankSummary], m: Matching) -> Arrivals:
    by_rank = {s.rank: s for s in summaries}
    all_ranks = sorted(by_rank)
    col = {r: i for i, r in enumerate(all_ranks)}
    groups, ops, arr_rows, wait_rows, last, transfer, marked_rows, step_rows = [], [], [], [], [], [], [], []
    index_rows = []
    for gm in m.groups:
        if len(gm.ranks) < 2 or not len(gm.index):
            continue
        usable = [j for j, r in enumerate(gm.ranks) if m.skew_ns.get(r) is not None]
        if len(usable) < 2:
            continue
        for row in gm.index:
            arrival = np.full(len(all_ranks), np.nan)
            own = np.full(len(all_ranks), -1, dtype=np.int64)
            marked = np.zeros(len(all_ranks), bool)
            step = -1
            ends = []
            durs = []
            for j in usable:
                r = gm.ranks[j]
                s = by_rank[r]
                skew = m.skew_ns[r] or 0
                arrival[col[r]] = s.start_ns[row[j]] - skew
                own[col[r]] = int(row[j])
                marked[col[r]] = bool(s.after_marked[row[j]]) if len(s.after_marked) > row[j] else False
                if step < 0 and len(s.step) > row[j]:
                    step = int(s.step[row[j]])
                ends.append(s.end_ns[row[j]] - skew)
                durs.append(s.end_ns[row[j]] - s.start_ns[row[j]])
            latest = np.nanmax(arrival)
            arr_rows.append(arrival)
            index_rows.append(own)
            marked_rows.append(marked)
            step_rows.append(step)
            wait_rows.append(latest - arrival)
            # nobody waited when every rank arrived within a microsecond: no one to blame
            spread = latest - np.nanmin(arrival)
            last.append(int(np.nanargmax(arrival)) if spread >= NO_WAIT_NS else -1)
            transfer.append(float(min(durs)))
            groups.append(gm.group)
            ops.append(by_rank[gm.ranks[usable[0]]].op[row[usable[0]]])
    n = len(all_ranks)
    exposed: list[iv.Intervals | None] = []
    for r in all_ranks:
        s = by_rank[r]
        offset = m.skew_ns.get(r)
        if s.exposed_start_ns is None or s.exposed_end_ns is None or offset is None:
            exposed.append(None)
        else:  # on the aligned clock, as the arrivals
            exposed.append((np.asarray(s.exposed_start_ns, np.int64) - int(offset),
                            np.asarray(s.exposed_end_ns, np.int64) - int(offset)))
    return Arrivals(group=groups, op=ops, ranks=all_ranks,
                    arrival_ns=np.vstack(arr_rows) if arr_rows else np.zeros((0, n)),
                    wait_ns=np.vstack(wait_rows) if wait_rows else np.zeros((0, n)),
                    last=np.asarray(last, dtype=np.int64), transfer_ns=np.asarray(transfer, dtype=np.float64),
                    after_marked=np.vstack(marked_rows) if marked_rows else np.zeros((0, n), bool),
                    step=np.asarray(step_rows, dtype=np.int64), exposed=exposed,
                    index=np.vstack(index_rows) if index_rows else np.zeros((0, n), np.int64))


def job_metrics(summaries: list[RankSummary], m: Matching, a: Arrivals) -> Collectives:
    """The report's ``job.collectives``: matched and unmatched counts, skews, waits, the waited-for rank."""
    per_rank = []
    late = a.last[a.last >= 0]
    waited_for = np.bincount(late, minlength=len(a.ranks)) if len(late) else np.zeros(len(a.ranks), np.int64)
    new_waits: dict[int, np.ndarray | None] = {}
    exposed_waits: dict[int, np.ndarray | None] = {}
    for i, r in enumerate(a.ranks):
        waits = a.wait_ns[:, i] if len(a.wait_ns) else np.zeros(0)
        present = ~np.isnan(waits)
        if present.any():
            new_waits[i], exposed_waits[i] = a.waits_ns(i)
        # the rank this one waited for most often: the last to arrive at the collectives where it was not
        others = a.last[(a.last >= 0) & (a.last != i) & ~np.isnan(a.wait_ns[:, i])] if len(a.last) else a.last
        per_rank.append(CollectiveRank(
            rank=r,
            clock_skew_us=s / 1000.0 if (s := m.skew_ns.get(r)) is not None else None,
            matched=m.matched[r],
            unmatched=m.unmatched[r],
            point_to_point=m.point_to_point.get(r, 0),
            wait_us=round(float(nw.sum()) / 1000.0, 3) if (nw := new_waits.get(i)) is not None else None,
            exposed_wait_us=round(float(ew.sum()) / 1000.0, 3) if (ew := exposed_waits.get(i)) is not None else None,
            waited_for_count=int(waited_for[i]),
            waited_for_rank=int(a.ranks[int(np.bincount(others).argmax())]) if len(others) else None,
        ))
    # what the others waited where each rank arrived last: the rank they waited for the longest is the most waited for
    # (was: the one last most often, so a rank that alone evaluated every 3rd step, its partner waiting 115 ms for it,
    # was not, where its partner, last by a hair in the other steps, 11 ms in all, was)
    waited_for_ns = [sum(float(nw[a.last == i].sum()) for j, nw in new_waits.items() if j != i and nw is not None)
                     for i in range(len(a.ranks))]
    per_rank = [structs.replace(pr, waited_for_us=round(waited_for_ns[i] / 1000.0, 3))
                for i, pr in enumerate(per_rank)]
    most = int(a.ranks[int(np.argmax(waited_for_ns))]) if len(late) and max(waited_for_ns) > 0 else \
        int(a.ranks[int(np.argmax(waited_for))]) if len(late) else None
    return Collectives(
        matched=int(len(a.last)),
        unmatched=int(sum(m.unmatched.values())),
        groups=[CollectiveGroup(group=g.group, ranks=g.ranks, method=g.method, matched=int(len(g.index)),
                                unmatched=g.unmatched, misaligned_ranks=g.misaligned) for g in m.groups],
        reference_rank=min(a.ranks) if a.ranks else None,
        most_waited_for_rank=most,
        ranks=per_rank,
        shared_wait_us=round(shared / 1000.0, 3) if (shared := a.shared_wait_ns(new_waits)) is not None else None,
        shared_exposed_wait_us=round(sx / 1000.0, 3) if (sx := a.shared_wait_ns(exposed_waits)) is not None else None,
        method="collectives matched per process group (sequence numbers, else sequence alignment); clocks "
               "aligned on collective completion; wait = last aligned arrival - own arrival, "
               "the union over collectives in flight together; exposed wait = the part of it with no compute "
               "beside it; shared wait = per step, the least any rank waits in it, summed",
    )
