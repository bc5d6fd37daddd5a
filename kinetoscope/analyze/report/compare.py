"""Compare two reports: what got faster or slower, which findings appeared or disappeared."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import timeline
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.trace import RankTrace, Trace
from kinetoscope.analyze.report.builder import Report, entry_value
from kinetoscope.analyze.report.steptime import SeriesStats, change_of_means, summarize

#: (label, path into a rank entry, lower is better; None: a composition, neither better nor worse)
HEADLINES: tuple[tuple[str, tuple[str, ...], bool | None], ...] = (
    ("mean step (us)", ("steps", "mean_us"), True),
    ("window (us)", ("window_us",), True),
    ("data loading, fraction of window", ("loader", "fraction"), True),
    ("GPU idle, fraction of window", ("gpu", "idle_fraction"), True),
    ("H2D time (us)", ("h2d", "time_us"), True),
    ("H2D overlapped, fraction of copy time", ("h2d", "overlap_fraction"), False),
    ("memory growth (bytes/step)", ("memory", "growth_bytes_per_step"), True),
    ("peak allocated (bytes)", ("memory", "peak_allocated_bytes"), True),
    ("forward, fraction of window", ("phases", "forward", "fraction"), None),
    ("backward, fraction of window", ("phases", "backward", "fraction"), None),
    ("optimizer, fraction of window", ("phases", "optimizer", "fraction"), None),
)


def _get(entry: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value = entry_value(entry, *path)
    return float(value) if isinstance(value, (int, float)) else None


def compare_reports(before: Report, after: Report, rank: int | None = None) -> pd.DataFrame:
    """One row per headline metric: before, after, change (after/before - 1) and whether that is better."""
    def entry(report: Report) -> dict[str, Any]:
        for r in report.ranks:
            if rank is None or r["rank"] == rank:
                return r
        return report.ranks[0]

    a, b = entry(before), entry(after)
    rows = []
    for label, path, lower_is_better in HEADLINES:
        x, y = _get(a, path), _get(b, path)
        change = (y / x - 1.0) if x not in (None, 0) and y is not None else None
        better = None if change is None or change == 0 or lower_is_better is None else (change < 0) == lower_is_better
        rows.append({"metric": label, "before": x, "after": y, "change": change, "better": better})
    return pd.DataFrame(rows)


#: findings whose measured cost is memory growth (bytes per step, ``evidence.growth_bytes_per_step``), not time
MEMORY_FINDINGS = ("memory_growth", "memory_inconclusive", "reserved_memory_growth")


def finding_changes(before: Report, after: Report) -> pd.DataFrame:
    """Findings that appeared, went, or are still there, each with its measured cost in each run where it was
    found: time (``impact_us``, what it cost in the profiled window) per complete step of that window, or, for
    memory growth, bytes per step. A finding with no time cost (a correctness finding) has null cost."""
    key = lambda f: (f.id, f.rank)  # noqa: E731
    old = {key(f): f for f in before.findings}
    new = {key(f): f for f in after.findings}
    rows = []

    def row(status: str, k: tuple[str, Any]) -> dict[str, Any]:
        b, a = old.get(k), new.get(k)
        tb, ta = _time_cost(before, b), _time_cost(after, a)
        gb, ga = _growth(b), _growth(a)
        return {"status": status, "id": k[0], "rank": k[1], "title": (a or b).title,  # type: ignore[union-attr]
                "before_us_per_step": tb, "after_us_per_step": ta,
                "change_us_per_step": ta - tb if ta is not None and tb is not None else None,
                "before_bytes_per_step": gb, "after_bytes_per_step": ga}

    # in each report's own order (most severe first), never a set's: the same runs give the same table
    rows = [row("appeared", k) for k in new if k not in old]
    rows += [row("gone", k) for k in old if k not in new]
    rows += [row("still there", k) for k in new if k in old]
    return pd.DataFrame(rows, columns=["status", "id", "rank", "title", "before_us_per_step", "after_us_per_step",
                                       "change_us_per_step", "before_bytes_per_step", "after_bytes_per_step"])


def _time_cost(report: Report, f: Finding | None) -> float | None:
    """What the finding cost per step of its rank's window (us): ``impact_us`` over the window's complete steps;
    None where it has no time cost (memory growth, correctness) or the window has no complete step."""
    if f is None or f.id in MEMORY_FINDINGS or not f.impact_us:
        return None
    entry = next((r for r in report.ranks if r["rank"] == f.rank), None)
    count = entry_value(entry, "steps", "count") if entry is not None else None
    return f.impact_us / count if isinstance(count, int) and count > 0 else None


def _growth(f: Finding | None) -> float | None:
    if f is None or f.id not in MEMORY_FINDINGS:
        return None
    value = f.evidence.get("growth_bytes_per_step")
    return float(value) if isinstance(value, (int, float)) else None


def name_changes(before: Trace, after: Trace, kinds: tuple[str, ...], top: int = 10) -> pd.DataFrame:
    """Kernels (or ops) whose time per step changed most: name, before/after us per step, change."""
    def per_step(trace: Trace) -> pd.Series:
        totals = []
        for r in trace.ranks:
            ev = r.events[r.events["kind"].isin(kinds)]
            steps = max(len(r.steps), 1)
            totals.append(ev.groupby("name", observed=True)["dur_ns"].sum() / steps / 1000.0)
        return pd.concat(totals).groupby(level=0).mean() if totals else pd.Series(dtype=float)

    a, b = per_step(before), per_step(after)
    table = pd.DataFrame({"before_us_per_step": a, "after_us_per_step": b}).fillna(0.0)
    table["change_us_per_step"] = table["after_us_per_step"] - table["before_us_per_step"]
    table = table.reindex(table["change_us_per_step"].abs().sort_values(ascending=False).index).head(top)
    return table.rename_axis("name").reset_index()


# --- time per step: the run-level change (what ``kinetoscope diff`` and its gate judge) --------------------------
StepSource = Literal["capture", "profiled", "window"]
Verdict = Literal["faster", "slower", "no change", "unknown"]


#: a change of the mean step smaller than this reads as no change even when its interval excludes 0: identical
#: reruns of a real job differ by 1-2% (other work on the host, clock boosts, data order), and a verdict inside that
#: would call identical runs changed
NO_CHANGE_WITHIN = 0.02

@dataclass(frozen=True)
class RunSteps:
    """One rank's step times (us, in run order) to compare runs on, and where they come from."""

    rank: int
    wall_us: np.ndarray
    #: "capture": every step the capture timed (``rank-<r>.steps.json``), but the first; "profiled": the trace's
    #: complete steps (ProfilerStep spans, or inferred ones); "window": no step at all, the window as one sample
    source: StepSource
    #: the first step the capture timed (us), left out of the mean: start-up (the profiler starting, the first
    #: batch, workers starting), paid once a run, not once a step; None where there is no capture
    first_step_us: float | None = None
    #: of the steps compared, how many the profiler recorded (they carry its overhead); None where unknown
    profiled_steps: int | None = None


