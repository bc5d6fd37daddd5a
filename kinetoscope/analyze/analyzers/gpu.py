"""CUDA stream gaps: busy and idle per device and stream, why the GPU waited, and what the trace
cannot show (graph replays whose kernels were not recorded, stream capture)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.graphs import graph_replays, replay_span
from kinetoscope.analyze.model.missing import missing_activity
from kinetoscope.analyze.model.results import (
    CapturedGraphReplays,
    CapturedLaunch,
    Gpu,
    GpuDevice,
    GpuResult,
    GpuStream,
    MissingActivity,
)
from kinetoscope.analyze.model.syncs import sync_cost
from kinetoscope.analyze.model.timeline import (
    Window,
    any_gpu_busy,
    device_busy,
    gpu_work,
    host_work,
    intervals_of,
    kind_mask,
    launch_queue,
    loader_spans,
    name_mask,
    python_frames,
    python_hotspots,
    startup_calls,
    step_at,
    sync_calls,
    window,
)
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us

#: launches listed per captured graph in the report (a served model's graph holds hundreds to thousands)
GRAPH_LAUNCHES_LISTED = 64

#: Idle time is attributed to the first cause that covers it, in this order (docs/findings.md).
CAUSES = ("data_wait", "sync", "host_compute", "host_launch", "host_python", "other")


def _stream_table(trace: RankTrace, w: Window) -> pd.DataFrame:
    rows = []
    for (device, stream), g in gpu_work(trace).groupby(["device", "stream"], sort=True):
        busy = intervals_of(g, w)
        gaps = iv.complement(busy, w.start_ns, w.end_ns)
        gap_lengths = gaps[1] - gaps[0]
        idle_ns = int(gap_lengths.sum())  # from the gaps themselves: busy + idle = window is a check, not an identity
        # counted over the window that busy and idle are measured over (was: every event of the trace)
        inside = g[((g["end_ns"] > w.start_ns) & (g["ts_ns"] < w.end_ns)).to_numpy()]
        rows.append(
            {
                "device": int(device),
                "stream": int(stream),
                "kernels": int((inside["kind"] == "kernel").sum()),
                "copies": int((inside["kind"] == "memcpy").sum()),
                "memsets": int((inside["kind"] == "memset").sum()),
                "busy_us": iv.measure(busy) / 1000.0,
                "idle_us": idle_ns / 1000.0,
                "idle_fraction": frac(idle_ns, w.dur_ns),
                "largest_gap_us": float(gap_lengths.max()) / 1000.0 if gap_lengths.size else 0.0,
            }
        )
    return pd.DataFrame(rows)




def _attribute(idle: iv.Intervals, causes: dict[str, iv.Intervals]) -> dict[str, iv.Intervals]:
    """Split idle time among causes without double counting (first cause wins)."""
    remaining = idle
    out: dict[str, iv.Intervals] = {}
    for name in CAUSES[:-1]:
        out[name] = iv.intersect(remaining, causes[name])
        remaining = iv.subtract(remaining, causes[name])
    out["other"] = remaining
    return out


def _gap_table(
    trace: RankTrace, device: int, gaps: iv.Intervals, parts: dict[str, iv.Intervals], config: AnalysisConfig
) -> pd.DataFrame:
    lengths = gaps[1] - gaps[0]
    big = lengths >= config.min_gap_us * 1000
    starts, ends, lengths = gaps[0][big], gaps[1][big], lengths[big]
    order = np.argsort(-lengths, kind="stable")[: config.top_gaps]
    starts, ends, lengths = starts[order], ends[order], lengths[order]
    by_cause = {c: iv.overlap_each(starts, ends, parts[c]) for c in CAUSES}
    matrix = np.vstack([by_cause[c] for c in CAUSES]) if len(starts) else np.zeros((len(CAUSES), 0))
    cause = [CAUSES[i] for i in matrix.argmax(axis=0)] if len(starts) else []
    table = pd.DataFrame(
        {
            "device": np.full(len(starts), device, dtype=np.int64),
            "start_ns": starts,
            "start_us": starts / 1000.0,
            "dur_us": lengths / 1000.0,
            "step": step_at(trace, starts),
            "cause": cause,
        }
    )
    for c in CAUSES:
        table[f"{c}_us"] = by_cause[c] / 1000.0
    return table


@register("gpu", "CUDA stream gaps")
def analyze_gpu(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Per device and stream: busy (kernels, copies, memsets as a union), idle, largest gaps and their
    causes; idle is unknown (``null``) where the trace misses the GPU's activity."""
    if not trace.has_gpu:
        unrecorded = _gpu_used_but_not_recorded(trace)
        return AnalysisResult(key="gpu", metrics=GpuResult(gpu=None), findings=(unrecorded,) if unrecorded else ())
    w = window(trace)
    streams = _stream_table(trace, w)
    missing = missing_activity(trace)
    blind_share = missing.blind_ns() / w.dur_ns if w.dur_ns else 0.0
    judged = blind_share <= config.missing_activity_max_fraction
    hw = host_work(trace)
    startup = startup_calls(trace)
    startup_ns = iv.measure(intervals_of(startup, w))
    doubt = _doubt(trace, config, w, startup, startup_ns)
    causes = {
        "data_wait": intervals_of(loader_spans(trace), w),
        "host_compute": hw.compute,
        "host_launch": hw.launch,
        # Python the trace recorded (with_stack) running on the launching threads between ops: named, not "untraced"
        "host_python": intervals_of(python_frames(trace), w),
    }
    devices: list[GpuDevice] = []
    idle_by_device: list[int] = []
    gap_tables = []
    findings: list[Finding] = []
    refill_ns = int(config.sync_refill_max_us * 1000)
    spans = missing.replay_spans or {}
    for device, busy in device_busy(trace).items():
        replayed = spans.get(device, iv.EMPTY)
        if busy[0].size == 0 and replayed[0].size == 0:  # its work all lies outside the window: nothing to say here
            devices.append(GpuDevice(device=device, busy_us=0.0, idle_us=None, idle_fraction=None,
                                     idle_by_cause_us=None, largest_gaps=[], unused_in_window=True))
            continue
        # where a replay ran its captured graph the GPU was not idle waiting for the host: left out of idle
        covered = iv.union(np.concatenate((busy[0], replayed[0])), np.concatenate((busy[1], replayed[1])))
        idle = iv.complement(covered, w.start_ns, w.end_ns)
        causes["sync"] = sync_cost(trace, sync_calls(trace), idle, refill_ns)
        parts = _attribute(idle, causes)
        idle_ns = iv.measure(idle)
        gaps = _gap_table(trace, device, idle, parts, config)
        gap_tables.append(gaps)
        by_cause_ns = {c: iv.measure(parts[c]) for c in CAUSES}
        if judged:
            idle_by_device.append(idle_ns)
        devices.append(
            GpuDevice(
                device=device,
                busy_us=us(iv.measure(busy)),
                idle_us=us(idle_ns) if judged else None,
                idle_fraction=frac(idle_ns, w.dur_ns) if judged else None,
                idle_by_cause_us={c: us(v) for c, v in by_cause_ns.items()} if judged else None,
                largest_gaps=[
                    {"start_us": r.start_us, "dur_us": round(r.dur_us, 3), "step": int(r.step), "cause": r.cause}
                    for r in gaps.itertuples()
                ] if judged else [],
                unused_in_window=False,
            )
        )
        if judged:
            findings += _doubted(_device_findings(trace, config, w, device, idle_ns, parts, gaps)
                                 + _launch_bound(trace, config, w, device, idle, parts), doubt)
    anywhere = any_gpu_busy(trace)
    for replayed in spans.values():
        anywhere = iv.union(np.concatenate((anywhere[0], replayed[0])), np.concatenate((anywhere[1], replayed[1])))
    all_idle = iv.complement(anywhere, w.start_ns, w.end_ns)
    metrics = Gpu(
        idle_fraction=frac(max(idle_by_device), w.dur_ns) if idle_by_device else None,
        fraction_of="window",
        any_device_idle_us=us(iv.measure(all_idle)) if judged else None,
        # replays judged from a capture ran work the trace does not show: judged, but not complete
        activity_complete=judged and missing.blind_ns() == 0 and not missing.graph_launches_from_capture,
        missing_activity=MissingActivity(
            graph_launches=missing.graph_launches,
            graph_launches_unrecorded=missing.graph_launches_unrecorded,
            graph_launches_from_capture=missing.graph_launches_from_capture,
            graph_replay_span_us=_replay_span_us(spans),
            captured_graphs=_captured_graphs(trace),
            graph_launches_not_judged=_not_judged(trace),
            stream_capture_us=us(missing.capture_ns),
            queued_behind_unrecorded_work_us=us(missing.pending_ns),
            cut_from_trace_us=us(missing.holes_ns),
            unknown_us=us(missing.blind_ns()),
            unknown_fraction=frac(missing.blind_ns(), w.dur_ns),
            unknown_fraction_of="window",
        ),
        startup_us=us(startup_ns),
        startup_fraction=frac(startup_ns, w.dur_ns),
        startup_fraction_of="window (runtime calls >= 1 ms with the GPU idle: context creation, lazy loading)",
        judgement=doubt,
        devices=devices,
        streams=[GpuStream(**row) for row in streams.to_dict("records")],
    )
    if missing.blind_ns():
        findings.append(_missing_finding(trace, w, missing, judged))
    gaps_all = pd.concat(gap_tables, ignore_index=True) if gap_tables else pd.DataFrame()
    tables = {"streams": streams, "gaps": gaps_all, "gpu_per_step": _per_step(trace)}
    return AnalysisResult(key="gpu", metrics=GpuResult(gpu=metrics), tables=tables, findings=tuple(findings))


