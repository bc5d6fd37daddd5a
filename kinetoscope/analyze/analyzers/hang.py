"""Why a job stopped moving, from its ranks' hang dumps (``Trace.hang_dumps``, ``kinetoscope.hangdump``).

Each rank's flight recorder lists its recent collectives by process group and sequence number. In each group the
sequence numbers are walked from the first every rank still holds: the first one where the ranks disagree (a rank
never entered it, or entered another op or other sizes or dtypes, or it never completed) is where the job stopped.
There: ``missing_ranks`` never entered it, ``mismatched_ranks`` entered something else (compared with the op most
ranks entered; on a tie, the lowest rank's), ``waiting_ranks`` entered the expected op and wait, and the ranks held
responsible (``stuck_ranks``: the missing and the mismatched) come with what their training thread was doing (its
innermost frames, or the exception that ended it). Clocks are never compared across ranks: sequence numbers order it.
Point-to-point entries (``is_p2p``) are counted, not matched.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgspec

from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.results import Hang
from kinetoscope.analyze.model.trace import Trace
from kinetoscope.hangdump import Frame, HangDump
from kinetoscope.hangdump import fr_completed as _completed
from kinetoscope.hangdump import fr_op as _op

#: frames a finding shows of each rank's training thread (innermost first)
FRAMES_SHOWN = 8
#: path parts of code that is not the user's (the interpreter's library, installed packages, frozen modules)
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", "/kinetoscope/capture/")


@dataclass(frozen=True)
class Divergence:
    """Where one process group's ranks stopped agreeing."""

    group: str
    group_desc: str | None
    seq: int
    members: tuple[int, ...]
    expected: tuple[Any, ...] | None
    tie: bool
    entries: dict[int, dict[str, Any]]
    missing: tuple[int, ...]
    mismatched: tuple[int, ...]
    waiting: tuple[int, ...]
    completed: tuple[int, ...]
    #: members whose recorder holds nothing to judge (no dump, no recorder, its entries lost to the ring buffer)
    unknown: tuple[int, ...]
    first_created_ns: int


def _signature(entry: dict[str, Any]) -> tuple[Any, ...]:
    def frozen(v: Any) -> Any:
        return tuple(frozen(x) for x in v) if isinstance(v, list) else v

    return (_op(entry), frozen(entry.get("input_sizes")), frozen(entry.get("input_dtypes")),
            frozen(entry.get("output_sizes")), frozen(entry.get("output_dtypes")))


def _group_key(entry: dict[str, Any]) -> tuple[str, str | None]:
    pg = entry.get("process_group")
    if isinstance(pg, list) and pg:
        return str(pg[0]), (str(pg[1]) if len(pg) > 1 else None)
    return str(entry.get("pg_id")), None


def _members(group: str, desc: str | None, dumps: tuple[HangDump, ...], world: int,
             seen: set[int]) -> tuple[int, ...]:
    if desc == "default_pg":
        return tuple(range(world))
    for d in dumps:
        config = ((d.flight_recorder or {}).get("pg_config") or {}).get(group)
        if isinstance(config, dict) and isinstance(config.get("ranks"), str):
            try:
                return tuple(int(x) for x in config["ranks"].strip("[] ").split(",") if x.strip())
            except ValueError:
                pass
    return tuple(sorted(seen))


def divergences(dumps: tuple[HangDump, ...]) -> list[Divergence]:
    """Each process group's first disagreement, earliest created first."""
    world = max([d.world_size or 0 for d in dumps] + [d.rank + 1 for d in dumps])
    recorded = {d.rank for d in dumps if (d.flight_recorder or {}).get("entries")}
    by_group: dict[tuple[str, str | None], dict[int, dict[int, dict[str, Any]]]] = {}
    for d in dumps:
        for e in (d.flight_recorder or {}).get("entries") or []:
            if not isinstance(e, dict) or e.get("is_p2p") or not isinstance(e.get("collective_seq_id"), int):
                continue
            by_group.setdefault(_group_key(e), {}).setdefault(d.rank, {})[e["collective_seq_id"]] = e
    out = []
    for (group, desc), ranks in sorted(by_group.items()):
        members = _members(group, desc, dumps, world, set(ranks))
        known = [r for r in members if r in recorded]
        lows = [min(ranks[r]) for r in known if r in ranks]
        start = max(lows) if lows else 1
        end = max(max(seqs) for seqs in ranks.values())
        for seq in range(start, end + 1):
            entries = {r: ranks[r][seq] for r in known if r in ranks and seq in ranks[r]}
            missing = tuple(r for r in known if r not in entries and max(ranks.get(r, {0: None})) < seq)
            unknown = tuple(r for r in members if r not in known or (r not in entries and r not in missing))
            sigs = {r: _signature(e) for r, e in entries.items()}
            counts = Counter(sigs.values())
            if not missing and len(counts) <= 1 and all(_completed(e) for e in entries.values()):
                continue
            expected, tie = None, False
            if counts:
                top = max(counts.values())
                tied = [s for s, n in counts.items() if n == top]
                tie = len(tied) > 1
                expected = sigs[min(r for r, s in sigs.items() if s in tied)]
            mismatched = tuple(r for r, s in sorted(sigs.items()) if s != expected)
            waiting = tuple(r for r, s in sorted(sigs.items()) if s == expected and not _completed(entries[r]))
            completed = tuple(r for r, s in sorted(sigs.items()) if s == expected and _completed(entries[r]))
            created = [int(e.get("time_created_ns") or 0) for e in entries.values()]
            out.append(Divergence(group, desc, seq, members, expected, tie, entries, missing, mismatched, waiting,
                                  completed, unknown, min(created) if created else 0))
            break
    return sorted(out, key=lambda d: (d.first_created_ns, d.group))


