"""Steps that are not like the others: a validation pass, a checkpoint, a compilation inside the window.

Statistics over a window assume its steps are alike. A step several times the median is something else, and says
what where it can: the capture's marks name validation, checkpoints and compilation exactly (``kinetoscope::*``
spans); a trace from elsewhere is read for compilation (torch.compile's spans) and for a step without a backward
pass among steps with one (evaluation), and otherwise the step is an outlier of unknown cause.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.phases import phase_events
from kinetoscope.analyze.model.results import Outliers, OutliersResult
from kinetoscope.analyze.model.timeline import COMPILE_RE, name_mask
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import us

#: the capture's marks of what the loop did, by what they make a step
_MARKS = (("validation", re.compile(r"^kinetoscope::validation$")),
          ("checkpoint", re.compile(r"^kinetoscope::checkpoint$")),
          ("compile", re.compile(r"^kinetoscope::compile$")))


def _spans(trace: RankTrace, pattern: re.Pattern[str]) -> iv.Intervals:
    ev = trace.events
    hit = ev[name_mask(ev, pattern)]
    return iv.union(hit["ts_ns"].to_numpy(), hit["end_ns"].to_numpy())


def _what(trace: RankTrace, start: int, end: int, has_backward: np.ndarray, i: int,
          marks: dict[str, iv.Intervals], compile_spans: iv.Intervals) -> tuple[str, str, int | None]:
    """(what the step holds, how that is known, ns of it inside the step)."""
    s, e = np.array([start]), np.array([end])
    for kind, spans in marks.items():
        inside = int(iv.overlap_each(s, e, spans)[0])
        if inside:
            return kind, "capture marks", inside
    inside = int(iv.overlap_each(s, e, compile_spans)[0])
    if inside:
        return "compile", "torch.compile's spans", inside
    if not has_backward[i] and has_backward.sum() >= max(2, len(has_backward) // 2):
        return "evaluation", "no backward pass, among steps with one (inferred)", None
    return "unknown", "nothing in the trace names it", None


def run_periodic(trace: RankTrace) -> dict[str, Any] | None:
    """Validation and checkpoints over the whole run, from the capture's step timings: how many steps held them,
    every how many steps, their time and share of the run; None where not recorded."""
    rs = trace.run_steps
    if rs is None or rs.empty:
        return None
    wall = float(rs["wall_ns"].sum())
    out: dict[str, Any] = {}
    for kind in ("validation", "checkpoint"):
        col = f"{kind}_ns"
        if col not in rs or rs[col].isna().all():
            continue
        values = rs[col].astype(float).fillna(0).to_numpy()
        held = np.flatnonzero(values > 0)
        gaps = np.diff(rs["step"].to_numpy()[held])
        out[kind] = {"steps_with": int(len(held)), "total_us": us(values.sum()),
                     "fraction_of_run": round(float(values.sum() / wall), 4) if wall else None,
                     "every_steps": int(np.median(gaps)) if len(gaps) else None,
                     "mean_us": us(values[held].mean()) if len(held) else None}
    return out or None


def _periodic_finding(trace: RankTrace, config: AnalysisConfig, periodic: dict[str, Any]) -> Finding | None:
    parts = []
    for kind, v in periodic.items():
        if v["fraction_of_run"] is not None and v["fraction_of_run"] >= config.periodic_min_fraction:
            every = f"every {v['every_steps']} steps, " if v["every_steps"] else ""
            parts.append(f"{kind} {every}{v['steps_with']} time(s), {v['mean_us'] / 1000:,.1f} ms each: "
                         f"{v['fraction_of_run']:.0%} of the run")
    if not parts:
        return None
    return Finding(
        id="outlier_steps", rank=trace.rank,
        title="Outside the training steps' own work, the run spends time on " + "; ".join(parts),
        evidence={"run": periodic},
        recommendation=("This time is part of the run, not of a training step (the capture told them apart): weigh "
                        "how often it runs and on how many batches against what it costs."),
    )


@register("outliers", "Steps unlike the others")
def analyze_outliers(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Steps at least ``outlier_step_ratio`` times the median step, and what each one holds; validation and
    checkpoints over the whole run where the capture recorded them."""
    steps = trace.steps
    if "partial" in steps:
        steps = steps[~steps["partial"].to_numpy()]
    periodic = run_periodic(trace)
    run_finding = _periodic_finding(trace, config, periodic) if periodic else None
    if len(steps) < config.outlier_min_steps:
        return AnalysisResult(key="outliers",
                              metrics=OutliersResult(outliers=Outliers(run=periodic) if periodic else None),
                              findings=(run_finding,) if run_finding else ())
    dur = steps["dur_ns"].to_numpy()
    median = float(np.median(dur))
    out = np.flatnonzero(dur >= config.outlier_step_ratio * median)
    metrics = Outliers(median_step_us=us(median), steps=int(len(steps)), outlier_steps=int(len(out)),
                       ratio=config.outlier_step_ratio, run=periodic)
    if not len(out):
        return AnalysisResult(key="outliers", metrics=OutliersResult(outliers=metrics),
                              findings=(run_finding,) if run_finding else ())
    starts, ends = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    bwd = phase_events(trace)["backward"]
    bwd_spans = iv.union(bwd["ts_ns"].to_numpy(), bwd["end_ns"].to_numpy())
    has_backward = iv.overlap_each(starts, ends, bwd_spans) > 0
    marks = {kind: _spans(trace, pattern) for kind, pattern in _MARKS}
    compile_spans = _spans(trace, COMPILE_RE)
    rows = []
    for i in out:
        kind, basis, held = _what(trace, int(starts[i]), int(ends[i]), has_backward, int(i), marks, compile_spans)
        rows.append(
            {
                "step": int(steps["step"].iloc[i]),
                "step_us": us(dur[i]),
                "times_median": round(dur[i] / median, 2),
                "holds": kind,
                "known_from": basis,
                "held_us": us(held),
            }
        )
    excess = float(sum(dur[i] - median for i in out))
    kinds = sorted({r["holds"] for r in rows})
    metrics = msgspec.structs.replace(metrics, excess_us=us(excess), holds=kinds)
    listed = "; ".join(f"#{r['step']} {r['step_us'] / 1000:,.1f} ms ({r['times_median']}x, {r['holds']})"
                       for r in rows[:5])
    finding = Finding(
        id="outlier_steps", rank=trace.rank,
        title=(f"{len(out)} of the window's {len(steps)} steps take {config.outlier_step_ratio:g}x the median step "
               f"({median / 1e6:,.1f} ms) or more: {listed}"),
        evidence={"median_step_us": us(median), "outliers": rows[:20], "excess_us": us(excess), "run": periodic},
        recommendation=("Numbers over the window include these steps. "
                        + ("A validation pass or checkpoint inside the window is part of the run's time, but not of a "
                           "training step's: profile a window of training steps alone to judge the step, and weigh "
                           "how often validation runs against its cost. " if set(kinds) & {"validation", "evaluation",
                                                                                            "checkpoint"} else "")
                        + ("Compilation inside the window is one-off (see the recompile finding). "
                           if "compile" in kinds else "")
                        + ("What made the unknown ones slow is not in the trace (untraced Python, I/O, another "
                           "process): profile with with_stack=True." if "unknown" in kinds else "")).strip(),
        impact_us=excess / 1000.0,
    )
    return AnalysisResult(key="outliers", metrics=OutliersResult(outliers=metrics),
                          findings=(finding,) + ((run_finding,) if run_finding else ()))