def _replay_span_us(spans: dict[int, iv.Intervals]) -> float | None:
    if not spans:
        return None
    starts = np.concatenate([v[0] for v in spans.values()])
    ends = np.concatenate([v[1] for v in spans.values()])
    return us(iv.measure(iv.union(starts, ends)))


def _captured_graphs(trace: RankTrace) -> list[CapturedGraphReplays]:
    """The captured graphs replays without recorded work were matched to, with what each holds."""
    known = graph_replays(trace)
    out = []
    for index, graph in enumerate(known.graphs):
        mine = [r for r in known.replays if r.graph == index]
        if not mine:
            continue
        out.append(CapturedGraphReplays(
            source=graph.source, capture=graph.capture, batch_size=graph.batch_size, launches=graph.launches,
            launch_list=[CapturedLaunch(call=c, op=o, kernel=k, grid=g)
                         for c, o, k, g in zip(graph.calls[:GRAPH_LAUNCHES_LISTED], graph.ops, graph.kernels,
                                               graph.grids, strict=False)],
            replays=len(mine), replays_judged=sum(replay_span(r) is not None for r in mine),
            matched_by=sorted({r.matched_by for r in mine if r.matched_by}),
            confidence="medium", recorded_replays_alike=len(known.recorded_alike_ns.get(index, ())),
            recorded_replay_busy_us=us(float(np.median(known.recorded_alike_ns[index])))
            if known.recorded_alike_ns.get(index) else None))
    return out


