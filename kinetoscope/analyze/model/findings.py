"""Findings: what is wrong, the numbers that show it, and what to do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kinetoscope.analyze.model.estimate import Estimate

Severity = Literal["critical", "warning", "info"]
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

Nature = Literal["cost", "correctness", "information"]

#: what each finding id is, in one place: a time cost (its severity follows its worth), a correctness problem (its
#: analyzer's own rule), or information (always info); see ``policy``
NATURE: dict[str, Nature] = {  # the report's finding ids, each once
    "loader_stall": "cost",
    "gpu_idle": "cost",
    "h2d_pageable": "cost",
    "h2d_not_overlapped": "cost",
    "sync_point": "cost",
    "sync_in_loop": "cost",
    "launch_bound": "cost",
    "straggler": "cost",
    "worker_respawn": "cost",
    "recompile": "cost",
    "exposed_comm": "cost",
    "pipeline_bubble": "cost",
    "allocator_churn": "cost",
    "host_oversubscribed": "cost",
    "low_matrix_efficiency": "cost",
    "memory_growth": "correctness",
    "reserved_memory_growth": "correctness",
    "zero_grad_missing": "correctness",
    "optimizer_step_mismatch": "correctness",
    "no_backward": "correctness",
    "hang": "correctness",
    "gpu_activity_missing": "information",
    "memory_inconclusive": "information",
    "outlier_steps": "information",
    "accelerator_unread": "information",
    "training_in_children": "information",
}


#: Stable ids a report may contain. Adding one is fine; renaming one breaks users.
FINDING_IDS = tuple(NATURE)


def nature(finding_id: str) -> Nature:
    return NATURE[finding_id]


@dataclass(frozen=True)
class Worth:
    """What fixing a finding is worth, as a share of the time it is measured against (set by the severity policy,
    ``report.policy.worth``). The report's ``worth`` object rounds ``fraction`` to 4 places."""

    #: the saving over what ``of`` names; None where nothing was measured
    fraction: float | None
    #: what ``fraction`` is a share of
    of: str
    #: "estimate" (the what-if's saving per step), "upper bound" (an estimate optimistic by what the trace cannot
    #: check), "one-off total" (a cost paid once, over the run), "measured cost" (no estimate: the cost the analyzer
    #: measured in the window), "none"
    basis: str
    #: a one-off cost's total, us; None for a recurring cost
    one_off_total_us: float | None = None
    #: "run" where ``fraction`` is a cost the capture measured over every step of the run (not the window's estimate
    #: scaled: the window may hold little or none of it, and the estimate then says less); None otherwise
    scope: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fraction": None if self.fraction is None else round(self.fraction, 4),
                               "of": self.of, "basis": self.basis}
        if self.one_off_total_us is not None:
            out["one_off_total_us"] = round(self.one_off_total_us, 3)
        if self.scope is not None:
            out["scope"] = self.scope
        return out


@dataclass(frozen=True)
class Finding:
    id: str
    rank: int | None
    title: str
    evidence: dict[str, Any]
    recommendation: str
    #: set by the severity policy (``policy.judge``) for cost and information findings; a correctness finding's
    #: analyzer sets it by its own rule
    severity: Severity = "info"
    #: estimated time this problem costs inside the window (for ranking), us
    impact_us: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: what fixing it is worth (``whatif.estimate``): the rank's mean step after this fix alone; None where
    #: it cannot be estimated
    estimate: Estimate | None = None
    #: the strongest severity the evidence supports, whatever the finding is worth (a window filled by start-up,
    #: steps inferred rather than marked, a step cut short): the severity policy never goes above it
    ceiling: Severity = "critical"
    #: why the ceiling is below critical, added to the title where it lowers the finding (None: the title says it)
    ceiling_reason: str | None = None
    #: a cost paid once rather than every step (a recompile, a worker start), in total over the window, us: its
    #: worth is amortised over the run (``policy.worth``); None for a recurring cost
    one_off_us: float | None = None
    #: a recurring cost the capture measured over every step of the run (``steps.json``), in total, us: its worth is
    #: that over the run's time rather than the window's rate (``policy.worth``); None where only the window shows it
    run_cost_us: float | None = None
    #: whether removing ``run_cost_us`` is only a bound on what a fix gives ("upper": host time lost on a rank with
    #: device work may have hidden behind the device's) - the same whether or not the window held any of it to estimate
    run_cost_bound: str | None = None
    #: whether a fix removes only part of ``run_cost_us``: the share its estimate removes of the window's measured
    #: cost (``impact_us``; a loader's waits, of which a batch indexed at once leaves the collate's copy)
    run_cost_scaled: bool = False
    #: a cost paid per event (a DataLoader iterator restarting its workers), as (events in the window, events over
    #: the run as the capture counted them): the window's saving stands for the run's events, over the run's time
    #: (``policy.worth``); None where the run's count is not known
    run_events: tuple[int, int] | None = None
    #: what fixing it is worth over the run, set by the severity policy; None for findings whose worth is not time
    #: (correctness, information)
    worth: Worth | None = None

    def __post_init__(self) -> None:
        if self.id not in FINDING_IDS:
            raise ValueError(f"unknown finding id {self.id!r}")
        for value in (self.severity, self.ceiling):
            if value not in SEVERITY_ORDER:
                raise ValueError(f"unknown severity {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "nature": nature(self.id),
            "rank": self.rank,
            "title": self.title,
            "evidence": self.evidence,
            "recommendation": self.recommendation,
            "impact_us": round(self.impact_us, 3),
            "estimate": dict(self.estimate) if self.estimate is not None else None,  # an Estimate's JSON object
            "worth": self.worth.to_dict() if self.worth is not None else None,
        }


def saving_us(f: Finding) -> float:
    """What fixing it saves per step (us); -1 where not estimated (after every estimated one)."""
    value = f.estimate.get("saving_us_per_step") if f.estimate is not None else None
    return float(value) if value is not None else -1.0


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first (a hang before all: the job stopped), then the largest saving per step from fixing it, then the
    largest measured cost."""
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.id != "hang", -saving_us(f), -f.impact_us,
                                           f.rank or 0, f.id))
