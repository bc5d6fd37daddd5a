"""The severity policy: one function every finding goes through once its estimate is known.

A finding is a claim a user acts on, so how loud it is follows what acting on it is worth:

* **cost** findings (time lost: waits, idle, syncs, copies, launches, collectives, compilation) get their
  severity from their *worth*: the estimated saving over the run. A recurring cost is worth its saving per step
  over the mean step, or - where the capture measured it over every step of the run (``Finding.run_cost_us``) - its
  total over the run's time; a one-off cost (a recompile, a worker start) is worth its total over the run's time,
  amortised over every step the capture timed (else over the profiled window, and said so). Below
  ``config.severity_warning_min_worth`` it is information; from ``config.severity_critical_min_worth`` it is
  critical; warning between. Without an estimate the measured cost's share of the window stands in, and the
  finding says its worth was not estimated. A bound rather than an estimate (the measured cost, which a fix
  removes at most, or an estimate optimistic by what the trace cannot check) counts for
  ``config.upper_bound_credit`` of itself.
* **correctness** findings (gradients never cleared, an optimizer that does not step with the loop, memory
  heading out of memory) keep the severity their analyzer's rule gives: their worth is not time.
* **information** findings are always ``info``.

A finding's ``ceiling`` is the strongest severity its evidence supports whatever it is worth (a window filled
by start-up, a step cut short, steps inferred rather than marked): the policy never goes above it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import SEVERITY_ORDER, Finding, Severity, Worth, nature

__all__ = ["SAME_FIX_ON_EVERY_RANK", "RunTime", "Worth", "judge", "judge_as_job", "limit", "severity_for", "worth"]


@dataclass(frozen=True)
class RunTime:
    """The time a finding's worth is measured against, for one rank."""

    #: the rank's mean step as the what-if replays it (the estimates' own baseline), us; None without steps
    mean_step_us: float | None
    #: every step the capture timed (``steps.json``): their count and total wall time; None without it
    run_steps: int | None
    run_wall_us: float | None
    #: the profiled window, us
    window_us: float
    #: each window step's time as the replay reproduces it and each step the capture timed (us): where the window
    #: holds steps unlike the others (an epoch's end), a saving in them counts as often as the run has such steps
    window_steps_us: tuple[float, ...] | None = None
    run_steps_us: tuple[float, ...] | None = None


def _over_the_run(by_step: tuple[float, ...] | None, run: RunTime, ratio: float,
                  min_steps: int) -> tuple[float, str] | None:
    """The saving over the run (us) where the window's or the run's steps are not alike. Steps of ``ratio`` times the
    median or more are outliers (an epoch's end with validation, a checkpoint, workers restarting, a compilation): the
    window's outlier steps stand for the run's, its ordinary steps for the run's ordinary ones, each saving the share
    of those steps' time it saves in the window's (was: the window's saving per step, so an epoch boundary caught in a
    10-step window of a 154-step run counted 15 times, and a window slowed by the profiler saved its own milliseconds
    from the run's shorter steps). Where the window holds no outlier, the run's outliers hold what it does not show
    and count for nothing (was: the window's mean step, so a recurring cost in a 14.5 s run that compilation took
    12.3 s of counted as if the run were all training steps). None where the steps are alike, or the run or the
    saving's place is not known."""
    w, r = run.window_steps_us, run.run_steps_us
    if by_step is None or w is None or r is None or len(w) != len(by_step) or len(w) < min_steps or not r:
        return None
    wa, ra, sa = np.asarray(w, dtype=float), np.asarray(r, dtype=float), np.asarray(by_step, dtype=float)
    out_w = wa >= ratio * float(np.median(wa))
    out_r = ra >= ratio * float(np.median(ra)) if len(ra) >= min_steps else np.zeros(len(ra), bool)
    if out_w.all() or not (out_w.any() or out_r.any()):
        return None

    def share(pick: np.ndarray) -> float:
        time = float(wa[pick].sum())
        return float(sa[pick].sum()) / time if pick.any() and time > 0 else 0.0

    total = share(~out_w) * float(ra[~out_r].sum()) + share(out_w) * float(ra[out_r].sum())
    if not out_w.any():
        return total, (f"the run's time ({len(ra)} steps timed by the capture; the window's steps stand for its "
                       f"{int((~out_r).sum())} ordinary ones, each saving the share of its time the window's save: "
                       f"its {int(out_r.sum())} step(s) of {ratio:g}x its median or more hold what the window does not "
                       "show - a compilation, an evaluation, a start - and count for nothing)")
    return total, (f"the run's time ({len(ra)} steps timed by the capture; the window's {int(out_w.sum())} step(s) of "
                   f"{ratio:g}x its median or more stand for the run's {int(out_r.sum())}, its other "
                   f"{int((~out_w).sum())} for the run's {int((~out_r).sum())}, each saving the share of their time "
                   "the window's save)")


