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

from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import SEVERITY_ORDER, Finding, Severity, Worth, nature

__all__ = ["RunTime", "Worth", "judge", "limit", "severity_for", "worth"]


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


def worth(finding: Finding, run: RunTime) -> Worth:
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
    if finding.run_cost_us is not None and run.run_wall_us and est is not None and saving is not None:
        # measured over every step of the run: what the window's steps happened to hold is not the run's rate
        return Worth(finding.run_cost_us / run.run_wall_us,
                     f"the run's time ({run.run_steps} steps timed by the capture, measured over each)",
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
        value = worth(finding, run)
        wanted = severity_for(value, config)
    severity = _weaker(wanted, finding.ceiling)
    title = finding.title
    if severity != wanted and finding.ceiling_reason:
        title = f"{title} ({finding.ceiling_reason})"
    advice = finding.recommendation
    # a fix the estimate finds worth nothing is not advised: the analyzer's advice for that case replaces it (no
    # loop of 'raise num_workers' after more workers gained nothing)
    no_gain = finding.evidence.get("advice_if_no_gain")
    if (no_gain and value is not None and value.basis in ("estimate", "upper bound")
            and (value.fraction or 0) < config.severity_warning_min_worth):
        advice = str(no_gain)
    return replace(finding, severity=severity, title=title, recommendation=advice,
                   worth=value)
