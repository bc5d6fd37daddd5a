"""The training process's CPU: whether it got the cores its work needed.

The capture records the process's CPU time in every step (all threads) beside the step's wall time. While the
training thread is busy in operators (not waiting for data or the device), a process that gets at least a core
runs them at full speed; one that gets a fraction of a core - other processes, too many threads or DataLoader
workers for the host's CPUs - runs them that much slower, and the trace's operator times are stretched by it.
"""

from __future__ import annotations

import re

import numpy as np

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.collectives import collectives, host_collectives
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.results import Host, HostResult
from kinetoscope.analyze.model.timeline import COMPILE_RE, all_loader_spans, main_thread, name_mask, sync_calls, window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us


def _busy_per_step(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """(step numbers, ns per step in which the training thread wanted a CPU): the step, less its waits - for data
    (any loader), for the device (syncs), for other ranks (collectives) - and less compilation (torch.compile's
    compilers run in subprocesses, whose CPU the process does not count). Python between operators is work too:
    a starved process stretches it as much as its operators."""
    ev = trace.events
    tid = main_thread(trace)
    steps = trace.steps[~trace.steps["partial"].to_numpy()] if "partial" in trace.steps else trace.steps
    if tid is None or steps.empty:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    loaders = all_loader_spans(trace)
    loaders = loaders[(loaders["tid"].astype(str) == str(tid)).to_numpy()]
    waits = [loaders, sync_calls(trace), host_collectives(trace), collectives(trace),
             ev[name_mask(ev, COMPILE_RE) | name_mask(ev, _COMPILE_MARK_RE)]]
    idle = iv.union(np.concatenate([w["ts_ns"].to_numpy() for w in waits]),
                    np.concatenate([w["end_ns"].to_numpy() for w in waits]))
    runnable = iv.subtract(iv.union(steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()), idle)
    return (steps["step"].to_numpy(np.int64),
            iv.overlap_each(steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy(), runnable))


_COMPILE_MARK_RE = re.compile(r"^kinetoscope::compile$")


@register("host", "Host CPU")
def analyze_host(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """The process's CPU per step against the time its training thread was busy (capture's step timings)."""
    rs = trace.run_steps
    if rs is None or "cpu_ns" not in rs or rs["cpu_ns"].isna().all() or trace.steps.empty:
        return AnalysisResult(key="host", metrics=HostResult(host=None))
    numbers, busy = _busy_per_step(trace)
    rows = rs.set_index("step").reindex(numbers)
    cpu = (rows["cpu_ns"] - rows["data_wait_cpu_ns"].fillna(0)).to_numpy(float)
    ok = ~np.isnan(cpu) & (busy > 0)
    if not ok.any():
        return AnalysisResult(key="host", metrics=HostResult(host=None))
    share = cpu[ok] / busy[ok]
    lost = np.maximum(busy[ok] - cpu[ok], 0.0)  # busy time that ran without a core: at least this was lost
    host = (trace.meta.capture or {}).get("host") or {}
    metrics = Host(
        steps=int(ok.sum()),
        cores_while_busy=round(float(np.median(share)), 4),
        cores_while_busy_of="the process's CPU time outside data waits over the time its training thread wanted a "
                            "CPU (the step less its waits for data, the device, other ranks, and compilation), per "
                            "step (median)",
        busy_us_per_step=us(float(np.mean(busy[ok]))),
        cpu_us_per_step=us(float(np.mean(cpu[ok]))),
        cpus=host.get("cpus"),
        torch_threads=host.get("torch_threads"),
    )
    findings = []
    w = window(trace)
    if (ok.sum() >= 2 and float(np.median(share)) < config.host_min_core_share
            and lost.sum() >= config.host_min_lost_fraction * w.dur_ns):
        workers = ((trace.meta.capture or {}).get("dataloader") or {}).get("num_workers")
        facts = ", ".join(part for part in (
            f"{host['cpus']} CPUs" if host.get("cpus") else "",
            f"torch threads {host['torch_threads']}" if host.get("torch_threads") else "",
            f"{workers} DataLoader workers" if isinstance(workers, int) else "") if part)
        findings.append(
            Finding(
                id="host_oversubscribed",
                rank=trace.rank,
                title=(
                    f"The training process got {float(np.median(share)):.2f} of a core while its training thread "
                    f"had work (median of {int(ok.sum())} steps): its work ran that much slower"
                    + (f" ({facts})" if facts else "")
                ),
                evidence={
                    "cores_while_busy": metrics.cores_while_busy,
                    "per_step": [
                        {"step": int(s), "busy_us": us(b), "cpu_us": us(c)}
                        for s, b, c in zip(numbers[ok], busy[ok], cpu[ok], strict=False)
                    ][:20],
                    "lost_us": us(float(lost.sum())),
                    "lost_fraction_of_window": frac(float(lost.sum()), w.dur_ns),
                    "cpus": host.get("cpus"),
                    "torch_threads": host.get("torch_threads"),
                    "num_workers": workers,
                },
                recommendation=(
                    "Other threads or processes compete for this host's CPUs: keep torch's threads "
                    "(torch.set_num_threads / OMP_NUM_THREADS) plus DataLoader workers within the CPUs the job "
                    "is given, pin the training process to cores of its own (taskset, numactl), and move other "
                    "work off the node."
                ),
                impact_us=float(lost.sum()) / 1000.0,
            )
        )
    return AnalysisResult(key="host", metrics=HostResult(host=metrics), findings=tuple(findings))