def _capture_steps(rank: RankTrace) -> RunSteps | None:
    rs = rank.run_steps
    if rs is None or len(rs) < 3:  # the first is left out: at least two to compare
        return None
    wall = rs["wall_ns"].to_numpy(dtype=np.float64) / 1000.0
    return RunSteps(rank.rank, wall[1:], "capture", first_step_us=float(wall[0]),
                    profiled_steps=int(rs["profiled"].to_numpy()[1:].sum()))


def _trace_steps(rank: RankTrace) -> RunSteps | None:
    steps = rank.steps
    if len(steps) and "partial" in steps:
        steps = steps[~steps["partial"].to_numpy()]
    if not len(steps):
        return None
    wall = steps["dur_ns"].to_numpy(dtype=np.float64) / 1000.0
    return RunSteps(rank.rank, wall, "profiled", profiled_steps=len(wall))


def _window(rank: RankTrace) -> RunSteps:
    return RunSteps(rank.rank, np.array([timeline.window(rank).dur_ns / 1000.0]), "window")


def rank_steps(before: Trace, after: Trace) -> tuple[dict[int, RunSteps], dict[int, RunSteps]]:
    """Each rank's steps in both runs, from the same source everywhere (like for like): every step the captures
    timed where both runs have them for every rank, else the traces' complete steps where every rank of both has
    some, else each rank's window (one sample)."""
    for source in (_capture_steps, _trace_steps):
        b = {r.rank: source(r) for r in before.ranks}
        a = {r.rank: source(r) for r in after.ranks}
        if all(s is not None for s in (*b.values(), *a.values())):
            return b, a  # type: ignore[return-value]
    return {r.rank: _window(r) for r in before.ranks}, {r.rank: _window(r) for r in after.ranks}


@dataclass(frozen=True)
class StepSide:
    """One run's side of a step change: where its steps come from and their summary."""

    rank: int
    source: StepSource
    stats: SeriesStats
    first_step_us: float | None
    profiled_steps: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "source": self.source, **asdict(self.stats), "first_step_us": self.first_step_us,
                "profiled_steps": self.profiled_steps}