def _not_judged(trace: RankTrace) -> dict[str, int]:
    """Replays without recorded work that no capture could be matched to, by reason (a matched replay whose span
    cannot be bounded counts here too)."""
    out: dict[str, int] = {}
    for r in graph_replays(trace).replays:
        if r.recorded:
            continue
        reason = r.unmatched_reason
        if reason is None and r.device is None:
            reason = "matched, but its stream is not known (its thread launched no recorded work before it)"
        elif reason is None and replay_span(r) is None:
            reason = "matched, but nothing bounds when it finished (no later recorded work or device sync)"
        if reason is not None:
            out[reason] = out.get(reason, 0) + 1
    return out


#: host-side names that only a run using a GPU records: NCCL collectives, CUDA stream bookkeeping, CUDA calls
_USES_GPU_RE = re.compile(r"^(nccl|rccl):|record_stream|^cuda|^hip[A-Z]|::cuda")


def _gpu_used_but_not_recorded(trace: RankTrace) -> Finding | None:
    """No GPU activity in the trace, although the run used a GPU: the profiler did not record CUDA activity."""
    if not trace.meta.device_properties:
        return None
    ev = trace.events
    hits = ev[name_mask(ev, _USES_GPU_RE, search=True)]
    if hits.empty:
        return None
    examples = list(dict.fromkeys(hits["name"].astype(str)))[:3]
    return Finding(
        id="gpu_activity_missing",
        rank=trace.rank,
        title=(
            f"The run used a GPU ({', '.join(examples)} on the host; the trace lists "
            f"{len(trace.meta.device_properties)} GPU(s)) but no GPU activity was recorded: GPU time is unknown"
        ),
        evidence={
            "host_events_using_a_gpu": int(len(hits)),
            "examples": examples,
            "devices": [p.get("name") for p in trace.meta.device_properties],
        },
        recommendation="Profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] "
        "(kinetoscope.capture does) to see kernels, copies and GPU idle time.",
    )


