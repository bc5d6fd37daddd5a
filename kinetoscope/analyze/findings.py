"""Findings: what is wrong, the numbers that show it, and what to do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["critical", "warning", "info"]
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

#: Stable ids a report may contain. Adding one is fine; renaming one breaks users.
FINDING_IDS = (
    "loader_stall",
    "gpu_idle",
    "h2d_pageable",
    "h2d_not_overlapped",
    "sync_point",
    "memory_growth",
    "launch_bound",
    "straggler",
    "zero_grad_missing",
    "optimizer_step_mismatch",
    "no_backward",
    "sync_in_loop",
    "worker_respawn",
    "recompile",
    "gpu_activity_missing",
    "memory_inconclusive",
    "reserved_memory_growth",
)


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    rank: int | None
    title: str
    evidence: dict[str, Any]
    recommendation: str
    #: estimated time this problem costs inside the window (for ranking), us
    impact_us: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: what fixing it is worth (``whatif.estimate``): the rank's mean step after this fix alone; None where
    #: it cannot be estimated
    estimate: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.id not in FINDING_IDS:
            raise ValueError(f"unknown finding id {self.id!r}")
        if self.severity not in SEVERITY_ORDER:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "rank": self.rank,
            "title": self.title,
            "evidence": self.evidence,
            "recommendation": self.recommendation,
            "impact_us": round(self.impact_us, 3),
            "estimate": self.estimate,
        }


def saving_us(f: Finding) -> float:
    """What fixing it saves per step (us); -1 where not estimated (after every estimated one)."""
    value = (f.estimate or {}).get("saving_us_per_step")
    return float(value) if value is not None else -1.0


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then the largest saving per step from fixing it, then the largest measured cost."""
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], -saving_us(f), -f.impact_us, f.rank or 0, f.id))
