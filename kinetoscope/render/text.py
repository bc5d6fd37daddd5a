"""A readable report for a terminal: findings first (most severe first), then numbers per rank."""

from __future__ import annotations

from typing import Any

from kinetoscope.analyze.model.results import (
    Collectives,
    CommResult,
    CopiesResult,
    CoverageResult,
    EfficiencyResult,
    GpuResult,
    LoaderResult,
    MemoryResult,
    MissingActivity,
    PhasesResult,
    StepsResult,
    TelemetryResult,
)
from kinetoscope.analyze.report.builder import RankReport, Report
from kinetoscope.render.format import mib as _mib
from kinetoscope.render.format import missing_ranks_text, worth
from kinetoscope.render.format import ms as _ms
from kinetoscope.render.format import pct as _pct

_MARK = {"critical": "CRITICAL", "warning": "WARNING ", "info": "info    "}


def render_text(report: Report) -> str:
    out: list[str] = [f"Kinetoscope report: {report.source}", ""]
    if report.findings:
        out.append(f"Findings ({len(report.findings)}), most severe first:")
        for f in report.findings:
            out.append(f"  [{_MARK[f.severity]}] {'job' if f.rank is None else f'rank {f.rank}'}: {f.title}  ({f.id})")
            out.append(f"      fix: {f.recommendation}")
            line = worth(f.estimate, f.worth)
            if line:
                out.append(f"      {line}")
    else:
        out.append("Findings: none - no loader stalls, idle GPU, copy, sync, memory or straggler problems found.")
    for r in report.rank_reports:
        out += _rank_lines(r)
    matched = report.job_results.get("collectives")
    coll = matched.metrics if matched is not None else None
    if isinstance(coll, Collectives):
        out.append("")
        p2p = sum(r.point_to_point for r in coll.ranks)
        out.append(f"Collectives across ranks ({coll.matched} matched, {coll.unmatched} unmatched"
                   + (f", {p2p} point-to-point calls never matched" if p2p else "")
                   + "; clocks aligned on collective completion):")
        for cr in coll.ranks:
            out.append(
                f"  rank {cr.rank}: clock skew {_ms(cr.clock_skew_us)}, waiting {_ms(cr.wait_us)}, "
                f"last to arrive {cr.waited_for_count} times"
                + (f", the others waiting {_ms(cr.waited_for_us)} there" if cr.waited_for_us is not None else "")
                + f" ({cr.matched} matched, {cr.unmatched} unmatched)"
            )
        if coll.most_waited_for_rank is not None:
            out.append(f"  most waited-for rank: {coll.most_waited_for_rank} (the others' waits for it the longest)")
    missing = missing_ranks_text(report.job)
    if missing:
        out.append("")
        out.append(f"Job: {missing}.")
    out += _hang_lines(report)
    if report.violations:
        out.append("")
        out.append("Numbers that break an invariant (a bug in Kinetoscope; please report it):")
        out += [f"  {v}" for v in report.violations]
    if report.failures:
        out.append("")
        for failure in report.failures:
            out.append(f"  analysis error in {failure.analyzer} (rank {failure.rank}): {failure.error}")
    return "\n".join(out) + "\n"