def _doubt(trace: RankTrace, config: AnalysisConfig, w: Window, startup: pd.DataFrame, startup_ns: int) -> str | None:
    """Why the window cannot support a warning about the GPU's timeline, or None when it can."""
    if w.dur_ns and startup_ns / w.dur_ns >= config.startup_max_fraction:
        top = startup.nlargest(3, "dur_ns")
        calls = ", ".join(
            f"{n} {d / 1e6:,.1f} ms" for n, d in zip(top["name"].astype(str), top["dur_ns"], strict=False)
        )
        return (f"{startup_ns / w.dur_ns:.0%} of the window is start-up ({calls}) with the GPU idle: "
                "profile steps after warm-up to judge it")
    work = gpu_work(trace)
    ops = int(((work["end_ns"] > w.start_ns) & (work["ts_ns"] < w.end_ns)).sum())
    if ops < config.gpu_min_ops:
        return f"the window holds only {ops} GPU operation{'s' if ops != 1 else ''}: too little work to judge"
    if not len(trace.steps) and not kind_mask(trace.events, ("cpu_op",)).any():
        return ("the trace holds no steps and no host operators: what the GPU waited for, and whether it recurs, "
                "cannot be told")
    return None


def _doubted(findings: list[Finding], doubt: str | None) -> list[Finding]:
    """Findings about the GPU's timeline turned into information when the window cannot support them."""
    if doubt is None:
        return findings
    return [replace(f, ceiling="info", title=f"{f.title} - but {doubt}", evidence={**f.evidence, "doubt": doubt})
            for f in findings]


def _missing_finding(trace: RankTrace, w: Window, missing: Any, judged: bool) -> Finding:
    what = []
    blind_replays = missing.graph_launches_unrecorded - missing.graph_launches_from_capture
    if blind_replays:
        what.append(f"{blind_replays} CUDA/HIP graph replays whose kernels were not recorded"
                    + (f" ({missing.graph_launches_from_capture} more were judged from their graph's capture)"
                       if missing.graph_launches_from_capture else ""))
    if missing.capture_ns:
        what.append(f"stream capture for {missing.capture_ns / 1e6:.1f} ms (launches inside a capture do not run)")
    if missing.holes_ns:
        what.append(f"{missing.holes_ns / 1e6:.1f} ms cut out of the trace (runtime call ids jump by hundreds across "
                    "a silence: the events in between are not in the file)")
    if missing.pending_ns:
        what.append(f"kernels launched in the window waited {missing.pending_ns / 1e6:.1f} ms to start on a GPU the "
                    "trace shows idle (it was busy with work queued before recording began)")
    share = missing.blind_ns() / w.dur_ns if w.dur_ns else 0.0
    tips = ["The GPU ran work the trace does not show, so its idle time cannot be judged there."]
    if blind_replays:
        tips.append("To see the kernels inside graph replays, profile with a recent PyTorch/Kineto (graph kernels "
                    "are recorded under the replay's correlation id) or Nsight Systems (--cuda-graph-trace=node).")
    if missing.capture_ns:
        tips.append("Start the active window after graph capture and warm-up (a larger wait/warmup in the schedule).")
    if missing.holes_ns:
        tips.append(
            "Analyse the untrimmed trace; if the profiler dropped events, raise its buffer or profile fewer steps."
        )
    if missing.pending_ns:
        tips.append("Start recording when the GPU is drained (torch.cuda.synchronize() before the profiled steps), "
                    "or profile more steps so the window is in steady state.")
    return Finding(
        id="gpu_activity_missing",
        rank=trace.rank,
        title=(f"GPU activity is missing from the trace for {share:.0%} of the window: "
               + "; ".join(what) + (" - GPU idle time is not reported" if not judged else "")),
        evidence={
            "graph_launches": missing.graph_launches,
            "graph_launches_unrecorded": missing.graph_launches_unrecorded,
            "graph_launches_from_capture": missing.graph_launches_from_capture,
            "stream_capture_us": us(missing.capture_ns),
            "queued_behind_unrecorded_work_us": us(missing.pending_ns),
            "cut_from_trace_us": us(missing.holes_ns),
            "unknown_us": us(missing.blind_ns()),
            "unknown_fraction_of_window": frac(missing.blind_ns(), w.dur_ns),
            "window_us": us(w.dur_ns),
        },
        recommendation=" ".join(tips),
    )


