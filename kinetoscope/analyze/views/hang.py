"""The Hang view: a job that stopped moving, rank by rank (what the Hang page and the Fleet page's hung jobs show).

From the ranks' hang dumps (``Trace.hang_dumps``) and the ``hang`` finding the report holds: per rank of the job,
its part at the collective where the ranks parted (never entered it, entered another, waiting, completed, no record,
no dump, raised), what it was doing there and what it last entered and completed (op, sizes, dtypes, state), why
its dump was written; and each rank's training thread as text (innermost frame first), the stuck ranks first.
Where the dumps show nothing out of step (dumps on demand, SIGUSR1), the same table without a verdict. Pure
functions of the trace, its report and a store's ``hangs`` table: screens only show them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kinetoscope.analyze.model.trace import Trace
from kinetoscope.analyze.report.builder import Report
from kinetoscope.hangdump import Frame, HangDump, fr_completed, fr_op

#: the per-rank table's columns
RANK_COLUMNS = ("rank", "part", "stuck", "at_seq_op", "at_seq_input_sizes", "at_seq_input_dtypes", "at_seq_state",
                "last_entered_seq", "last_entered_op", "last_entered_input_sizes", "last_entered_input_dtypes",
                "last_entered_state", "last_completed_seq", "last_completed_op", "dump_reason", "steps_ended",
                "seconds_since_progress_s", "where")
#: a rank's part at the collective where the ranks parted, by the evidence list that names it (first match wins)
PARTS = (("missing_ranks", "never entered it"), ("mismatched_ranks", "entered another collective"),
         ("waiting_ranks", "waiting"), ("completed_ranks", "completed"), ("unknown_ranks", "no record of it"))
#: the Fleet page's hung jobs table
HUNG_COLUMNS = ("job", "op", "process_group", "seq", "stuck_ranks", "missing_ranks", "mismatched_ranks",
                "waiting_ranks", "ranks_without_dump", "dumps", "cause")


@dataclass(frozen=True)
class RankStack:
    """A rank's training thread (or the exception that ended it) as text, innermost frame first."""

    rank: int
    stuck: bool
    #: the rank's part, and whether an exception or the training thread's stack is shown
    label: str
    #: ``File "...", line N, in f`` and the line's code, a frame a pair of lines; empty: no stack in the dump
    text: str
    frames: int
    frames_omitted: int


@dataclass(frozen=True)
class HangView:
    #: whether the dumps show a hang (the ``hang`` finding); False: the dumps show every rank in step
    hung: bool
    title: str | None
    recommendation: str | None
    #: where the ranks parted and who is held responsible: the finding's evidence lists, and the dumps' counts
    headline: dict[str, Any]
    #: one row per rank of the job (``RANK_COLUMNS``), ranks without a dump too; blank where a dump cannot say
    ranks: pd.DataFrame
    #: the stuck ranks first, then the others with a dump, by rank
    stacks: tuple[RankStack, ...]
    about: str


