"""``kinetoscope diff`` as text: formats ``analyze.compare.Diff``, computes nothing."""

from __future__ import annotations

from typing import Any

from kinetoscope.analyze.report.compare import Diff, Gate, StepChange, StepSide


def _ms(us: float | None) -> str:
    return "n/a" if us is None or us != us else f"{us / 1000:,.2f} ms"


def _missing(value: Any) -> bool:
    return value is None or value != value


def interval(c: StepChange) -> str:
    return f"95% CI {c.ci_low:+.1%} to {c.ci_high:+.1%}" if c.ci_low is not None else "no interval"


def headline(c: StepChange) -> str:
    """'slower: +12.0% (95% CI +10.3% to +13.7%), 14.00 -> 15.68 ms per step'"""
    if c.change is None:
        return "not comparable (no step time in one of the runs)"
    if c.statistic == "window":
        return (f"{c.verdict}: {c.change:+.1%} (no steps: one window a run, no interval), "
                f"{_ms(c.before.stats.mean_us)} -> {_ms(c.after.stats.mean_us)} (the windows' lengths)")
    why = "" if c.ci_low is not None else ": fewer than 2 batches a run"
    return (f"{c.verdict}: {c.change:+.1%} ({interval(c)}{why}), {_ms(c.before.stats.mean_us)} -> "
            f"{_ms(c.after.stats.mean_us)} per step")


def _side(name: str, s: StepSide) -> str:
    n = s.stats.steps
    if s.source == "capture":
        what = (f"{n} steps timed by the capture after the first ({_ms(s.first_step_us)}, start-up, left out), "
                f"{s.profiled_steps} of them profiled")
    elif s.source == "profiled":
        what = f"{n} profiled step{'s' if n != 1 else ''} (the trace's complete steps)"
    else:
        what = "the window"
    period = (f"repeats every {s.stats.period_steps} steps" if s.stats.period_steps > 1 else "no period found")
    batches = (f"{s.stats.batches} batches of {s.stats.batch_steps} step{'s' if s.stats.batch_steps != 1 else ''}"
               if s.stats.batches >= 2 else "fewer than 2 batches")
    return f"{name} (rank {s.rank}): {what}; {period}; {batches}"


def step_lines(c: StepChange) -> list[str]:
    out = [f"Time per step: {headline(c)}"]
    if c.change is None:
        return out
    if c.statistic == "mean":
        out.append("  the mean step (each run's step time over its steps: what the run's length follows)")
    for name, side in (("before", c.before), ("after", c.after)):
        out.append(f"  {_side(name, side)}")
    if c.ci_low is not None and c.statistic == "mean":
        periods = max(c.before.stats.period_steps, c.after.stats.period_steps) > 1
        out.append(f"  interval: from batch means{' of whole periods' if periods else ''}, Student t (Welch)"
                   + (": over the profiled steps only (no steps.json), few steps, a wide interval"
                      if c.few_steps else ""))
    if c.median_change is not None:
        if c.median_agrees:
            out.append(f"  median step {c.median_change:+.1%}: says the same (inside the mean's interval)")
        elif c.median_agrees is False:
            out.append(f"  median step {c.median_change:+.1%}: not used, it disagrees with the mean (outside its "
                       "interval): steps come in bursts or periods, and the median follows the typical step, "
                       "not the run's length")
        else:
            out.append(f"  median step {c.median_change:+.1%}: not used (no interval to check it against)")
    if len(c.ranks) > 1:
        out.append(f"  the job's time per step is its slowest rank's, since ranks wait for each other: rank "
                   f"{c.before.rank} before, rank {c.after.rank} after")
        for r in c.ranks:
            out.append(f"    rank {r.rank}: {headline(r)}")
    return out