def _collective(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {"seq": entry.get("collective_seq_id"), "op": _op(entry), "input_sizes": entry.get("input_sizes"),
            "input_dtypes": entry.get("input_dtypes"), "output_sizes": entry.get("output_sizes"),
            "output_dtypes": entry.get("output_dtypes"), "state": entry.get("state"),
            "completed": _completed(entry)}


def _is_user(frame: Frame) -> bool:
    path = frame.file.replace("\\", "/")
    return not any(part in path for part in _LIBRARY_PARTS)


def _frame(f: Frame) -> dict[str, Any]:
    return {"file": f.file, "line": f.line, "function": f.function, "code": f.code}


def _where(frames: list[Frame]) -> dict[str, Any] | None:
    """The innermost frame in the user's own code (else the innermost one)."""
    if not frames:
        return None
    return _frame(next((f for f in frames if _is_user(f)), frames[0]))


def _rank_entry(d: HangDump, group: tuple[str, str | None] | None) -> dict[str, Any]:
    entries = [e for e in (d.flight_recorder or {}).get("entries") or []
               if isinstance(e, dict) and not e.get("is_p2p") and (group is None or _group_key(e) == group)]
    entries.sort(key=lambda e: e.get("collective_seq_id") or 0)
    done = [e for e in entries if _completed(e)]
    training = next((t for t in d.threads if t.training), None)
    frames = d.exception.frames if d.exception is not None else (training.frames if training is not None else [])
    return {
        "rank": d.rank,
        "dump_reason": d.reason,
        "steps_ended": d.steps_ended,
        "seconds_since_progress": d.seconds_since_progress,
        "last_entered": _collective(entries[-1] if entries else None),
        "last_completed": _collective(done[-1] if done else None),
        "p2p_entries": sum(1 for e in (d.flight_recorder or {}).get("entries") or [] if isinstance(e, dict)
                           and e.get("is_p2p")),
        "flight_recorder_note": d.flight_recorder_note,
        "exception": {"type": d.exception.type, "message": d.exception.message} if d.exception is not None else None,
        "where": _where(frames),
        "frames": [_frame(f) for f in frames[:FRAMES_SHOWN]],
    }


def _describe(sig: tuple[Any, ...] | None) -> str:
    if sig is None:
        return "?"
    sizes = sig[1]
    return f"{sig[0]}{list(list(s) for s in sizes) if sizes else ''}"


def diagnose(dumps: tuple[HangDump, ...]) -> tuple[Hang, Finding | None]:
    """The job's hang metrics and its ``hang`` finding (None: the dumps show no collective out of step and no
    rank that raised or timed out)."""
    found = divergences(dumps)
    first = found[0] if found else None
    group = (first.group, first.group_desc) if first is not None else None
    per_rank = [_rank_entry(d, group) for d in dumps]
    world = max([d.world_size or 0 for d in dumps] + [d.rank + 1 for d in dumps])
    without = [r for r in range(world) if r not in {d.rank for d in dumps}]
    metrics = Hang(dumps=len(dumps), ranks_with_dump=[d.rank for d in dumps], ranks_without_dump=without,
                   reasons={str(d.rank): d.reason for d in dumps})
    raised = [d.rank for d in dumps if d.exception is not None]
    stalled = [d.rank for d in dumps if d.reason == "watchdog"]
    if first is None and not raised and not stalled:
        return metrics, None
    evidence: dict[str, Any] = {
        "process_group": first.group if first else None,
        "process_group_desc": first.group_desc if first else None,
        "seq": first.seq if first else None,
        "expected_op": _describe(first.expected) if first and first.expected else None,
        "expected_is_a_tie": first.tie if first else None,
        "group_ranks": list(first.members) if first else None,
        "missing_ranks": list(first.missing) if first else [],
        "mismatched_ranks": list(first.mismatched) if first else [],
        "waiting_ranks": list(first.waiting) if first else [],
        "completed_ranks": list(first.completed) if first else [],
        "unknown_ranks": list(first.unknown) if first else [],
        "ranks_without_dump": without,
        "raised_ranks": raised,
        "other_groups": [{"process_group": d.group, "seq": d.seq} for d in found[1:]],
    }
    # the ranks that parted from the others; where the recorders show none (the others left no dump, or every rank
    # entered and it never completed), those that raised
    stuck = sorted(set(evidence["missing_ranks"]) | set(evidence["mismatched_ranks"])) or raised
    evidence["stuck_ranks"] = stuck
    by_rank = {e["rank"]: e for e in per_rank}
    if first is not None:
        for r, e in by_rank.items():
            e["at_seq"] = _collective(first.entries.get(r))
    evidence["stuck"] = [{"rank": r, "why": ("never entered it" if r in evidence["missing_ranks"] else
                                             "entered another collective" if r in evidence["mismatched_ranks"]
                                             else "raised"),
                          "where": (by_rank.get(r) or {}).get("where"),
                          "exception": (by_rank.get(r) or {}).get("exception"),
                          "frames": (by_rank.get(r) or {}).get("frames")} for r in stuck]
    evidence["per_rank"] = per_rank
    metrics = msgspec.structs.replace(metrics, **{k: evidence[k] for k in (
        "process_group", "seq", "expected_op", "stuck_ranks", "missing_ranks", "mismatched_ranks", "waiting_ranks")})
    return metrics, Finding(id="hang", rank=None, title=_title(first, stuck, by_rank), evidence=evidence,
                            recommendation=_advice(first, stuck, by_rank), severity="critical")


def _where_text(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "no stack"
    exc = entry.get("exception")
    w = entry.get("where") or {}
    place = f"{w.get('function')} ({w.get('file', '?').rsplit('/', 1)[-1]}:{w.get('line')})" if w else "no stack"
    return f"raised {exc['type']} in {place}" if exc else f"in {place}"


def _title(first: Divergence | None, stuck: list[int], by_rank: dict[int, dict[str, Any]]) -> str:
    if first is None:
        return f"Job stopped: rank{'s' if len(stuck) != 1 else ''} {', '.join(map(str, stuck)) or '?'} " \
               f"{'; '.join(_where_text(by_rank.get(r)) for r in stuck)}"
    op = _describe(first.expected)
    what = f"collective #{first.seq} ({op}) of process group {first.group}"
    parts = []
    if first.missing:
        parts.append(f"rank{'s' if len(first.missing) > 1 else ''} {', '.join(map(str, first.missing))} never "
                     f"entered it")
    if first.mismatched:
        others = {_describe(_signature(first.entries[r])) for r in first.mismatched}
        parts.append(f"rank{'s' if len(first.mismatched) > 1 else ''} {', '.join(map(str, first.mismatched))} "
                     f"entered {', '.join(sorted(others))} instead")
    if first.unknown:
        parts.append(f"rank{'s' if len(first.unknown) > 1 else ''} {', '.join(map(str, first.unknown))} left no "
                     f"record of it (no dump: ended without one, e.g. aborted)")
    if not parts:
        parts.append("every rank entered it and it never completed")
    where = "; ".join(f"rank {r} {_where_text(by_rank.get(r))}" for r in stuck[:4])
    return f"Hang at {what}: {', '.join(parts)}" + (f" ({where})" if where else "")


def _advice(first: Divergence | None, stuck: list[int], by_rank: dict[int, dict[str, Any]]) -> str:
    if first is not None and first.unknown and not first.missing and not first.mismatched:
        return ("the ranks without a dump ended without writing one (an abort: gloo stops a rank sent a larger message "
                "than it expects, i.e. sizes that differ across ranks): read their logs; the others' errors follow "
                "from it")
    if first is not None and first.mismatched:
        return ("every rank must call the same collectives in the same order with the same sizes and dtypes: find "
                "the branch that differs on the mismatched ranks (their stacks are in the evidence)")
    if any((by_rank.get(r) or {}).get("exception") for r in stuck):
        return "fix the exception on the stuck rank; the others waited for it in the next collective"
    return ("look at what the stuck ranks' training thread was doing (evidence.stuck[].frames): a read that never "
            "returns, a branch that skips a collective, a loop that never ends")


@register("hang", "Hangs across ranks", scope="job")
def hang_analysis(trace: Trace, config: AnalysisConfig) -> AnalysisResult:
    """Where and why the job stopped, from the ranks' hang dumps; nothing when the job has none."""
    if not trace.hang_dumps:
        return AnalysisResult("hang", None)
    metrics, finding = diagnose(trace.hang_dumps)
    return AnalysisResult("hang", metrics, findings=(finding,) if finding is not None else ())