def _per_step(trace: RankTrace) -> pd.DataFrame:
    """Per step and device: busy (union of all streams) and idle, in us."""
    steps = trace.steps
    start = steps["start_ns"].to_numpy(np.int64)
    end = steps["end_ns"].to_numpy(np.int64)
    parts = []
    for device, busy in device_busy(trace).items():  # one pass per device over every step (was: a clip per step)
        busy_ns = iv.overlap_each(start, end, busy)
        parts.append(pd.DataFrame({"step": steps["step"].to_numpy(np.int64), "device": device,
                                   "busy_us": busy_ns / 1000.0, "idle_us": (end - start - busy_ns) / 1000.0}))
    if not parts:
        return pd.DataFrame(columns=["step", "device", "busy_us", "idle_us"])
    return pd.concat(parts, ignore_index=True)[["step", "device", "busy_us", "idle_us"]]


_ADVICE = {
    "data_wait": "the GPU waits for input: see the loader_stall finding (more DataLoader workers, prefetching).",
    "sync": "the host blocks on the device and the queue drains: remove .item()/.cpu()/synchronize calls from "
            "the step (see sync_point).",
    "host_compute": "the launching thread runs long CPU ops that launch little GPU work: move that work to the GPU, "
                    "into DataLoader workers, or off the training thread.",
    "host_launch": "the host cannot launch work fast enough: fuse small ops (torch.compile), use CUDA graphs, or grow "
                   "the batch.",
    "host_python": "the training thread runs Python between launches (the functions below, from the trace's Python "
                   "stacks): move that work off the loop - into DataLoader workers (preprocessing, decoding) or a "
                   "background thread - or onto the GPU.",
    "other": "the host is doing untraced work between launches (Python code, I/O, logging): profile with "
             "with_stack=True to find it.",
}


def _device_findings(trace: RankTrace, config: AnalysisConfig, w: Window, device: int, idle_ns: int,
                     parts: dict[str, iv.Intervals], gaps: pd.DataFrame) -> list[Finding]:
    by_cause_ns = {c: iv.measure(parts[c]) for c in CAUSES}
    out = []
    share = idle_ns / w.dur_ns if w.dur_ns else 0.0
    if share >= config.gpu_idle_min_fraction:
        main = max(CAUSES, key=lambda c: by_cause_ns[c])
        hot = python_hotspots(python_frames(trace), parts["host_python"]) if main == "host_python" else []
        named = f" ({', '.join(h['function'] for h in hot)})" if hot else ""
        out.append(
            Finding(
                id="gpu_idle",
                rank=trace.rank,
                title=(f"GPU {device} is idle {share:.0%} of the {w.dur_ns / 1e6:.1f} ms window, mostly "
                       f"{main.replace('_', ' ')}{named}"),
                evidence={
                    "device": device,
                    "idle_us": us(idle_ns),
                    "idle_fraction_of_window": frac(idle_ns, w.dur_ns),
                    "window_us": us(w.dur_ns),
                    "idle_by_cause_us": {c: us(v) for c, v in by_cause_ns.items()},
                    "host_python_hotspots": hot,
                    "largest_gaps": gaps.head(3)[["start_us", "dur_us", "step", "cause"]].to_dict("records"),
                },
                recommendation=_ADVICE[main],
                impact_us=idle_ns / 1000.0,
            )
        )
    sync_ns = by_cause_ns["sync"]
    if w.dur_ns and sync_ns / w.dur_ns >= config.sync_idle_fraction:
        calls = sync_calls(trace)
        in_window = calls[(calls["end_ns"] > w.start_ns) & (calls["ts_ns"] < w.end_ns)]
        top = (
            in_window.groupby("name", observed=True)["dur_ns"]
            .agg(["count", "sum"])
            .sort_values("sum", ascending=False)
            .head(5)
        )
        out.append(
            Finding(
                id="sync_point",
                rank=trace.rank,
                title=f"Host-device synchronisation leaves GPU {device} idle {sync_ns / w.dur_ns:.0%} of the window",
                evidence={
                    "device": device,
                    "gpu_idle_caused_us": us(sync_ns),
                    "gpu_idle_caused_fraction_of_window": frac(sync_ns, w.dur_ns),
                    "measure": "GPU idle while the host is in a synchronising call, plus the idle right after it "
                    f"returns while the drained queue refills (at most {config.sync_refill_max_us:g} us per call)",
                    "calls": [
                        {"name": str(n), "count": int(r["count"]), "host_time_us": us(r["sum"])}
                        for n, r in top.iterrows()
                    ],
                    "steps": int(len(trace.steps)),
                },
                recommendation=(
                    "Each sync drains the launch queue. Keep values on the device (accumulate losses as tensors, "
                    "log every N steps), avoid .item()/.cpu()/print of CUDA tensors inside the step, and prefer "
                    "non_blocking copies and events over cudaDeviceSynchronize."
                ),
                impact_us=sync_ns / 1000.0,
            )
        )
    return out