def gate_line(g: Gate, c: StepChange) -> str:
    """The gate's outcome as a plain statement (a pass is not an error)."""
    limit = f"{g.max_regression:.1%}"
    if g.basis == "interval":
        if g.regressed:
            return (f"Gate --max-regression {limit}: failed: the time per step grew {c.change:+.1%} ({interval(c)}), "
                    f"above {limit} with 95% confidence")
        return (f"Gate --max-regression {limit}: passed: {c.change:+.1%} ({interval(c)}) is not above {limit} with "
                "95% confidence")
    value = "n/a" if c.change is None else f"{c.change:+.1%}"
    state = "failed" if g.regressed else "passed"
    return (f"Gate --max-regression {limit}: {state}: {value} (no interval), "
            f"{'above' if g.regressed else 'not above'} {limit}")


def render_diff(d: Diff) -> str:
    out = [f"Kinetoscope diff: {d.before} -> {d.after}", ""]
    out += step_lines(d.step_change)
    if d.gate is not None:
        out.append(gate_line(d.gate, d.step_change))
    out.append("")

    def number(value: Any, metric: str) -> str:
        if _missing(value):
            return "n/a"
        return f"{value:.1%}" if "fraction" in metric else f"{value:,.1f}"

    out.append(f"The profiled window of rank {d.metrics_rank} (each run's report):" if d.metrics_rank is not None
               else "The profiled window (each run's report):")
    for r in d.metrics.itertuples():
        if number(r.before, "") == "n/a" and number(r.after, "") == "n/a":
            continue
        change = "" if _missing(r.change) else f"{r.change:+.1%}"
        verdict = {True: "better", False: "worse"}.get(r.better, "")
        out.append(
            f"  {r.metric:<40} {number(r.before, r.metric):>14} -> "
            f"{number(r.after, r.metric):<14} {change:>8} {verdict}"
        )
    if len(d.findings):
        out.append("")
        out.append("Findings (measured cost: time per step of the profiled window, or memory growth per step):")
        for f in d.findings.itertuples():
            out.append(f"  {f.status:<12} rank {f.rank}: {f.title} ({f.id}){_cost(f)}")
    if len(d.fixes):
        out.append("")
        out.append("Findings gone: the step time their fix was predicted to give, and what was measured (mean step):")
        for x in d.fixes.itertuples():
            pred = "not estimated" if _missing(x.predicted_step_us) else (
                f"predicted {x.predicted_step_us / 1000:,.2f} ms ({x.predicted_change:+.1%})")
            meas = (
                "n/a"
                if _missing(x.measured_step_us)
                else f"{x.measured_step_us / 1000:,.2f} ms ({x.measured_change:+.1%})"
            )
            err = "" if _missing(x.error) else f", off by {x.error:+.1%}"
            out.append(f"  rank {x.rank} {x.id}: {pred}; measured {meas}{err}")
    for label, table in (("GPU kernels", d.kernels), ("CPU ops", d.ops)):
        if len(table):
            out.append("")
            out.append(f"{label} whose time per step changed most (us per step):")
            for k in table.itertuples():
                out.append(
                    f"  {k.change_us_per_step:+12.1f}  {k.before_us_per_step:12.1f} -> "
                    f"{k.after_us_per_step:<12.1f} {k.name[:90]}"
                )
    return "\n".join(out) + "\n"


def _cost(f: Any) -> str:
    """': 3.20 -> 2.10 ms per step (-1.10 ms)' for a finding in both runs; one side where it is in one."""
    def mib(v: Any) -> str:
        return f"{v / 2**20:,.1f} MiB"

    tb, ta = f.before_us_per_step, f.after_us_per_step
    if not (_missing(tb) and _missing(ta)):
        if f.status == "still there" and not _missing(tb) and not _missing(ta):
            return f": {_ms(tb)} -> {_ms(ta)} per step ({(ta - tb) / 1000:+,.2f} ms)"
        return f": {_ms(ta if _missing(tb) else tb)} per step"
    gb, ga = f.before_bytes_per_step, f.after_bytes_per_step
    if not (_missing(gb) and _missing(ga)):
        if f.status == "still there" and not _missing(gb) and not _missing(ga):
            return f": grows {mib(gb)} -> {mib(ga)} per step"
        return f": grows {mib(ga if _missing(gb) else gb)} per step"
    return ""