def worth(finding: Finding, run: RunTime, config: AnalysisConfig | None = None) -> Worth:
    """What fixing ``finding`` alone is worth over the run."""
    one_off = finding.one_off_us
    if one_off is not None:
        if run.run_wall_us:
            return Worth(one_off / run.run_wall_us, f"the run's time ({run.run_steps} steps timed by the capture)",
                         "one-off total", one_off)
        return Worth(one_off / run.window_us if run.window_us else None,
                     "the profiled window (the run's length is not known: no step timings beside the trace)",
                     "one-off total", one_off)
    est = finding.estimate
    saving = est.get("saving_us_per_step") if est is not None else None
    if finding.run_cost_us is not None and run.run_wall_us:
        # measured over every step of the run: what the window's steps happened to hold is not the run's rate (was:
        # only with the window's estimate, so a cost the window's steps did not hold was worth nothing however much
        # of the run it took). Whether removing it is a bound is the finding's own, window or not (was: half credit
        # where the window held none of it, full where it held 10 us a step)
        cost, bound = finding.run_cost_us, finding.run_cost_bound == "upper"
        of = f"the run's time ({run.run_steps} steps timed by the capture, measured over each)"
        if finding.run_cost_scaled:
            # the fix removes of the run's cost what its estimate removes of the window's (was: the window's saving
            # per step, spread by the window's steps: a test pass's loader waits in one window step, counted for
            # each of the run's, made a loader worth 31% of a run it waited 22% of)
            steps = len(run.window_steps_us) if run.window_steps_us else None
            if est is not None and saving is not None and steps and finding.impact_us > 0:
                # a fix the replay finds costing more than it saves removes none of it (was: "-18% of it")
                removed = max(0.0, min(1.0, float(saving) * steps / finding.impact_us))
                cost, bound = cost * removed, est.get("bound") == "upper"
                of = (f"the run's time ({run.run_steps} steps timed by the capture, its cost measured over each; "
                      f"the fix removes {removed:.0%} of it, as of the window's)")
            else:
                bound = True  # no estimate: removing all of it is the most a fix gives
        return Worth(cost / run.run_wall_us, of, "upper bound" if bound else "estimate", scope="run")
    events = finding.run_events
    if events is not None and events[0] > 0 and est is not None and saving is not None and run.run_wall_us \
            and run.window_steps_us:
        # a cost paid per event: the window's events stand for the run's (was: the window's rate, so one epoch's
        # restart in a 10-step window counted for every 10 steps of the run)
        total = float(saving) * len(run.window_steps_us) * events[1] / events[0]
        return Worth(total / run.run_wall_us,
                     f"the run's time ({run.run_steps} steps timed by the capture; the window's {events[0]} event(s) "
                     f"stand for the run's {events[1]})", "upper bound" if est.get("bound") == "upper" else "estimate")
    if est is not None and saving is not None and run.run_wall_us and config is not None:
        split = _over_the_run(getattr(est, "saving_by_step_us", None), run, config.outlier_step_ratio,
                              config.outlier_min_steps)
        if split is not None:
            return Worth(split[0] / run.run_wall_us, split[1],
                         "upper bound" if est.get("bound") == "upper" else "estimate")
    if est is not None and saving is not None and run.mean_step_us:
        return Worth(float(saving) / run.mean_step_us, "the rank's mean step time (replayed)",
                     "upper bound" if est.get("bound") == "upper" else "estimate")
    if finding.impact_us > 0 and run.window_us:
        return Worth(finding.impact_us / run.window_us, "the profiled window (worth not estimated: the cost measured)",
                     "measured cost")
    return Worth(None, "nothing measured", "none")


def severity_for(value: Worth, config: AnalysisConfig) -> Severity:
    if value.fraction is None:
        return "info"
    # a bound rather than an estimate (a fix's saving resting on what the trace cannot check in the optimistic
    # direction, or the measured cost itself, which a fix removes at most) counts for part of itself
    bound = value.basis in ("upper bound", "measured cost")
    credited = value.fraction * (config.upper_bound_credit if bound else 1.0)
    if credited < config.severity_warning_min_worth:
        return "info"
    return "critical" if credited >= config.severity_critical_min_worth else "warning"