def _rank_lines(r: RankReport) -> list[str]:
    """One rank's numbers, read from its typed results (an analyzer that failed, or is not typed, shows nothing)."""
    out = [""]
    names = [d for d in (r.devices or []) if d]
    devices = (
        ", ".join(f"{names.count(n)}x {n}" if names.count(n) > 1 else n for n in dict.fromkeys(names))
        or "no device info"
    )
    out.append(f"Rank {r.rank} ({r.rank_source}) - {r.file} - {devices}")
    stepped = r.result(StepsResult)
    if stepped is not None:
        out.append(f"  window         {_ms(stepped.window_us)}  ({stepped.window.description})")
    else:
        out.append(f"  window         {_ms(None)}  ()")
    steps = stepped.steps if stepped is not None else None
    partial = steps.partial if steps is not None else 0
    cut = f", and {partial} cut short (left out)" if partial else ""
    if steps is not None and steps.count:
        out.append(f"  steps          {steps.count} (#{steps.first}-#{steps.last}), mean {_ms(steps.mean_us)}{cut}")
    elif steps is not None and partial:
        out.append(f"  steps          none complete: {partial} cut short by the run's end (#{steps.first})")
    else:
        out.append("  steps          none recorded (no ProfilerStep spans)")
    anatomy = r.result(PhasesResult)
    phases = anatomy.phases if anatomy is not None else None
    if phases:
        host = ", ".join(f"{k.replace('_', ' ')} {_pct(v.fraction)}" for k, v in phases.items() if v.fraction)
        out.append(f"  step anatomy   host: {host}")
        if any(v.gpu_fraction for v in phases.values()):
            gpu_line = ", ".join(
                f"{k.replace('_', ' ')} {_pct(v.gpu_fraction)}" for k, v in phases.items() if v.gpu_fraction
            )
            out.append(f"                 GPU work launched from: {gpu_line}")
    loading = r.result(LoaderResult)
    loader = loading.loader if loading is not None else None
    if loader is not None and loader.calls:
        out.append(
            f"  data loading   {_ms(loader.time_us)} = {_pct(loader.fraction)} of window"
            + (f"; GPU idle meanwhile {_ms(loader.gpu_idle_cost_us)}" if loader.gpu_idle_cost_us is not None else "")
        )
    run = loader.run if loader is not None else None
    if run is not None:
        waiting = (
            f"waiting for data {_pct(run.data_wait_fraction)} of wall time"
            if run.data_wait_fraction is not None
            else "waiting for data: not recorded by this capture"
        )
        validation = (f", validation {_ms(run.validation_us)} = {_pct(run.validation_fraction)}"
                      if run.validation_us else "")
        out.append(f"  whole run      {run.steps} steps timed, {waiting}{validation}")
    out += _gpu_lines(r)
    effs = r.result(EfficiencyResult)
    eff = effs.efficiency if effs is not None else None
    if eff is not None and eff.matrix_ops and eff.flops_per_step is not None:
        peak = (f"{eff.peak_tflops:g} TFLOP/s {eff.peak_dtype}" if eff.peak_tflops is not None else "no known peak")
        out.append(f"  matrix work    {eff.flops_per_step / 1e12:.3g} TFLOP per step, MFU {_pct(eff.mfu)} of "
                   f"{eff.device or 'the device'} ({peak}); kernels at "
                   f"{_pct(eff.matrix_of_peak_fraction)} of peak")
    elif eff is not None and eff.matrix_ops:
        out.append(f"  matrix work    FLOPs not counted: {eff.matrix_ops_unknown} of {eff.matrix_ops} "
                   "matrix ops' shapes do not tell them (record_shapes=True, torch >= 2.1)")
    copying = r.result(CopiesResult)
    for c, label in ((copying.h2d, "H2D copies"), (copying.d2h, "D2H copies")) if copying is not None else ():
        if c is not None:
            out.append(
                f"  {label:<14} {c.count} copies, {_ms(c.time_us)}, {_mib(c.bytes)}, "
                f"{c.bandwidth_gb_per_s} GB/s, pageable {_pct(c.pageable_fraction)}, "
                f"overlapped {_pct(c.overlap_fraction)}"
            )
    telemetry = r.result(TelemetryResult)
    for track, series in ((telemetry.telemetry or {}) if telemetry is not None else {}).items():
        shown = ", ".join(f"{k} mean {v.mean:g} (max {v.max:g})" for k, v in sorted(series.items()))
        out.append(f"  telemetry      {track}: {shown}")
    out += _comm_lines(r)
    remembered = r.result(MemoryResult)
    mem = remembered.memory if remembered is not None else None
    if mem is not None:
        for d in mem.devices:
            growth = d.growth_bytes_per_step
            out.append(
                f"  memory {d.device:<7} peak {_mib(d.peak_allocated_bytes)}"
                + (f" at {d.peak_op}" if d.peak_op else "")
                + (f", growth {_mib(growth)}/step (R^2 {d.growth_r2:.2f})" if growth is not None else "")
            )
    covered = r.result(CoverageResult)
    unread = covered.coverage.unread_events if covered is not None else None
    if unread:
        out.append("  not read       " + ", ".join(f"{n:,} {c} events" for c, n in unread.items())
                   + " (no analysis reads these categories)")
    for w in r.warnings:
        out.append(f"  note: {w}")
    return out