def _sizes(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _dtypes(value: Any) -> str | None:
    return None if value is None else ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def _state(c: dict[str, Any]) -> str | None:
    return "completed" if c.get("completed") else c.get("state")


def _collective(entry: dict[str, Any]) -> dict[str, Any]:
    return {"seq": entry.get("collective_seq_id"), "op": fr_op(entry), "input_sizes": entry.get("input_sizes"),
            "input_dtypes": entry.get("input_dtypes"), "state": entry.get("state"), "completed": fr_completed(entry)}


def _own_record(d: HangDump) -> dict[str, Any]:
    """A rank's last collective entered and completed from its own recorder (every process group, by creation time):
    where no finding says which group to read."""
    entries = [e for e in (d.flight_recorder or {}).get("entries") or []
               if isinstance(e, dict) and not e.get("is_p2p") and isinstance(e.get("collective_seq_id"), int)]
    entries.sort(key=lambda e: (int(e.get("time_created_ns") or 0), e["collective_seq_id"]))
    done = [e for e in entries if fr_completed(e)]
    return {"rank": d.rank, "dump_reason": d.reason, "steps_ended": d.steps_ended,
            "seconds_since_progress": d.seconds_since_progress,
            "last_entered": _collective(entries[-1]) if entries else None,
            "last_completed": _collective(done[-1]) if done else None, "at_seq": None, "where": _innermost(d)}


def _frames(d: HangDump) -> tuple[list[Frame], int, str | None]:
    if d.exception is not None:
        return d.exception.frames, 0, f"{d.exception.type}: {d.exception.message}"
    training = next((t for t in d.threads if t.training), None)
    return (training.frames, training.frames_omitted, None) if training is not None else ([], 0, None)


def _innermost(d: HangDump) -> dict[str, Any] | None:
    frames = _frames(d)[0]
    if not frames:
        return None
    f = frames[0]
    return {"file": f.file, "line": f.line, "function": f.function}


def _where(w: dict[str, Any] | None) -> str | None:
    if not w:
        return None
    return f"{w.get('function')} ({str(w.get('file') or '?').rsplit('/', 1)[-1]}:{w.get('line')})"


def _stack_text(frames: list[Frame], omitted: int, exception: str | None) -> str:
    lines = [exception] if exception else []
    for f in frames:
        lines.append(f'File "{f.file}", line {f.line}, in {f.function}')
        if f.code:
            lines.append(f"    {f.code}")
    if omitted:
        lines.append(f"({omitted:,} outer frames left out)")
    return "\n".join(lines)


def hang_view(trace: Trace, report: Report) -> HangView | None:
    """The job's hang view; None when the job has no hang dumps."""
    dumps = {d.rank: d for d in trace.hang_dumps}
    if not dumps:
        return None
    finding = next((f for f in report.findings if f.id == "hang"), None)
    ev: dict[str, Any] = finding.evidence if finding is not None else {}
    world = max([d.world_size or 0 for d in dumps.values()] + [r + 1 for r in dumps])
    stuck = set(ev.get("stuck_ranks") or [])
    raised = set(ev.get("raised_ranks") or [])
    per_rank = {e["rank"]: e for e in ev.get("per_rank") or []} if finding is not None else \
        {r: _own_record(d) for r, d in dumps.items()}
    rows = []
    for rank in range(world):
        e = per_rank.get(rank)
        if rank not in dumps or e is None:
            part = "no dump"
        elif finding is None:
            part = "in step"
        else:
            part = next((label for key, label in PARTS if rank in (ev.get(key) or [])),
                        "raised" if rank in raised else "no record of it")
        at = (e or {}).get("at_seq") or {}
        last = (e or {}).get("last_entered") or {}
        done = (e or {}).get("last_completed") or {}
        rows.append({
            "rank": rank, "part": part, "stuck": rank in stuck,
            "at_seq_op": at.get("op"), "at_seq_input_sizes": _sizes(at.get("input_sizes")),
            "at_seq_input_dtypes": _dtypes(at.get("input_dtypes")), "at_seq_state": _state(at) if at else None,
            "last_entered_seq": last.get("seq"), "last_entered_op": last.get("op"),
            "last_entered_input_sizes": _sizes(last.get("input_sizes")),
            "last_entered_input_dtypes": _dtypes(last.get("input_dtypes")),
            "last_entered_state": _state(last) if last else None,
            "last_completed_seq": done.get("seq"), "last_completed_op": done.get("op"),
            "dump_reason": (e or {}).get("dump_reason"), "steps_ended": (e or {}).get("steps_ended"),
            "seconds_since_progress_s": (e or {}).get("seconds_since_progress"),
            "where": _where((e or {}).get("where")),
        })
    ranks = pd.DataFrame(rows, columns=list(RANK_COLUMNS))
    for col in ("last_entered_seq", "last_completed_seq", "steps_ended"):
        ranks[col] = ranks[col].astype("Int64")
    stacks = []
    parts = dict(zip(ranks["rank"], ranks["part"], strict=True))
    for rank in sorted(dumps, key=lambda r: (r not in stuck, r)):
        frames, omitted, exception = _frames(dumps[rank])
        what = "the exception that ended its training thread" if exception else "its training thread"
        stacks.append(RankStack(rank=rank, stuck=rank in stuck,
                                label=f"rank {rank}{' (stuck)' if rank in stuck else ''}: {parts[rank]}; {what}, "
                                      f"innermost frame first",
                                text=_stack_text(frames, omitted, exception), frames=len(frames),
                                frames_omitted=omitted))
    keys = ("process_group", "process_group_desc", "seq", "expected_op", "expected_is_a_tie", "group_ranks",
            "stuck_ranks", "missing_ranks", "mismatched_ranks", "waiting_ranks", "completed_ranks", "unknown_ranks",
            "ranks_without_dump", "raised_ranks", "other_groups")
    headline = {k: ev.get(k) for k in keys}
    headline.update({"world_size": world, "dumps": len(dumps), "ranks_without_dump": [r for r in range(world)
                                                                                      if r not in dumps]})
    about = ("Per rank of the job: its part at the collective where the ranks parted (seq is the process group's "
             "sequence number, the same on every rank; clocks are never compared), the op, input sizes and dtypes it "
             "entered there, its last collective entered and completed (in that process group), why its dump was "
             "written and the seconds since its last step ended when it was. State: torch's (scheduled, started) "
             "or completed.")
    return HangView(hung=finding is not None, title=finding.title if finding is not None else None,
                    recommendation=finding.recommendation if finding is not None else None, headline=headline,
                    ranks=ranks, stacks=tuple(stacks), about=about)


def _ranks_text(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return ", ".join(str(int(r)) for r in list(value))


def hung_jobs(hangs: pd.DataFrame, names: Mapping[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A store's ``hangs`` table as the Fleet page lists it: the jobs that hung (``HUNG_COLUMNS``, by name), and the
    jobs whose dumps could not be read (job, error)."""
    if hangs.empty:
        return pd.DataFrame(columns=list(HUNG_COLUMNS)), pd.DataFrame(columns=["job", "error"])
    ok = hangs[hangs["status"] == "ok"]
    hung = ok[ok["hung"].fillna(False).astype(bool)]
    shown = pd.DataFrame({
        "job": hung["job"].map(lambda j: names.get(j, j)), "op": hung["op"], "process_group": hung["process_group"],
        "seq": hung["seq"].astype("Int64"),
        **{c: hung[c].map(_ranks_text) for c in ("stuck_ranks", "missing_ranks", "mismatched_ranks", "waiting_ranks",
                                                 "ranks_without_dump")},
        "dumps": hung["dumps"].astype("Int64"), "cause": hung["cause"]})
    failed = hangs[hangs["status"] != "ok"]
    return (shown.sort_values("job", kind="stable").reset_index(drop=True)[list(HUNG_COLUMNS)],
            pd.DataFrame({"job": failed["job"].map(lambda j: names.get(j, j)), "error": failed["error"]})
            .sort_values("job", kind="stable").reset_index(drop=True))


def hung_first(table: pd.DataFrame, hung: pd.DataFrame) -> pd.DataFrame:
    """The Fleet's jobs table with a ``hung`` column and the hung jobs first (their order otherwise kept)."""
    flagged = table.assign(hung=table["job"].isin(set(hung["job"])))
    return flagged.sort_values("hung", ascending=False, kind="stable")
