"""What a fix is worth, as an ``Estimate``: one finding's fix alone, several together (one replay: the gains do not
simply add), and the replay of the unchanged steps against the measured ones."""


from __future__ import annotations

from typing import Any

import numpy as np

from kinetoscope.analyze.model.config import DEFAULT_CONFIG
from kinetoscope.analyze.model.estimate import Estimate
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.whatif.fixes import FIXES, Plan, edited_by, params_for, plan_for
from kinetoscope.analyze.whatif.graph import replay_graph
from kinetoscope.analyze.whatif.replay import Edits, Replayed, apply, baseline


def estimate(trace: RankTrace, finding: Finding, params: dict[str, Any] | None = None) -> Estimate | None:
    """The rank's mean step after this fix alone; None where it cannot be estimated."""
    g = replay_graph(trace)
    if not g.steps:
        return None
    base = baseline(trace)
    fix = FIXES.get(finding.id)
    if fix is not None and fix.no_time_cost is not None:
        return Estimate.of(base.mean_step_ns, base.mean_step_ns, "none", (fix.no_time_cost,),
                           steps_to_out_of_memory=finding.evidence.get("steps_to_out_of_memory"))
    if finding.one_off_us is not None:
        return _one_off(trace, base.mean_step_ns, g.steps, finding.one_off_us)
    plan = plan_for(trace, g, finding, params)
    if plan is None:
        return None
    plan, after = _worth_more(trace, g, base, plan)
    return Estimate.of(base.mean_step_ns, after.mean_step_ns, plan.method, plan.assumptions,
                       details={k: v for k, v in plan.extra.items() if v is not None}, bound=plan.bound,
                       saving_by_step_us=_by_step(base, after, plan))


def _worth_more(trace: RankTrace, g: Any, base: Replayed, plan: Plan) -> tuple[Plan, Replayed]:
    """Of a plan and its alternative (two fixes of one finding: a batch built at once, or a worker on a free core),
    the one worth more as the severity policy credits it (a bound at ``upper_bound_credit`` of itself), with its
    replay."""
    after = apply(trace, g, plan.edits)
    if plan.alternative is None:
        return plan, after
    other = apply(trace, g, plan.alternative.edits)

    def credited(p: Plan, r: Replayed) -> float:
        return (base.mean_step_ns - r.mean_step_ns) * (DEFAULT_CONFIG.upper_bound_credit if p.bound == "upper" else 1.0)

    return (plan.alternative, other) if credited(plan.alternative, other) > credited(plan, after) else (plan, after)


def _by_step(base: Replayed, after: Replayed, plan: Plan) -> tuple[float, ...] | None:
    """Where in the window the saving lies (us per window step, summing to the mean saving times the steps): the
    replay's own per-step host saving, scaled to the mean saving (a GPU-bound step saves less than its host part),
    plus the analytic savings in the steps the plan names (else spread evenly)."""
    n = len(base.step_ns)
    if n == 0 or len(after.step_ns) != n:
        return None
    analytic = float(sum(plan.edits.analytic_ns.values()))
    total = (base.mean_step_ns - after.mean_step_ns) * n
    placed = np.zeros(n)
    if analytic > 0:
        weights = np.asarray(plan.analytic_weights or (), dtype=float)
        if len(weights) == n and weights.sum() > 0:
            placed += analytic * n * weights / weights.sum()
        else:
            placed[:] = analytic
    rest = total - float(placed.sum())
    host = np.maximum(base.step_ns - after.step_ns, 0.0)
    if host.sum() > 0:
        placed += host * (rest / float(host.sum()))
    else:
        placed += rest / n
    return tuple(round(float(x) / 1000.0, 3) for x in placed)


def _one_off(trace: RankTrace, mean_step_ns: float, window_steps: int, total_us: float) -> Estimate:
    """A cost paid once (a first compilation of a shape): what it is worth per step over every step the capture
    timed, against those steps' mean (else over the profiled steps and their mean, said so), beside its total. Was:
    against the window's mean step, so a restart worth 13% of the run read "5.1%" beside a warning judged on the
    run (the window held the epoch's end: a mean step 2.6x the run's)."""
    rs = trace.run_steps
    timed = int(len(rs)) if rs is not None and len(rs) else 0
    steps = timed or max(window_steps, 1)
    over = f"the {steps} steps timed by the capture" if timed else \
        f"the {steps} profiled steps (the run's length is not known: no step timings beside the trace)"
    if timed and rs is not None:
        wall = float(rs["wall_ns"].sum())
        mean_step_ns = wall / timed if wall > 0 else mean_step_ns
    return Estimate.of(mean_step_ns, mean_step_ns - total_us * 1000 / steps, "one-off",
                       (f"a one-off cost of {total_us / 1000:,.1f} ms in all, amortised over {over}",),
                       one_off_total_us=round(total_us, 3), amortised_over_steps=steps)


def replay_entry(trace: RankTrace) -> dict[str, Any] | None:
    """The rank's replayed mean step against the measured one (the replay's error on unchanged input)."""
    g = replay_graph(trace)
    measured = g.measured_step_ns
    if not measured:
        return None
    r = baseline(trace)
    return {"step_us": round(r.mean_step_ns / 1000, 3), "measured_step_us": round(measured / 1000, 3),
            "error": round(abs(r.mean_step_ns - measured) / measured, 4), "error_of": "measured mean step time",
            "steps": g.steps, "host_items": int(len(g.it_start)), "gpu_ops": int(len(g.op_start))}


def combined(
    trace: RankTrace, findings: list[Finding], params: dict[str, dict[str, Any]] | None = None
) -> Estimate | None:
    """The rank's mean step with several fixes at once (one replay: the gains do not simply add)."""
    g = replay_graph(trace)
    if not g.steps:
        return None
    edits, methods, assumptions, seen = Edits(), [], [], set()
    base = baseline(trace)
    # named fixes before those that stand for one of them (gpu_idle)
    for f in sorted(findings, key=lambda f: bool(f.id in FIXES and FIXES[f.id].stands_for)):
        plan = plan_for(trace, g, f, params_for(f.id, params))
        if plan is None:
            continue
        if plan.alternative is not None:
            plan, _ = _worth_more(trace, g, base, plan)
        what = edited_by(f, plan)
        if what in seen:
            continue
        seen.add(what)
        edits = edits.merge(plan.edits)
        methods.append(f"{f.id}: {plan.method}")
        assumptions += list(plan.assumptions)
    after = apply(trace, g, edits)
    return Estimate.of(base.mean_step_ns, after.mean_step_ns, "; ".join(methods) or "none",
                       tuple(assumptions))
