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
Arrival = the collective's start on the rank's aligned clock; the last to arrive is the rank the others
waited for, and each rank's wait is the last arrival minus its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: ops whose message sizes are the same on every rank (alltoall and send/recv sizes are per rank)
_SIZE_INVARIANT = frozenset({"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "barrier"})
#: offsets tried when aligning two ranks' sequences without sequence numbers
MAX_OFFSET = 64
#: a matched collective's implied skew must be this consistent (median absolute deviation, as a share
#: of the mean step) for an alignment to count
COMPONENTS = ("input", "copy", "compute", "host")
#: arrivals closer than this are simultaneous: nobody waited
NO_WAIT_NS = 1000


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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "RankSummary":
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
    #: per rank: collectives matched, unmatched
    matched: dict[int, int]
    unmatched: dict[int, int]


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
           step_ns: float) -> int | None:
    """The offset d pairing ref_idx[i] with other_idx[i - d] best (see the module doc), or None."""
    ref_sig = [_signature(ref, int(i)) for i in ref_idx]
    oth_sig = [_signature(other, int(i)) for i in other_idx]
    ref_end = np.asarray(ref.end_ns, dtype=np.int64)[ref_idx]
    oth_end = np.asarray(other.end_ns, dtype=np.int64)[other_idx]
    n_ref, n_oth = len(ref_idx), len(other_idx)
    best: list[tuple[float, float, int, int]] = []  # (-agreement, |skew|, -pairs, d)
    for d in range(-min(n_oth - 1, MAX_OFFSET), min(n_ref - 1, MAX_OFFSET) + 1):
        lo, hi = max(0, d), min(n_ref, n_oth + d)
        if hi <= lo:
            continue
        pairs = hi - lo
        agree = sum(ref_sig[i] == oth_sig[i - d] for i in range(lo, hi))
        if agree == 0:
            continue
        same = [i for i in range(lo, hi) if ref_sig[i] == oth_sig[i - d]]
        diffs = oth_end[[i - d for i in same]] - ref_end[same]
        skew = float(np.median(diffs))
        best.append((-agree / pairs, abs(skew), -pairs, d))
    if not best:
        return None
    top = min(b[0] for b in best)
    candidates = sorted(b for b in best if b[0] <= top + 1e-9)
    _, skew_abs, _, d = min(candidates, key=lambda b: (b[1], b[2]))
    if step_ns and skew_abs > step_ns:
        return None  # a "skew" beyond a step is a mismatch
    return d


def match(summaries: list[RankSummary]) -> Matching:
    """Match every rank's collectives, group by group, and solve the clock skews."""
    by_rank = {s.rank: s for s in summaries}
    steps = [s.mean_step_us for s in summaries if s.mean_step_us]
    step_ns = float(np.median(steps)) * 1000.0 if steps else 0.0
    groups: dict[str, dict[int, np.ndarray]] = {}
    for s in summaries:
        g = np.asarray(s.group, dtype=object)
        for name in dict.fromkeys(s.group):
            groups.setdefault(str(name), {})[s.rank] = np.flatnonzero(g == name)
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
    unmatched = {s.rank: len(s.op) - matched[s.rank] for s in summaries}
    return Matching(groups=results, skew_ns=_solve_skews([s.rank for s in summaries], constraints),
                    matched=matched, unmatched=unmatched)


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
    offsets: dict[int, int] = {ref: 0}
    misaligned = []
    for r in ordered[1:]:
        d = _align(by_rank[ref], members[ref], by_rank[r], members[r], step_ns)
        if d is None:
            misaligned.append(r)
        else:
            offsets[r] = d
    kept = [r for r in ordered if r in offsets]
    rows = []
    for i in range(len(members[ref])):
        row = []
        for r in kept:
            j = i - offsets[r]
            if not 0 <= j < len(members[r]):
                break
            if _signature(by_rank[r], int(members[r][j])) != _signature(by_rank[ref], int(members[ref][i])):
                break
            row.append(int(members[r][j]))
        else:
            rows.append(row)
    index = np.array(rows, dtype=np.int64).reshape(len(rows), len(kept))
    unmatched = {r: int(len(members[r])) - (len(rows) if r in offsets else 0) for r in ranks}
    return GroupMatch(name, kept, "alignment", index, unmatched, misaligned)


def _solve_skews(ranks: list[int], constraints: list[tuple[int, int, float, int]]) -> dict[int, int | None]:
    """Each rank's clock offset from the lowest rank it is connected to, least squares over all groups."""
    if not ranks:
        return {}
    position = {r: i for i, r in enumerate(ranks)}
    # connected components from the constraints; each component's lowest rank reads 0
    parent = list(range(len(ranks)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b, _, _ in constraints:
        parent[find(position[a])] = find(position[b])
    out: dict[int, int | None] = {}
    root_of = {r: find(position[r]) for r in ranks}
    anchor = min(ranks)
    component = [r for r in ranks if root_of[r] == root_of[anchor]]
    rows, rhs, weights = [], [], []
    for a, b, d, w in constraints:
        if root_of[a] != root_of[anchor]:
            continue
        row = np.zeros(len(component))
        row[component.index(b)] += 1.0
        row[component.index(a)] -= 1.0
        rows.append(row)
        rhs.append(d)
        weights.append(np.sqrt(w))
    fix = np.zeros(len(component))
    fix[component.index(anchor)] = 1.0
    rows.append(fix * 1e3)
    rhs.append(0.0)
    weights.append(1.0)
    a_mat = np.vstack(rows) * np.asarray(weights)[:, None]
    b_vec = np.asarray(rhs) * np.asarray(weights)
    solution = np.linalg.lstsq(a_mat, b_vec, rcond=None)[0]
    for r in ranks:
        out[r] = int(round(solution[component.index(r)])) if r in component else None
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


def arrivals(summaries: list[RankSummary], m: Matching) -> Arrivals:
    by_rank = {s.rank: s for s in summaries}
    all_ranks = sorted(by_rank)
    col = {r: i for i, r in enumerate(all_ranks)}
    groups, ops, arr_rows, wait_rows, last, transfer = [], [], [], [], [], []
    for gm in m.groups:
        if len(gm.ranks) < 2 or not len(gm.index):
            continue
        usable = [j for j, r in enumerate(gm.ranks) if m.skew_ns.get(r) is not None]
        if len(usable) < 2:
            continue
        for row in gm.index:
            arrival = np.full(len(all_ranks), np.nan)
            ends = []
            durs = []
            for j in usable:
                r = gm.ranks[j]
                s = by_rank[r]
                skew = m.skew_ns[r] or 0
                arrival[col[r]] = s.start_ns[row[j]] - skew
                ends.append(s.end_ns[row[j]] - skew)
                durs.append(s.end_ns[row[j]] - s.start_ns[row[j]])
            latest = np.nanmax(arrival)
            arr_rows.append(arrival)
            wait_rows.append(latest - arrival)
            # nobody waited when every rank arrived within a microsecond: no one to blame
            spread = latest - np.nanmin(arrival)
            last.append(int(np.nanargmax(arrival)) if spread >= NO_WAIT_NS else -1)
            transfer.append(float(min(durs)))
            groups.append(gm.group)
            ops.append(by_rank[gm.ranks[usable[0]]].op[row[usable[0]]])
    n = len(all_ranks)
    return Arrivals(group=groups, op=ops, ranks=all_ranks,
                    arrival_ns=np.vstack(arr_rows) if arr_rows else np.zeros((0, n)),
                    wait_ns=np.vstack(wait_rows) if wait_rows else np.zeros((0, n)),
                    last=np.asarray(last, dtype=np.int64), transfer_ns=np.asarray(transfer, dtype=np.float64))


def job_metrics(summaries: list[RankSummary], m: Matching, a: Arrivals) -> dict[str, Any]:
    """The report's ``job.collectives``: matched and unmatched counts, skews, waits, the waited-for rank."""
    per_rank = []
    late = a.last[a.last >= 0]
    waited_for = np.bincount(late, minlength=len(a.ranks)) if len(late) else np.zeros(len(a.ranks), np.int64)
    for i, r in enumerate(a.ranks):
        waits = a.wait_ns[:, i] if len(a.wait_ns) else np.zeros(0)
        present = ~np.isnan(waits)
        per_rank.append({
            "rank": r,
            "clock_skew_us": m.skew_ns[r] / 1000.0 if m.skew_ns.get(r) is not None else None,
            "matched": m.matched[r],
            "unmatched": m.unmatched[r],
            "wait_us": round(float(np.nansum(waits)) / 1000.0, 3) if present.any() else None,
            "waited_for_count": int(waited_for[i]),
        })
    most = int(a.ranks[int(np.argmax(waited_for))]) if len(late) else None
    return {
        "matched": int(len(a.last)),
        "unmatched": int(sum(m.unmatched.values())),
        "groups": [{"group": g.group, "ranks": g.ranks, "method": g.method, "matched": int(len(g.index)),
                    "unmatched": g.unmatched, "misaligned_ranks": g.misaligned} for g in m.groups],
        "reference_rank": min(a.ranks) if a.ranks else None,
        "most_waited_for_rank": most,
        "ranks": per_rank,
        "method": "collectives matched per process group (sequence numbers, else sequence alignment); clocks "
                  "aligned on collective completion; wait = last aligned arrival - own arrival",
    }
