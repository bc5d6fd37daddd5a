"""A rank's costs once the job's matched collectives are known (the report applies these after the job-level
analysis): what overlap could hide is the exposure less the rank's waiting for later ranks, and a rank's run-queue
loss hides behind its waits for later ranks that are not starved themselves."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kinetoscope.analyze.model.collectives import comm_fix, sharding_said
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.estimate import Estimate
from kinetoscope.analyze.model.findings import Finding


def without_waits(finding: Finding, wait_us: float, config: AnalysisConfig, shared_us: float = 0.0) -> Finding:
    """A rank's exposed communication less what the job's matched collectives show it spent waiting for later ranks
    beyond ``shared_us``, the wait every rank of the job has inside a step (one rank's trace cannot tell a
    collective's wait from its transfer; the matching across ranks can): what overlap could hide is the rest. Its
    estimate (the exposed time per step, measured) scales with it: no view of the rank is needed again, so a job whose
    ranks' views were dropped keeps them dropped. On a CPU run whose estimate the cores' free share bounds
    (``fixes.cpu_room``), that bound stays: the wait every rank has inside a step is not added to it (was: added,
    "overlapped, a rank that waited computes on the core it waited on", so a DDP job of 2 ranks on 2 CPUs whose
    ranks fill the host was told overlap was worth 12% of its step; the readers of the forty-first to forty-seventh
    sets, seven sets, all read such jobs' exposure as worth ~0 with no core free - in DDP the last bucket's wait has no
    compute left to hide behind). With nothing to change, the finding is returned as it was (the same object)."""
    ev = dict(finding.evidence)
    before = float(ev.get("exposed_us") or 0)
    all_wait = float(wait_us)
    wait_us = max(all_wait - float(shared_us), 0.0)
    estimate = finding.estimate
    details = dict(estimate.details) if estimate is not None else {}
    per_step, room = details.get("exposed_us_per_step"), details.get("cpu_room_us_per_step")
    # the estimate the CPUs' free share bounds (a CPU run's): (exposed time per step, free share per step)
    bound = (float(per_step), float(room)) if estimate is not None and isinstance(per_step, (int, float)) \
        and isinstance(room, (int, float)) else None
    if wait_us <= 0:
        return finding
    exposed = max(before - wait_us, 0.0)
    keep = exposed / before if before > 0 else 0.0
    if estimate is not None and "sharding_us_per_step" in details and "exposed_us_per_step" in details:
        estimate, details = _replicate_or_overlap(estimate, details, ev, keep, wait_us)
    elif estimate is not None and bound is not None:
        left = bound[0] * keep
        cap = bound[1]
        saving = min(left, cap)
        details["exposed_us_per_step"] = round(left, 3)
        if left < cap:
            details.pop("limited_by", None)  # the exposure left, not the cores, decides it now
        note = (f"its {wait_us / 1000:,.2f} ms of waiting for other ranks in the window is not exposure overlap can "
                "hide (it is the late ranks' cost)")
        estimate = replace(_with_saving(estimate, saving, note), details=details)
    elif estimate is not None and before > 0:
        estimate = _scaled(estimate, keep, f"its {wait_us / 1000:,.2f} ms of waiting for other ranks in "
                           "the window is not exposure overlap can hide (it is the late ranks' cost)")
    window = float(ev.get("window_us") or 0)
    if all_wait > wait_us:  # the part every rank waits (lateness moving between ranks in a step) stays in the exposure
        ev["waiting_every_rank_does_us"] = round(all_wait - wait_us, 3)
    ev.update({"exposed_including_waits_us": ev.get("exposed_us"), "waiting_for_other_ranks_us": round(wait_us, 3),
               "exposed_us": round(exposed, 3),
               "exposed_fraction_of_window": exposed / window if window else None})
    title = (f"Communication not overlapped with compute takes {exposed / window:.0%} of the {window / 1000:.1f} ms "
             f"window once its {wait_us / 1000:,.2f} ms waiting for other ranks is left out (collectives matched "
             "across the job" + (f"; the {(all_wait - wait_us) / 1000:,.2f} ms every rank waits stays in"
                                 if all_wait > wait_us else "") + ")" + sharding_said(ev) if window
             else finding.title)
    return replace(finding, evidence=ev, title=title, impact_us=exposed, estimate=estimate, worth=None,
                   severity="info")


def _replicate_or_overlap(estimate: Estimate, details: dict[str, Any], ev: dict[str, Any], keep: float,
                          wait_us: float) -> tuple[Estimate, dict[str, Any]]:
    """An FSDP2 rank's two fixes chosen again (``comm_fix``) once its waits for later ranks are known: overlap keeps
    ``keep`` of its exposure, replicating loses the waits; the one worth more comes with its own method, bound and
    assumptions."""
    exposed = float(details["exposed_us_per_step"]) * keep
    room = details.get("cpu_room_us_per_step")
    waits = wait_us / (int(ev.get("steps") or 0) or 1)
    sharding = float(details["sharding_us_per_step"])
    fix = comm_fix(exposed, float(room) if isinstance(room, (int, float)) else None, details.get("overlap_limited_by"),
                   sharding, waits, str(ev.get("replicate_why")))
    details.update(exposed_us_per_step=round(exposed, 3), replicate_us_per_step=round(max(sharding - waits, 0.0), 3))
    if fix.limited_by is not None:
        details["limited_by"] = fix.limited_by
    else:
        details.pop("limited_by", None)
    note = (f"its {wait_us / 1000:,.2f} ms of waiting for other ranks in the window would stay, replicated: DDP's "
            "all-reduce waits for late ranks as FSDP's collectives do" if fix.bound is None else
            f"its {wait_us / 1000:,.2f} ms of waiting for other ranks in the window is not exposure overlap can hide "
            "(it is the late ranks' cost)")
    chosen = replace(estimate, method=fix.method, bound=fix.bound, assumptions=fix.assumptions)
    return replace(_with_saving(chosen, fix.saving, note), details=details), details


def runqueue_less_waits(finding: Finding, wait_us: float, shared_us: float = 0.0) -> Finding:
    """A rank's run-queue wait (``host_oversubscribed``, measured) less what its waits for later ranks beyond
    ``shared_us`` hide, where those ranks do not lose time to the run queue themselves (the caller's test): in a
    synchronous job a rank that loses time while the others are late for another reason (rank 0 evaluating alone)
    makes no step longer (was: a DDP rank waiting 417 ms in its window for rank 0's evaluation was told to fix 5% of
    its run lost on the run queue; both readers: worth little to the job). The window's share of the loss its waits
    cover is taken off the run's too. With nothing to take off, the finding is returned as it was."""
    beyond = max(float(wait_us) - float(shared_us), 0.0)
    lost = float(finding.evidence.get("lost_us") or 0.0)
    if beyond <= 0 or lost <= 0:
        return finding
    keep = max(lost - beyond, 0.0) / lost
    estimate = finding.estimate
    if estimate is not None:
        estimate = _scaled(estimate, keep, f"its {beyond / 1000:,.2f} ms of waiting for later ranks in the window, "
                           "which lose no time to the run queue themselves, hides as much of the time it lost")
    ev = {**finding.evidence, "waiting_for_other_ranks_us": round(beyond, 3),
          "not_hidden_by_waits_fraction": round(keep, 4)}
    title = (f"{finding.title}; its {beyond / 1000:,.1f} ms of waiting for later ranks in the window hides "
             f"{1 - keep:.0%} of it")
    run_cost = finding.run_cost_us * keep if finding.run_cost_us is not None else None
    return replace(finding, evidence=ev, title=title, impact_us=finding.impact_us * keep, estimate=estimate,
                   run_cost_us=run_cost, worth=None, severity="info")


def _scaled(estimate: Estimate, keep: float, assumption: str) -> Estimate:
    """``estimate`` with its saving (and where it lies) times ``keep``, the mean step before unchanged."""
    by_step = estimate.saving_by_step_us
    return _saving_of(estimate, float(estimate.saving_us_per_step) * keep,
                      tuple(x * keep for x in by_step) if by_step else None, assumption)


def _with_saving(estimate: Estimate, saving: float, assumption: str) -> Estimate:
    """``estimate`` saving ``saving`` us a step, the mean step before unchanged; where it lies, as before (evenly where
    it saved nothing before)."""
    old = float(estimate.saving_us_per_step)
    if old > 0:
        return _scaled(estimate, saving / old, assumption)
    by_step = estimate.saving_by_step_us
    return _saving_of(estimate, saving, tuple(saving for _ in by_step) if by_step else None, assumption)


def _saving_of(estimate: Estimate, saving: float, by_step: tuple[float, ...] | None, assumption: str) -> Estimate:
    """``estimate`` saving ``saving`` us a step, placed by step as ``by_step``, the mean step before unchanged."""
    mean = float(estimate.step_us_after) + float(estimate.saving_us_per_step)
    return replace(estimate, step_us_after=round(mean - saving, 3), saving_us_per_step=round(saving, 3),
                   saving_fraction=round(saving / mean, 4) if mean > 0 else None, saving_by_step_us=by_step,
                   assumptions=(*estimate.assumptions, assumption))