@dataclass(frozen=True)
class StepChange:
    """How the time per step changed between two runs: the mean step (the run's step time over its step count),
    its 95% interval (``steptime.change_of_means``: batch means of whole periods) and the verdict it supports.

    ``scope`` "job": ``before``/``after`` are each run's slowest rank (the largest mean step), since the ranks of a
    job wait for each other, and ``ranks`` holds the change of each rank in both runs; "rank": one rank."""

    scope: Literal["job", "rank"]
    rank: int | None
    before: StepSide
    after: StepSide
    #: "mean": the mean step; "window": no steps in a run, its window's length compared (one sample, no interval)
    statistic: Literal["mean", "window"]
    change: float | None
    ci_low: float | None
    ci_high: float | None
    #: the interval's degrees of freedom (Welch); None without an interval
    df: float | None
    #: "slower" / "faster": the interval lies above / below 0; "no change": it holds 0; "unknown": no interval
    verdict: Verdict
    #: after / before - 1 of the median step, and whether it says the same as the mean (lies inside the mean's
    #: interval). Where it does not, steps come in bursts or periods (or a stall) and the median would mislead:
    #: the mean is the one that follows the run's length
    median_change: float | None
    median_agrees: bool | None
    ranks: tuple[StepChange, ...] = ()

    @property
    def few_steps(self) -> bool:
        """The interval rests on the trace's profiled steps only (no ``steps.json``): a handful of steps."""
        return self.before.source == "profiled"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scope": self.scope, "rank": self.rank, "statistic": self.statistic, "change": self.change,
            "ci95": [self.ci_low, self.ci_high] if self.ci_low is not None else None, "df": self.df,
            "verdict": self.verdict, "median_change": self.median_change, "median_agrees": self.median_agrees,
            "few_steps": self.few_steps, "before": self.before.to_dict(), "after": self.after.to_dict()}
        if self.scope == "job":
            out["ranks"] = [r.to_dict() for r in self.ranks]
        return out


def series_change(before: RunSteps, after: RunSteps, *, scope: Literal["job", "rank"] = "rank",
                  rank: int | None = None, ranks: tuple[StepChange, ...] = ()) -> StepChange:
    """The change of the mean step between two runs' steps (see ``StepChange``)."""
    sb, sa = summarize(before.wall_us), summarize(after.wall_us)
    m = change_of_means(sb, sa)
    if m.ci_low is None or m.ci_high is None or m.change is None:  # change is known wherever the interval is
        verdict: Verdict = "unknown"
    else:
        # a change must be beyond the noise (its interval excludes 0) and beyond what reruns of one job differ by
        verdict = ("slower" if m.ci_low > 0 and m.change > NO_CHANGE_WITHIN else
                   "faster" if m.ci_high < 0 and m.change < -NO_CHANGE_WITHIN else "no change")
    agrees = None
    if m.median_change is not None and m.ci_low is not None and m.ci_high is not None:
        slack = 1e-9 * max(1.0, abs(m.ci_low), abs(m.ci_high))  # a zero-width interval holds its own end
        agrees = m.ci_low - slack <= m.median_change <= m.ci_high + slack
    side = lambda r, s: StepSide(r.rank, r.source, s, r.first_step_us, r.profiled_steps)  # noqa: E731
    return StepChange(scope=scope, rank=rank, before=side(before, sb), after=side(after, sa),
                      statistic="window" if before.source == "window" or after.source == "window" else "mean",
                      change=m.change, ci_low=m.ci_low, ci_high=m.ci_high, df=m.df, verdict=verdict,
                      median_change=m.median_change, median_agrees=agrees, ranks=ranks)


def run_step_change(before: Trace, after: Trace) -> StepChange:
    """How the time per step changed from ``before`` to ``after`` (two loaded jobs, one rank or several): the
    job's change (each run's slowest rank) with every rank's change in ``ranks`` (ranks in both runs, by number).
    The steps are every step each capture timed, but the first (``rank-<r>.steps.json``; profiled ones
    included), else the traces' complete steps (an interval over few steps), else each window as one sample."""
    b, a = rank_steps(before, after)
    per_rank = tuple(series_change(b[r], a[r], rank=r) for r in sorted(b) if r in a)
    slowest_b = max(b.values(), key=lambda s: float(np.mean(s.wall_us)))
    slowest_a = max(a.values(), key=lambda s: float(np.mean(s.wall_us)))
    return series_change(slowest_b, slowest_a, scope="job", ranks=per_rank)