def _weaker(a: Severity, b: Severity) -> Severity:
    return a if SEVERITY_ORDER[a] >= SEVERITY_ORDER[b] else b


def limit(finding: Finding, ceiling: Severity, reason: str | None = None,
          evidence: dict[str, Any] | None = None) -> Finding:
    """The finding with a ceiling no higher than ``ceiling`` (and why, for its title where it lowers it)."""
    lower = SEVERITY_ORDER[ceiling] > SEVERITY_ORDER[finding.ceiling]
    return replace(finding, ceiling=ceiling if lower else finding.ceiling,
                   ceiling_reason=reason if lower else finding.ceiling_reason,
                   evidence={**finding.evidence, **(evidence or {})})


def judge(finding: Finding, run: RunTime, config: AnalysisConfig) -> Finding:
    """The finding with its severity set by the policy and its worth recorded (``Finding.worth``)."""
    kind = nature(finding.id)
    if kind == "information":
        return replace(finding, severity="info", worth=None)
    if kind == "correctness":
        wanted, value = finding.severity, None
    else:
        value = worth(finding, run, config)
        wanted = severity_for(value, config)
    settled = _settled(finding, wanted, value, config)
    # the run it was judged against, for a pass that judges it again (``report.builder``)
    return replace(settled, extra={**settled.extra, "run_time": run})


def _settled(finding: Finding, wanted: Severity, value: Worth | None, config: AnalysisConfig) -> Finding:
    """The finding at the severity its worth wants, held to its ceiling (the title says why, once), with that worth
    and the advice it calls for; the analyzer's own advice is kept (``extra["advice"]``) for a later judgement."""
    severity = _weaker(wanted, finding.ceiling)
    title = finding.title
    if severity != wanted and finding.ceiling_reason and f"({finding.ceiling_reason})" not in title:
        title = f"{title} ({finding.ceiling_reason})"
    return replace(finding, severity=severity, title=title, recommendation=_advice(finding, value, config),
                   worth=value, extra={**finding.extra, "advice": finding.extra.get("advice", finding.recommendation)})


def _advice(finding: Finding, value: Worth | None, config: AnalysisConfig) -> str:
    """The finding's advice - but a fix the estimate finds worth nothing is not advised: the analyzer's advice for
    that case replaces it (no loop of 'raise num_workers' after more workers gained nothing)."""
    advice = str(finding.extra.get("advice", finding.recommendation))
    no_gain = finding.evidence.get("advice_if_no_gain")
    if (no_gain and value is not None and value.basis in ("estimate", "upper bound")
            and (value.fraction or 0) < config.severity_warning_min_worth):
        return str(no_gain)
    return advice


#: cost findings whose fix is the training script's own, the same on every rank of a data-parallel job: the input
#: pipeline (its workers, its collate) runs alike on each rank
SAME_FIX_ON_EVERY_RANK = frozenset({"loader_stall"})


def judge_as_job(findings: list[Finding], config: AnalysisConfig) -> list[Finding]:
    """Findings of a multi-rank job whose fix is the same change on every rank (``SAME_FIX_ON_EVERY_RANK``), where
    more than one rank holds one, worth what the change is worth to the job: the most any of those ranks' own
    estimates finds. A rank's replay alone keeps its partners as they were, so the time its fix frees goes to waiting
    for them at the next collective; made on every rank, the change frees the rank that holds the job back as well
    (was: each rank alone, so a DDP job whose ranks both wait 13% of the run in a per-item collate had rank 1's loader
    a warning, rank 0's - absorbed by its waits for rank 1 - information)."""
    out = list(findings)
    for fid in SAME_FIX_ON_EVERY_RANK:
        held = [k for k, f in enumerate(out) if f.id == fid and f.rank is not None and f.worth is not None
                and f.worth.fraction is not None]
        if len({out[k].rank for k in held}) < 2:
            continue
        best = max(held, key=lambda k: out[k].worth.fraction or 0.0)  # type: ignore[union-attr]
        top = out[best]
        assert top.worth is not None
        for k in held:
            f = out[k]
            assert f.worth is not None
            if (f.worth.fraction or 0.0) >= (top.worth.fraction or 0.0):  # the best, and any as good
                continue
            value = replace(top.worth, of=f"{top.worth.of}, as rank {top.rank}'s: the same change on every rank "
                                          "frees the job's steps as it frees that rank's")
            out[k] = replace(_settled(f, severity_for(value, config), value, config),
                             evidence={**f.evidence, "worth_as_rank": top.rank,
                                       "own_worth_fraction": round(float(f.worth.fraction or 0.0), 4)})
    return out
