"""The training thread's CPU: whether it got a core whenever it could run.

**Measured** (Kinetoscope's captures since the scheduler statistics, ``runqueue_wait_ns`` in ``steps.json``): the
kernel counts the time the training thread was runnable and sat on a run queue with no CPU. That time is lost to
the step - the thread had work and no core to do it on - and it is the finding's cost as measured, not a guess.

**Inferred** (captures before them, or where the kernel keeps no scheduler statistics): the capture's per-step
CPU time of the process is set against the time its training thread had work, and the shortfall is work that ran
without a core. What "had work" means is where an inference goes wrong: a thread blocked in an untraced wait (a
FSDP unshard's wait for its all-gather, the GIL held by a loader thread, ``time.sleep``, file or socket I/O, Python
between operators that waits) looks busy to the trace and idle to the CPU clock. So the claim rests on the lower
bound: only time inside torch's operators (``aten::``), less the waits the trace shows (data, the device, other
ranks, compilation), counts as work; Python and record_function ranges between operators do not. The shortfall
against the whole step less its waits (the upper bound) is said beside it. An inference is never more than a
warning (its ``ceiling``), and one that only the upper bound supports is information.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.collectives import collectives, host_collectives
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.hostfacts import count, job_threads
from kinetoscope.analyze.model.results import HostInferred, HostMeasured, HostResult
from kinetoscope.analyze.model.timeline import (
    COMPILE_RE,
    all_loader_spans,
    any_gpu_busy,
    kind_mask,
    main_thread,
    name_mask,
    sync_calls,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us

_COMPILE_MARK_RE = re.compile(r"^kinetoscope::compile$")
#: torch's operators: the work the trace shows the thread doing (record_function ranges, autograd's wrappers and
#: library annotations hold hooks and Python that may wait)
_OPERATOR_RE = re.compile(r"^aten::")
#: operators that wait rather than work: another rank's data, the device
_WAITING_OP_RE = re.compile(r"^(aten::_local_scalar_dense|aten::item)$")

_ADVICE = ("Other threads or processes compete for this host's CPUs: keep torch's threads "
           "(torch.set_num_threads / OMP_NUM_THREADS) plus DataLoader workers within the CPUs the job is given, pin "
           "the training process to cores of its own (taskset, numactl), and move other work off the node.")


def _steps(trace: RankTrace) -> Any:
    return trace.steps[~trace.steps["partial"].to_numpy()] if "partial" in trace.steps else trace.steps


def _waits(trace: RankTrace, tid: str) -> iv.Intervals:
    """When the training thread waits, as the trace shows: for data (any loader), for the device (syncs), for other
    ranks (collectives), and for compilation (torch.compile's compilers run in subprocesses)."""
    ev = trace.events
    loaders = all_loader_spans(trace)
    loaders = loaders[(loaders["tid"].astype(str) == tid).to_numpy()]
    waits = [loaders, sync_calls(trace), host_collectives(trace), collectives(trace),
             ev[name_mask(ev, COMPILE_RE) | name_mask(ev, _COMPILE_MARK_RE)]]
    return iv.union(np.concatenate([w["ts_ns"].to_numpy() for w in waits]),
                    np.concatenate([w["end_ns"].to_numpy() for w in waits]))


def _work_per_step(trace: RankTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, upper, lower) ns per step in which the training thread had work: the upper bound is the step
    less its traced waits (Python between operators counts as work); the lower bound is the time inside torch's
    operators (``aten::``, of non-zero length) less those waits."""
    ev = trace.events
    tid = main_thread(trace)
    steps = _steps(trace)
    if tid is None or steps.empty:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    idle = _waits(trace, tid)
    starts, ends = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    upper = iv.subtract(iv.union(starts, ends), idle)
    ops = ((ev["tid"].astype(str) == tid).to_numpy() & kind_mask(ev, ("cpu_op",))
           & name_mask(ev, _OPERATOR_RE) & ~name_mask(ev, _WAITING_OP_RE) & (ev["dur_ns"].to_numpy() > 0))
    lower = iv.subtract(iv.union(ev["ts_ns"].to_numpy()[ops], ev["end_ns"].to_numpy()[ops]), idle)
    return (steps["step"].to_numpy(np.int64), iv.overlap_each(starts, ends, upper),
            iv.overlap_each(starts, ends, lower))


def _advice(facts: dict[str, Any]) -> str:
    """What to do about the wait: where the job's own threads on the host (its ranks' torch threads and DataLoader
    workers) already fit its CPUs, sizing them is no fix, and the advice says what competes instead (was: the same
    advice to keep threads and workers within the CPUs where they already were)."""
    if not facts.get("job_threads_fit_cpus"):
        return _ADVICE
    return (f"This job's own threads already fit the CPUs it runs on ({facts['job_threads_on_host']} of "
            f"{facts['cpus']}: its ranks' torch threads and DataLoader workers): what competes is threads it "
            "does not size - a collective library's (gloo's) threads moving data beside the compute, the profiler's, "
            "other processes. Move other work off the node, pin each rank to cores of its own (taskset, numactl) "
            "with a spare core for its communication threads, or run fewer ranks per host.")


def _facts(trace: RankTrace) -> tuple[dict[str, Any], str]:
    host = (trace.meta.capture or {}).get("host") or {}
    workers = ((trace.meta.capture or {}).get("dataloader") or {}).get("num_workers")
    ranks = host.get("ranks_on_host")
    facts = ", ".join(part for part in (
        f"{host['cpus']} CPUs" if host.get("cpus") else "",
        f"torch threads {host['torch_threads']}" if host.get("torch_threads") else "",
        f"{workers} DataLoader worker{'' if workers == 1 else 's'}" if count(workers, 0) is not None else "",
        f"{ranks} of the job's ranks on this host" if isinstance(ranks, int) and ranks > 1 else "") if part)
    # the threads the job sizes itself on this rank's CPUs (``hostfacts.job_threads``: the same reading the loader's
    # replay makes of the host)
    cpus, threads = host.get("cpus"), host.get("torch_threads")
    sized, fits = job_threads(trace)
    return {"cpus": cpus, "torch_threads": threads,
            "num_workers": count(workers, 0),
            "ranks_on_host": ranks, "job_threads_on_host": sized, "job_threads_fit_cpus": fits}, facts


@register("host", "Host CPU")
def analyze_host(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """The training thread's run-queue wait per step where the capture measured it, else the process's CPU per step
    against the time its training thread had work (capture's step timings)."""
    rs = trace.run_steps
    if rs is None or trace.steps.empty:
        return AnalysisResult(key="host", metrics=HostResult(host=None))
    steps = _steps(trace)
    rows = rs.set_index("step").reindex(steps["step"].to_numpy(np.int64))
    if "runqueue_wait_ns" in rows and rows["runqueue_wait_ns"].notna().any():
        return _measured(trace, config, steps, rows)
    if "cpu_ns" not in rs or rs["cpu_ns"].isna().all():
        return AnalysisResult(key="host", metrics=HostResult(host=None))
    return _inferred(trace, config)


def _measured(trace: RankTrace, config: AnalysisConfig, steps: Any, rows: Any) -> AnalysisResult:
    """The kernel's count of the training thread's time runnable without a CPU, per step of the window."""
    wait = rows["runqueue_wait_ns"].to_numpy(float)
    oncpu = rows["oncpu_ns"].to_numpy(float) if "oncpu_ns" in rows else np.full(len(rows), np.nan)
    wall = rows["wall_ns"].to_numpy(float)
    numbers = steps["step"].to_numpy(np.int64)
    ok = ~np.isnan(wait) & (wall > 0)
    if not ok.any():
        return AnalysisResult(key="host", metrics=HostResult(host=None))
    lost = float(wait[ok].sum())
    share = lost / float(wall[ok].sum())
    facts, facts_text = _facts(trace)
    metrics = HostMeasured(
        steps=int(ok.sum()),
        runqueue_wait_us_per_step=us(lost / ok.sum()),
        runqueue_wait_fraction_of_steps=round(share, 4),
        runqueue_wait_fraction_of_steps_of="the training thread's time runnable with no CPU (the kernel's "
                                           "scheduler statistics) over the wall time of the window's steps",
        oncpu_us_per_step=us(float(np.nansum(oncpu[ok])) / ok.sum()) if not np.isnan(oncpu[ok]).all() else None,
        **facts,
    )
    # over every step of the run, where each has its count: the run's cost, which the severity policy judges
    rs = trace.run_steps
    run_wait = rs["runqueue_wait_ns"].to_numpy(float) if rs is not None and "runqueue_wait_ns" in rs else None
    run_lost = float(run_wait.sum()) if run_wait is not None and len(run_wait) and not np.isnan(run_wait).any() \
        else None
    run_wall = float(rs["wall_ns"].sum()) if run_lost is not None and rs is not None else None
    findings = []
    run_share = run_lost / run_wall if run_lost is not None and run_wall else None
    # raised where the window or the run (measured over every step) waited past the bar, as the severity policy
    # judges it over the run (was: the window's share alone, so a Trainer losing 7.2% of its run, 3.4 s of it in one
    # evaluation step outside the window, was not told)
    if ok.sum() >= 2 and (share >= config.host_runqueue_min_fraction
                          or (run_share is not None and run_share >= config.host_runqueue_min_fraction)):
        device = iv.measure(any_gpu_busy(trace)) > 0
        findings.append(Finding(
            id="host_oversubscribed",
            rank=trace.rank,
            title=(f"The training thread waited {lost / ok.sum() / 1e6:.1f} ms per step for a CPU "
                   f"({share:.0%} of the step, measured by the kernel over {int(ok.sum())} steps"
                   + (f"; {run_lost / run_wall:.0%} over the run's {len(run_wait)} steps"
                      if run_lost is not None and run_wait is not None and run_wall else "") + ")"
                   + (f" ({facts_text})" if facts_text else "")),
            evidence={
                "measured": True,
                "runqueue_wait_fraction_of_steps": round(share, 4),
                "per_step": [
                    {"step": int(s), "runqueue_wait_us": us(w), "step_us": us(d), "share_of_step": round(w / d, 4),
                     "oncpu_us": us(c) if not np.isnan(c) else None}
                    for s, w, d, c in zip(numbers[ok], wait[ok], wall[ok], oncpu[ok], strict=True)
                ][:20],
                "lost_us": us(lost),
                "lost_fraction_of_window": frac(lost, window(trace).dur_ns),
                "run_lost_us": us(run_lost),
                "run_lost_fraction": round(run_share, 4) if run_share is not None else None,
                # on a rank with device work, host time lost may have been hidden behind the device's
                "saving_bound": "upper" if device else None,
                **facts,
            },
            recommendation=_advice(facts),
            impact_us=lost / 1000.0,
            run_cost_us=us(run_lost),
            run_cost_bound="upper" if device else None,
        ))
    return AnalysisResult(key="host", metrics=HostResult(host=metrics), findings=tuple(findings))


def _inferred(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    rs = trace.run_steps
    assert rs is not None
    numbers, upper, lower = _work_per_step(trace)
    rows = rs.set_index("step").reindex(numbers)
    cpu = (rows["cpu_ns"] - rows["data_wait_cpu_ns"].fillna(0)).to_numpy(float)
    ok = ~np.isnan(cpu) & (upper > 0)
    if not ok.any():
        return AnalysisResult(key="host", metrics=HostResult(host=None))
    share = cpu[ok] / upper[ok]
    lost_hi = np.maximum(upper[ok] - cpu[ok], 0.0)  # the shortfall if every untraced stretch was work
    lost_lo = np.maximum(lower[ok] - cpu[ok], 0.0)  # the shortfall counting only time inside operators as work
    share_lo = cpu[ok] / np.maximum(lower[ok], 1.0)
    facts, facts_text = _facts(trace)
    metrics = HostInferred(
        steps=int(ok.sum()),
        cores_while_busy=round(float(np.median(share)), 4),
        cores_while_busy_of="the process's CPU time outside data waits over the time its training thread wanted a "
                            "CPU (the step less its waits for data, the device, other ranks, and compilation), per "
                            "step (median)",
        cores_while_in_operators=round(float(np.median(share_lo)), 4),
        busy_us_per_step=us(float(np.mean(upper[ok]))),
        in_operators_us_per_step=us(float(np.mean(lower[ok]))),
        cpu_us_per_step=us(float(np.mean(cpu[ok]))),
        **facts,
    )
    w = window(trace)
    findings = []
    starved = ok.sum() >= 2 and float(np.median(share)) < config.host_min_core_share
    sure = starved and float(np.median(share_lo)) < config.host_min_core_share \
        and lost_lo.sum() >= config.host_min_lost_fraction * w.dur_ns
    if sure or (starved and lost_hi.sum() >= config.host_min_lost_fraction * w.dur_ns):
        lost = lost_lo if sure else lost_hi
        confidence = (
            "a lower bound: the shortfall counting only time inside torch's operators as work (an untraced wait "
            "between them - an unshard's wait, the GIL, a sleep, I/O - cannot explain it)" if sure else
            "low: only the step less its traced waits supports it; the thread's untraced waits (an unshard's wait, "
            "the GIL, a sleep, I/O) would read the same")
        findings.append(Finding(
            id="host_oversubscribed",
            rank=trace.rank,
            title=(
                f"The training process got {float(np.median(share)):.2f} of a core while its training thread had work "
                f"(median of {int(ok.sum())} steps; inferred from CPU time, not measured)"
                + (f" ({facts_text})" if facts_text else "")
            ),
            evidence={
                "measured": False,
                "confidence": confidence,
                "cores_while_busy": metrics.cores_while_busy,
                "cores_while_in_operators": metrics.cores_while_in_operators,
                "per_step": [
                    {"step": int(s), "busy_us": us(b), "in_operators_us": us(o), "cpu_us": us(c)}
                    for s, b, o, c in zip(numbers[ok], upper[ok], lower[ok], cpu[ok], strict=True)
                ][:20],
                "lost_us": us(float(lost.sum())),
                "lost_us_upper_bound": us(float(lost_hi.sum())),
                "lost_us_lower_bound": us(float(lost_lo.sum())),
                "lost_fraction_of_window": frac(float(lost.sum()), w.dur_ns),
                # the lower bound is a floor of what a core would save; the upper one assumes no untraced waits
                "saving_bound": None if sure else "upper",
                **facts,
            },
            recommendation=_advice(facts),
            impact_us=float(lost.sum()) / 1000.0,
            ceiling="warning" if sure else "info",
            ceiling_reason=("no stronger on an inference: the capture did not record the thread's run-queue wait"
                            if sure else "only if the time between operators is work: it may be waits"),
        ))
    return AnalysisResult(key="host", metrics=HostResult(host=metrics), findings=tuple(findings))