def _launch_bound(trace: RankTrace, config: AnalysisConfig, w: Window, device: int, idle: iv.Intervals,
                  parts: dict[str, iv.Intervals]) -> list[Finding]:
    """The GPU waits for the host to issue each next kernel: its queue is empty (kernels start as soon
    as they are launched), and kernels finish faster than the host launches them."""
    idle_ns = iv.measure(idle)
    if not w.dur_ns or idle_ns / w.dur_ns < config.gpu_idle_min_fraction:
        return []
    q = launch_queue(trace)
    q = q[
        (q["device"] == device).to_numpy() & (q["ts_ns"] >= w.start_ns).to_numpy() & (q["ts_ns"] < w.end_ns).to_numpy()
    ]
    if len(q) < config.launch_bound_min_kernels:
        return []
    # a device's own dispatch delay (the least any kernel waits after its launch: ~2-5 us on NVIDIA, ~16 us on an
    # MI300X VF) is no queue: a kernel found the queue empty when it started within the bar of that floor
    floor_ns = float(np.percentile(q["delay_ns"].to_numpy(), 5))
    empty_below_ns = max(config.launch_queue_empty_us * 1000, max(floor_ns, 0.0) + config.launch_queue_empty_us * 1000)
    empty = q["delay_ns"].to_numpy() < empty_below_ns
    empty_share = float(empty.mean())
    launch_ts = np.sort(q["launch_ts_ns"].to_numpy())
    interval_ns = float(np.median(np.diff(launch_ts))) if len(launch_ts) > 1 else float("inf")
    kernel_ns = float(np.median(q["dur_ns"].to_numpy()))
    # idle the host's launching explains (traced launch overhead or untraced Python between ops),
    # as opposed to waiting for data, a sync, or a slow CPU op
    host_side_ns = iv.measure(parts["host_launch"]) + iv.measure(parts["host_python"]) + iv.measure(parts["other"])
    if not (empty_share >= config.launch_queue_empty_share and kernel_ns < interval_ns
            and host_side_ns >= config.launch_idle_share * idle_ns):
        return []
    # the cost: idle gaps that end with a kernel which found the queue empty and are as short as launch
    # overhead is (a few launch intervals), less data/sync/compute; a long untraced stretch before a
    # kernel is the host's own work, not launching (gpu_idle reports it as such)
    gap_end = q["ts_ns"].to_numpy()[empty]
    k = np.searchsorted(idle[1], gap_end, side="left")
    kk = np.minimum(k, idle[0].size - 1)
    ok = (k < idle[0].size) & (idle[1][kk] == gap_end)
    ok &= (gap_end - idle[0][kk]) <= max(config.launch_gap_max_intervals * interval_ns, empty_below_ns)
    waited = iv.union(idle[0][kk][ok], gap_end[ok])
    host_side = iv.union(np.concatenate([parts[c][0] for c in ("host_launch", "host_python", "other")]),
                         np.concatenate([parts[c][1] for c in ("host_launch", "host_python", "other")]))
    cost_ns = iv.measure(iv.intersect(waited, host_side))
    steps = max(len(trace.steps), 1)
    return [
        Finding(
            id="launch_bound",
            rank=trace.rank,
            title=(f"Launch-bound: GPU {device} waits for the host to launch each kernel "
                   f"({empty_share:.0%} start as soon as launched; median kernel {kernel_ns / 1000:.1f} us, "
                   f"one launch every {interval_ns / 1000:.1f} us)"),
            evidence={
                "device": device,
                "kernels": int(len(q)),
                "kernels_per_step": round(len(q) / steps, 1),
                "queue_empty_share": round(empty_share, 4),
                "queue_empty_below_us": us(empty_below_ns),
                "dispatch_floor_us": us(floor_ns),
                "median_kernel_us": us(kernel_ns),
                "median_launch_interval_us": us(interval_ns),
                "gpu_idle_waiting_for_launches_us": us(cost_ns),
                "window_us": us(w.dur_ns),
            },
            recommendation=(
                "Fewer, larger kernels: torch.compile (fusion), CUDA graphs (torch.compile(mode='reduce-overhead') "
                "or torch.cuda.graphs), a larger batch, fused optimizers (foreach/fused=True); keep Python work "
                "out of the step."
            ),
            impact_us=cost_ns / 1000.0,
        )
    ]