@dataclass(frozen=True)
class Gate:
    """``--max-regression``: fails when the time per step grew by more than the limit with 95% confidence (the
    interval's low end above it; noise alone never fails a build); with no interval (one sample a run), when the
    change itself is above it."""

    max_regression: float
    regressed: bool
    basis: Literal["interval", "change"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gate(change: StepChange, max_regression: float) -> Gate:
    if change.ci_low is not None:
        return Gate(max_regression, change.ci_low > max_regression, "interval")
    return Gate(max_regression, change.change is not None and change.change > max_regression, "change")


@dataclass(frozen=True)
class Diff:
    """Everything ``kinetoscope diff`` shows, computed once; renderers only format it."""

    before: str
    after: str
    step_change: StepChange
    #: ``compare_reports``, ``finding_changes``, ``name_changes`` (kernels, CPU ops) and ``fix_check``
    metrics: pd.DataFrame
    findings: pd.DataFrame
    kernels: pd.DataFrame
    ops: pd.DataFrame
    fixes: pd.DataFrame
    gate: Gate | None = None
    #: the rank whose window entries ``metrics`` compares: the job's slowest rank after (None: one rank)
    metrics_rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        c = self.step_change
        return {"before": self.before, "after": self.after,
                "step_change": c.change, "step_change_statistic": c.statistic,
                "step_change_ci95": [c.ci_low, c.ci_high] if c.ci_low is not None else None,
                "step_change_verdict": c.verdict, "step_times": c.to_dict(),
                "metrics_rank": self.metrics_rank,
                "max_regression": self.gate.max_regression if self.gate else None,
                "regressed": bool(self.gate and self.gate.regressed),
                "gate": self.gate.to_dict() if self.gate else None,
                "metrics": self.metrics.to_dict("records"), "findings": self.findings.to_dict("records"),
                "kernels": self.kernels.to_dict("records"), "ops": self.ops.to_dict("records"),
                "fixes": self.fixes.to_dict("records")}


def diff_runs(before: Trace, after: Trace, rb: Report, ra: Report, *, before_label: str, after_label: str,
              max_regression: float | None = None) -> Diff:
    """Compare two loaded jobs and their reports (``build_report``)."""
    change = run_step_change(before, after)
    several = len(rb.ranks) > 1 or len(ra.ranks) > 1
    rank = change.after.rank if several else None
    return Diff(before=before_label, after=after_label, step_change=change, metrics_rank=rank,
                metrics=compare_reports(rb, ra, rank=rank), findings=finding_changes(rb, ra),
                kernels=name_changes(before, after, ("kernel", "memcpy", "memset")),
                ops=name_changes(before, after, ("cpu_op",)), fixes=fix_check(before, rb, ra),
                gate=gate(change, max_regression) if max_regression is not None else None)


def fix_check(before: Trace, rb: Report, ra: Report) -> pd.DataFrame:
    """For each finding of ``before`` gone in ``after``: the step time its fix was predicted to give (its
    ``estimate``) beside the step time measured after, per rank; and, where several went, all of them
    predicted together (one replay). Measured: each rank's mean window step in ``after``."""
    from kinetoscope.analyze import whatif

    after_step = {e["rank"]: (e.get("steps") or {}).get("mean_us") for e in ra.ranks}
    before_step = {e["rank"]: (e.get("steps") or {}).get("mean_us") for e in rb.ranks}
    gone = finding_changes(rb, ra)
    gone = gone[gone["status"] == "gone"]
    rows = []

    def row(fid: str, rank: Any, est: Mapping[str, Any] | None) -> None:
        b, a = before_step.get(rank), after_step.get(rank)
        pred = (est or {}).get("step_us_after")
        rows.append({"id": fid, "rank": rank, "before_step_us": b, "predicted_step_us": pred,
                     "measured_step_us": a,
                     "predicted_change": (pred / b - 1) if pred is not None and b else None,
                     "measured_change": (a / b - 1) if a is not None and b else None,
                     "error": (pred / a - 1) if pred is not None and a else None,
                     "method": (est or {}).get("method")})

    for rank, ids in gone.groupby("rank", dropna=False)["id"]:
        found = [f for f in rb.findings if f.rank == rank and f.id in set(ids)]
        for f in found:
            row(f.id, rank, f.estimate)
        costly = [f for f in found if f.estimate is not None and f.estimate.get("saving_us_per_step")]
        if len(costly) > 1:
            ranks = [r for r in before.ranks if r.rank == rank]
            if ranks:
                row(" + ".join(f.id for f in costly), rank, whatif.combined(ranks[0], costly))
    return pd.DataFrame(rows, columns=["id", "rank", "before_step_us", "predicted_step_us", "measured_step_us",
                                       "predicted_change", "measured_change", "error", "method"])
