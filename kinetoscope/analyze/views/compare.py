"""The Compare page's views of two runs: the run-level change of the time per step with its interval and the
verdict it supports (the one ``kinetoscope diff`` judges), findings matched by id and the set of ranks they were
found on, and the operators and kernels whose time per step changed most. Pure functions of the loaded traces and
their reports; the page only shows them."""

from __future__ import annotations

from typing import Any, cast

import pandas as pd

from kinetoscope.analyze.model.trace import Trace
from kinetoscope.analyze.report import compare
from kinetoscope.analyze.report.builder import Report

#: the run-level step change, one function: ``run_step_change`` (the mean step over every step the captures timed,
#: with its 95% interval and verdict)
_RUN_STEP_CHANGE = compare.run_step_change
#: a change smaller than this is no change even with an interval that excludes 0 (reruns of one job differ by
#: 1-2%); the analysis's own value where it has one
NO_CHANGE_WITHIN = getattr(compare, "NO_CHANGE_WITHIN", 0.02)
RUN_CHANGE_KEYS = ("statistic", "change", "ci_low", "ci_high", "verdict", "before_us", "after_us", "before_steps",
                   "after_steps", "before_source", "after_source")


def run_change(before: Trace, after: Trace) -> dict[str, Any]:
    """How the time per step changed from ``before`` to ``after``: the statistic compared ("mean" / "median" /
    "window"), the change (after / before - 1), its 95% interval, the verdict ("slower", "faster", "no change":
    within the noise or the rerun margin, "unknown": no interval), each run's step (us), its step count and where
    its steps come from."""
    got = _RUN_STEP_CHANGE(before, after)
    d = got.to_dict() if hasattr(got, "to_dict") else dict(cast(Any, got))
    ci = d.get("ci95") or [d.get("ci_low"), d.get("ci_high")]
    low, high = (ci + [None, None])[:2] if isinstance(ci, list) else (None, None)
    change = d.get("change")
    verdict = d.get("verdict") or _verdict(change, low, high)
    b, a = d.get("before"), d.get("after")
    side = lambda s, key, median: (s or {}).get(key) if isinstance(s, dict) else d.get(median)  # noqa: E731
    return {
        "statistic": d.get("statistic"),
        "change": change, "ci_low": low, "ci_high": high, "verdict": verdict,
        "before_us": side(b, "mean_us", "before_median_us"), "after_us": side(a, "mean_us", "after_median_us"),
        "before_steps": side(b, "steps", "before_steps"), "after_steps": side(a, "steps", "after_steps"),
        "before_source": side(b, "source", "before_source"), "after_source": side(a, "source", "after_source"),
    }


def _verdict(change: float | None, low: float | None, high: float | None) -> str:
    if change is None or low is None or high is None:
        return "unknown"
    if low > 0 and change > NO_CHANGE_WITHIN:
        return "slower"
    if high < 0 and change < -NO_CHANGE_WITHIN:
        return "faster"
    return "no change"


def finding_sets(before: Report, after: Report) -> pd.DataFrame:
    """Findings matched by id and the set of ranks each run found them on (rank 3 of a 4-rank job is not rank 3 of
    an 8-rank one): per id, the title (after's where there is one), the ranks before and after, and what changed
    ("appeared", "gone", "still there": the same ranks, "on other ranks": found in both on different ranks).
    Job-level findings (no rank) count as one set of their own."""
    def ranks(report: Report) -> dict[str, set[Any]]:
        out: dict[str, set[Any]] = {}
        for f in report.findings:
            out.setdefault(f.id, set()).add(f.rank)
        return out

    rb, ra = ranks(before), ranks(after)
    titles = {f.id: f.title for f in before.findings} | {f.id: f.title for f in after.findings}
    order = list(dict.fromkeys([f.id for f in after.findings] + [f.id for f in before.findings]))
    rows = []
    for fid in order:
        b, a = rb.get(fid, set()), ra.get(fid, set())
        status = "appeared" if not b else "gone" if not a else "still there" if a == b else "on other ranks"
        rows.append({"status": status, "id": fid, "title": titles[fid], "ranks_before": _ranks_text(b),
                     "ranks_after": _ranks_text(a), "ranks_of_the_job_before": len(before.ranks),
                     "ranks_of_the_job_after": len(after.ranks)})
    return pd.DataFrame(rows, columns=["status", "id", "title", "ranks_before", "ranks_after",
                                       "ranks_of_the_job_before", "ranks_of_the_job_after"])


def _ranks_text(ranks: set[Any]) -> str:
    from kinetoscope.render.format import rank_ranges

    numbered = sorted(r for r in ranks if r is not None)
    parts = ([rank_ranges(numbered)] if numbered else []) + (["the job"] if None in ranks else [])
    return ", ".join(parts)


def name_diffs(before: Trace, after: Trace, kinds: tuple[str, ...], top: int = 15) -> pd.DataFrame:
    """The operators (``kinds`` ("cpu_op",)) or kernels (("kernel",)) whose time per step changed most: ms per step
    before and after, and the change (the ranks' mean; a name missing from one run counts 0 there). Record-function
    containers (ProfilerStep, DataLoader waits, optimizer steps) are left out: they hold the operators."""
    from kinetoscope.analyze.model.timeline import CONTAINER_RE

    t = compare.name_changes(before, after, kinds, top=top + 50)
    t = t[~t["name"].astype(str).str.match(CONTAINER_RE)].head(top)  # steps and DataLoader waits are not operators
    return pd.DataFrame({"name": t["name"].astype(str).to_numpy(object),
                         "before_ms_per_step": t["before_us_per_step"].to_numpy() / 1000.0,
                         "after_ms_per_step": t["after_us_per_step"].to_numpy() / 1000.0,
                         "change_ms_per_step": t["change_us_per_step"].to_numpy() / 1000.0})
