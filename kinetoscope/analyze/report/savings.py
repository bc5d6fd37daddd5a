"""Which findings share what fixing them saves, and what fixing them together is worth.

Each finding's estimate is its fix alone. Two findings can describe one cause (GPU idle that is the DataLoader's
wait; a sync and the copy it waits for): printed side by side, their savings read as if they added up. Two
findings share a cause when the what-if replay of both fixes at once saves less than their savings added (by more
than rounding); findings linked that way form a group, and the group is worth its own replay, once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

from kinetoscope.analyze.model.estimate import Estimate
from kinetoscope.analyze.model.findings import Finding, saving_us
from kinetoscope.analyze.model.trace import RankTrace, Trace
from kinetoscope.analyze.report.builder import Report

#: savings that differ by less than this (us per step, or this share of their sum) are the same
TOLERANCE_US = 1.0
TOLERANCE_SHARE = 0.01


@dataclass(frozen=True)
class SharedSaving:
    rank: int | None
    #: positions in the report's findings of the findings that share a cause (two or more)
    findings: tuple[int, ...]
    #: what fixing them together is worth (``whatif.combined``'s estimate: saving_us_per_step, step_us_after, ...)
    together: Estimate


def overlapping_groups(savings: Sequence[float], together: Callable[[tuple[int, ...]], float]) -> list[tuple[int, ...]]:
    """Groups (two or more, in order) of the items whose savings overlap: ``together((i, j))`` is less than
    savings[i] + savings[j] by more than the tolerance; linked items form one group."""
    parent = list(range(len(savings)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in combinations(range(len(savings)), 2):
        both = savings[i] + savings[j]
        if together((i, j)) < both - max(TOLERANCE_US, TOLERANCE_SHARE * both):
            parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(savings)):
        groups.setdefault(root(i), []).append(i)
    return [tuple(g) for g in groups.values() if len(g) > 1]


def shared_savings(trace: Trace, report: Report) -> list[SharedSaving]:
    """Per rank, the findings (with a saving) that share a cause, and what fixing each group together is worth."""
    from kinetoscope.analyze import whatif

    out: list[SharedSaving] = []
    for r in trace.ranks:
        mine = [(i, f) for i, f in enumerate(report.findings) if f.rank == r.rank and saving_us(f) > 0]
        if len(mine) < 2:
            continue
        found: list[Finding] = [f for _, f in mine]

        def together(items: tuple[int, ...], r: RankTrace = r, found: list[Finding] = found) -> float:
            est = whatif.combined(r, [found[k] for k in items])
            return float(est.saving_us_per_step or 0.0) if est is not None else 0.0

        for group in overlapping_groups([saving_us(f) for f in found], together):
            est = whatif.combined(r, [found[k] for k in group])
            if est is not None:
                out.append(SharedSaving(rank=r.rank, findings=tuple(mine[k][0] for k in group), together=est))
    return out


def all_together(trace: Trace, report: Report, rank: int) -> Estimate | None:
    """What fixing every finding of ``rank`` that has a saving is worth at once (one replay), or None with fewer
    than two."""
    from kinetoscope.analyze import whatif

    found = [f for f in report.findings if f.rank == rank and saving_us(f) > 0]
    if len(found) < 2:
        return None
    return whatif.combined(trace.rank(rank), found)