def _gpu_lines(r: RankReport) -> list[str]:
    result = r.result(GpuResult)
    gpu = result.gpu if result is not None else None
    if gpu is None:  # (also where the analyzer failed, as the text report has always said)
        return ["  GPU            no GPU activity in this trace"]
    out = []
    for d in gpu.devices:
        if d.idle_fraction is None:
            out.append(
                f"  GPU {d.device} busy     {_ms(d.busy_us)}; idle not judged: the trace misses "
                f"the GPU's activity for {_pct(gpu.missing_activity.unknown_fraction)} of the window"
            )
            continue
        causes = ", ".join(f"{k.replace('_', ' ')} {_ms(v)}" for k, v in (d.idle_by_cause_us or {}).items() if v)
        out.append(f"  GPU {d.device} idle     {_pct(d.idle_fraction)} of window ({causes or 'no idle time'})")
    for s in gpu.streams:
        out.append(
            f"    stream {s.stream:<6} busy {_ms(s.busy_us)}, idle {_pct(s.idle_fraction)}, "
            f"largest gap {_ms(s.largest_gap_us)} ({s.kernels} kernels, {s.copies} copies)"
        )
    return out + _graph_lines(gpu.missing_activity)


def _graph_lines(m: MissingActivity) -> list[str]:
    """Graph replays whose kernels were not recorded: which were judged from their graph's capture, and how."""
    if not m.graph_launches_unrecorded:
        return []
    out = [f"  graph replays {m.graph_launches_unrecorded} without recorded kernels, "
           f"{m.graph_launches_from_capture} judged from their graph's capture"
           + (f" (running a captured graph {_ms(m.graph_replay_span_us)}: neither idle nor unknown)"
              if m.graph_replay_span_us is not None else "")]
    for g in m.captured_graphs:
        size = f", batch size {g.batch_size}" if g.batch_size is not None else ""
        ops = ", ".join(dict.fromkeys(x.op for x in g.launch_list if x.op))
        out.append(f"    graph {g.capture} of {g.source}{size}: {g.launches} launches{f' ({ops})' if ops else ''}; "
                   f"{g.replays} replays ({g.replays_judged} judged), matched by {', '.join(g.matched_by)}, "
                   f"{g.confidence} confidence"
                   + (f"; a recorded replay of its kernels keeps the GPU busy {_ms(g.recorded_replay_busy_us)} "
                      f"(median of {g.recorded_replays_alike})" if g.recorded_replay_busy_us is not None else ""))
    for reason, count in m.graph_launches_not_judged.items():
        out.append(f"    {count} not judged: {reason}")
    return out


def _comm_lines(r: RankReport) -> list[str]:
    result = r.result(CommResult)
    comm = result.comm if result is not None else None
    if comm is None:
        return []
    if comm.overlap_fraction is not None:
        return [
            f"  communication  {comm.collectives} collectives, {_ms(comm.time_us)}, overlapped with compute "
            f"{_pct(comm.overlap_fraction)}, exposed {_ms(comm.exposed_us)}"
        ]
    if comm.where == "gpu":
        return [
            f"  communication  {comm.collectives} collectives, {_ms(comm.time_us)}; overlap with compute "
            "not judged: the trace misses part of the GPU's activity"
        ]
    ops = ", ".join(f"{v.count} {k}" for k, v in comm.by_op.items())
    return [
        f"  communication  {comm.collectives} collectives on the host ({ops}), {_ms(comm.time_us)} = "
        f"{_pct(comm.fraction)} of window"
    ]


def _collective_text(c: dict[str, Any] | None) -> str:
    if not c:
        return "none"
    sizes = c.get("input_sizes")
    return f"#{c['seq']} {c['op']}{sizes if sizes else ''} {'completed' if c.get('completed') else 'not completed'}"


def _hang_lines(report: Report) -> list[str]:
    """The hang finding's per-rank table: what each rank last entered and completed, and where its training
    thread was (the innermost frames of the stuck ranks)."""
    hang = next((f for f in report.findings if f.id == "hang"), None)
    if hang is None:
        return []
    ev = hang.evidence
    out = ["", f"Hang: process group {ev['process_group']}, collective #{ev['seq']} (expected {ev['expected_op']})"
           if ev.get("seq") is not None else "Hang: no collective out of step"]
    for label, key in (("missing", "missing_ranks"), ("mismatched", "mismatched_ranks"), ("waiting", "waiting_ranks"),
                       ("no dump", "ranks_without_dump")):
        if ev.get(key):
            out.append(f"  {label:<11}ranks {', '.join(map(str, ev[key]))}")
    for r in ev.get("per_rank", []):
        w = r.get("where") or {}
        where = f"{w.get('function')} ({str(w.get('file', '?')).rsplit('/', 1)[-1]}:{w.get('line')})" if w else "?"
        exc = r.get("exception")
        out.append(f"  rank {r['rank']}: entered {_collective_text(r.get('last_entered'))}; last completed "
                   f"{_collective_text(r.get('last_completed'))}; {'raised ' + exc['type'] + ' in ' if exc else 'in '}"
                   f"{where} ({r['dump_reason']}, {r['steps_ended']} steps)")
    for s in ev.get("stuck", []):
        out.append(f"  stuck rank {s['rank']} ({s['why']}), innermost frames:")
        for f in (s.get("frames") or [])[:5]:
            out.append(f"      {f['function']} ({f['file']}:{f['line']})" + (f"  {f['code']}" if f.get("code") else ""))
    return out


def _gains_less(fix: dict[str, Any]) -> str | None:
    """Why a fix gains less than the waiting it removes, from the critical path (None where it gains about all)."""
    path, est = fix.get("critical_path"), fix.get("estimate")
    if not path or not est or path["targeted_us_per_step"] - est["saving_us_per_step"] < 1:
        return None
    text = (f"gains less than the {_ms(path['targeted_us_per_step'])} per step of waiting it targets: "
            f"{_ms(path['on_critical_path_us_per_step'])} of it lies on the critical path")
    if path.get("gpu_slack_us") is not None:
        text += f"; the GPU has {_ms(path['gpu_slack_us'])} of slack beside it (past that, the GPU bounds the step)"
    return text


def render_whatif(source: str, wanted: list[str], ranks: list[dict[str, Any]]) -> str:
    """``kinetoscope whatif``: per rank, the replay's check, each fix alone, and the chosen fixes together."""
    out = [f"What-if: {source}", ""]
    for r in ranks:
        rep = r.get("replay")
        if rep:
            out.append(f"Rank {r['rank']}: measured {_ms(rep['measured_step_us'])} per step over {rep['steps']} steps; "
                       f"replayed {_ms(rep['step_us'])} (error {_pct(rep['error'])})")
        else:
            out.append(f"Rank {r['rank']}: no complete steps: nothing to replay")
        for f in r["fixes"]:
            line = worth(f["estimate"]) or ("fix this: not estimated by the replay (not a time cost, nothing the "
                                            "replay can change, or a cost outside the window: see analyze)")
            out.append(f"  {f['id']:<22} {line}")
            why = _gains_less(f)
            if why:
                out.append(f"    {why}")
        together = r.get("together")
        if together:
            out.append(
                f"  together ({', '.join(r.get('applied') or wanted)}): {_ms(together['step_us_after'])} per step, "
                + (f"{_ms(together['saving_us_per_step'])} faster ({_pct(together['saving_fraction'])})"
                   if together["saving_us_per_step"] >= 0 else
                   f"{_ms(-together['saving_us_per_step'])} slower ({_pct(-together['saving_fraction'])})")
            )
            for a in dict.fromkeys(together["assumptions"]):
                out.append(f"    assuming {a}")
        for missing in r.get("not_found") or []:
            out.append(f"  {missing}: no such finding on this rank")
        out.append("")
    return "\n".join(out)
