"""How far the step's matrix work runs from the device's peak: FLOPs per step, MFU, achieved TFLOP/s and GB/s per
kernel and operator, and a roofline class for each.

FLOPs and bytes come from the ops' recorded shapes (``model.flops``, ``model.opwork``); peaks from the device's name
(``model.peaks``). A kernel's share of its op's work is its share of the op's kernel time, so a kernel's achieved
rate is its op's: an op's FLOPs are never credited to one of its kernels alone. Fractions are of the window (the
complete ProfilerSteps) and say so; unknown is null: a trace without shapes, a device not in the table (or a CPU).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.flops import peak_dtype
from kinetoscope.analyze.model.opwork import counted_ops, op_kernels
from kinetoscope.analyze.model.peaks import DevicePeak, peak_for
from kinetoscope.analyze.model.results import Efficiency, EfficiencyResult, KernelEfficiency, OperatorEfficiency
from kinetoscope.analyze.model.timeline import kernels, window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import us

#: matrix work below this share of its peak (time-weighted over the window) makes a finding
LOW_EFFICIENCY = 0.35
#: the operators a finding names
TOP_OPERATORS = 5
#: a finding needs the ops whose FLOPs are known to hold at least this share of the matrix kernels' time (a 2021
#: trace tells its GEMMs' FLOPs but not its convolutions': judging the step by its GEMMs alone would mislead)
MIN_JUDGED_SHARE = 0.5


def _device_name(trace: RankTrace, device: int) -> str | None:
    props = trace.meta.device_properties
    for i, p in enumerate(props):
        pid = p.get("id", i)
        if isinstance(pid, (int, float)) and int(pid) == device:
            name = p.get("name")
            return name if isinstance(name, str) and name else None
    return None


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), digits)


def _rate(amount: float | None, ns: float, scale: float) -> float | None:
    return amount / ns / scale if amount is not None and ns > 0 and np.isfinite(amount) else None


def _peaks(peak: DevicePeak | None, kind: str, input_type: str | None) -> tuple[float | None, str | None, float | None]:
    if peak is None:
        return None, None, None
    if kind == "matrix":
        dtype = peak_dtype(input_type, peak.tf32_tflops is not None)
        return (peak.tflops(dtype) if dtype else None), dtype, peak.memory_gbps
    return None, None, peak.memory_gbps


def _sum_or_none(values: pd.Series) -> float | None:
    return float(values.sum()) if len(values) and values.notna().all() else None


def compute(trace: RankTrace) -> tuple[Efficiency, pd.DataFrame]:
    """The rank's efficiency record and its per-call table (one row per counted op in the window)."""
    w = window(trace)
    ops = counted_ops(trace)
    ks = op_kernels(trace)
    inside = ((ops["ts_ns"] >= w.start_ns) & (ops["ts_ns"] < w.end_ns)).to_numpy() if len(ops) else np.array([], bool)
    per_op_ns = ks.groupby("op")["dur_ns"].sum() if len(ks) else pd.Series(dtype=np.int64)
    calls = ops.assign(kernel_ns=per_op_ns.reindex(np.arange(len(ops))).fillna(0).to_numpy(np.float64))[inside]
    # the device of most counted kernels, else of most kernels; a trace without GPU work names none (its
    # deviceProperties can list GPUs it did not use)
    devices = ks.groupby("device")["dur_ns"].sum() if len(ks) else pd.Series(dtype=np.int64)
    if not len(devices) and trace.has_gpu and len(kernels(trace)):
        devices = kernels(trace).groupby("device")["dur_ns"].sum()
    device = int(devices.idxmax()) if len(devices) else None
    name = _device_name(trace, device) if device is not None else None
    peak = peak_for(name)
    matrix = calls[(calls["kind"] == "matrix").to_numpy()]
    known = matrix[matrix["flops"].notna().to_numpy()]
    matrix_flops = float(known["flops"].sum()) if len(matrix) else None
    steps = trace.steps
    complete = steps[~steps["partial"].to_numpy()] if "partial" in steps else steps
    n_steps = int(len(complete)) if w.basis in ("profiler_steps", "inferred_steps") else 0
    mean_step_ns = float(complete["dur_ns"].mean()) if n_steps else None
    flops_per_step = (float(known["flops"].sum()) / n_steps if n_steps and len(known) and len(known) == len(matrix)
                      else None)
    by_dtype = known.assign(dt=[peak_dtype(t, peak is not None and peak.tf32_tflops is not None)
                                for t in known["input_type"]]).groupby("dt")["flops"].sum() if len(known) else None
    main_dtype = str(by_dtype.idxmax()) if by_dtype is not None and len(by_dtype) else None
    main_peak = peak.tflops(main_dtype) if peak is not None and main_dtype else None
    mfu = (flops_per_step / (mean_step_ns * 1e-9) / (main_peak * 1e12)
           if flops_per_step is not None and mean_step_ns and main_peak else None)

    rows = []
    for (op_name, kind), g in calls.groupby(["name", "kind"], sort=False):
        unknown_flops = g["flops"].isna() if kind == "matrix" else g["bytes"].isna()
        why = g.loc[unknown_flops, "why"]
        input_type = g["input_type"].dropna().iloc[0] if g["input_type"].notna().any() else None
        flops = _sum_or_none(g["flops"]) if kind == "matrix" else None
        nbytes = _sum_or_none(g["bytes"])
        ns = float(g["kernel_ns"].sum())
        peak_tf, dtype, peak_bw = _peaks(peak, kind, input_type)
        tflops, gbps = _rate(flops, ns, 1e3), _rate(nbytes, ns, 1.0)
        of_peak = tflops / peak_tf if tflops is not None and peak_tf else None
        of_bw = gbps / peak_bw if gbps is not None and peak_bw and kind == "memory" else None
        intensity = flops / nbytes if flops is not None and nbytes else None
        roofline = None
        if intensity is not None and peak_tf and peak_bw:
            roofline = "compute" if intensity >= peak_tf * 1e12 / (peak_bw * 1e9) else "memory"
        rows.append(OperatorEfficiency(
            name=str(op_name), kind=str(kind), calls=int(len(g)), calls_unknown=int(unknown_flops.sum()),
            why_unknown=str(why.iloc[0]) if len(why) else None, input_type=input_type, flops=flops, bytes=nbytes,
            kernel_time_us=round(ns / 1000.0, 3), achieved_tflops=_r(tflops), peak_tflops=peak_tf, peak_dtype=dtype,
            achieved_gbps=_r(gbps), peak_gbps=peak_bw, arithmetic_intensity=_r(intensity),
            roofline=roofline, of_peak_fraction=_r(of_peak, 4), bandwidth_of_peak=_r(of_bw, 4),
            lost_us=_r(ns / 1000.0 * (1.0 - of_peak)) if of_peak is not None else None))
    operators = sorted(rows, key=lambda o: (-(o.lost_us or 0.0), -o.kernel_time_us, o.name))

    kernel_rows: list[KernelEfficiency] = []
    if len(ks) and len(calls):
        in_window = ks[np.isin(ks["op"].to_numpy(), calls.index.to_numpy())]
        op_ns = calls["kernel_ns"]
        total = op_ns.reindex(in_window["op"]).to_numpy(np.float64)
        own = in_window["dur_ns"].to_numpy(np.float64)
        share = np.divide(own, total, out=np.zeros_like(own), where=total > 0)  # 0-length kernels do no work
        k = in_window.assign(kind=calls["kind"].reindex(in_window["op"]).to_numpy(object),
                             input_type=calls["input_type"].reindex(in_window["op"]).to_numpy(object),
                             flops=calls["flops"].reindex(in_window["op"]).to_numpy(np.float64) * share,
                             bytes=calls["bytes"].reindex(in_window["op"]).to_numpy(np.float64) * share)
        for (kname, kind), g in k.groupby(["name", "kind"], sort=False):
            ns = float(g["dur_ns"].sum())
            input_type = g["input_type"].dropna().iloc[0] if g["input_type"].notna().any() else None
            flops = _sum_or_none(g["flops"]) if kind == "matrix" else None
            nbytes = _sum_or_none(g["bytes"])
            peak_tf, dtype, peak_bw = _peaks(peak, str(kind), input_type)
            tflops, gbps = _rate(flops, ns, 1e3), _rate(nbytes, ns, 1.0)
            of_peak = tflops / peak_tf if tflops is not None and peak_tf else None
            of_bw = gbps / peak_bw if gbps is not None and peak_bw and kind == "memory" else None
            kernel_rows.append(KernelEfficiency(
                name=str(kname), kind=str(kind), calls=int(len(g)), time_us=round(ns / 1000.0, 3),
                flops=_r(flops, 0), bytes=_r(nbytes, 0), achieved_tflops=_r(tflops), peak_tflops=peak_tf,
                peak_dtype=dtype, achieved_gbps=_r(gbps), peak_gbps=peak_bw, of_peak_fraction=_r(of_peak, 4),
                bandwidth_of_peak=_r(of_bw, 4)))
    kernel_rows.sort(key=lambda r: (-r.time_us, r.name))
    matrix_ops = [o for o in operators if o.kind == "matrix"]
    timed = [o for o in matrix_ops if o.of_peak_fraction is not None and o.kernel_time_us > 0]
    matrix_ns = sum(o.kernel_time_us for o in matrix_ops)
    judged_us = sum(o.kernel_time_us for o in timed)
    weighted = (sum((o.of_peak_fraction or 0.0) * o.kernel_time_us for o in timed)
                / sum(o.kernel_time_us for o in timed)) if timed else None
    result = Efficiency(
        device=name, peak_source=peak.source if peak is not None else None, peak_tflops=main_peak,
        peak_dtype=main_dtype if main_peak is not None else None,
        flops_per_step=flops_per_step, steps=n_steps, mean_step_us=us(mean_step_ns),
        mfu=_r(mfu, 4), matrix_flops=matrix_flops, matrix_ops=int(len(matrix)),
        matrix_ops_unknown=int(matrix["flops"].isna().sum()), shapes_recorded=bool(len(trace.shapes)),
        matrix_kernel_time_us=round(matrix_ns, 3),
        judged_kernel_time_fraction=_r(judged_us / matrix_ns, 4) if matrix_ns else None,
        matrix_of_peak_fraction=_r(weighted, 4), window=w.describe(),
        kernels=kernel_rows, operators=operators)
    return result, calls.reset_index(drop=True)


#: copies that change a tensor's layout (a transpose made contiguous before or after a GEMM)
_LAYOUT_COPIES = frozenset({"aten::contiguous", "aten::clone", "aten::copy_", "aten::_to_copy"})
#: layout copies taking this share of the matrix kernels' time support the transposes hypothesis
LAYOUT_COPY_SHARE = 0.1


def _hypotheses(op: OperatorEfficiency, calls: pd.DataFrame, trace: RankTrace,
                result: Efficiency) -> list[dict[str, Any]]:
    """The usual causes of a slow matrix op, each with what the evidence says (supported / not supported / unknown)."""
    mine = calls[(calls["name"] == op.name).to_numpy()]
    shapes = trace.shapes.set_index("row")["input_dims"].reindex(mine["row"].to_numpy()).dropna().astype(str)
    import msgspec

    sizes: list[int] = []
    for text in shapes.unique().tolist():
        try:
            dims = msgspec.json.decode(text)
        except msgspec.DecodeError:
            continue
        sizes += [int(x) for d in dims if isinstance(d, list) for x in d[-2:] if isinstance(x, int)]
    fp32 = op.input_type == "float"
    odd = [s for s in sizes if s % 8]
    out = [
        {"cause": "fp32 inputs: no Tensor Cores unless TF32 is allowed (bf16/fp16 autocast or "
                  "torch.backends.cuda.matmul.allow_tf32)",
         "evidence": "supported" if fp32 else ("not supported" if op.input_type else "unknown"),
         "detail": f"input type {op.input_type!r}"},
        {"cause": "matrix sizes not multiples of 8 (16 for some kernels): Tensor Core tiles padded or not used",
         "evidence": ("supported" if odd else "not supported") if sizes else "unknown",
         "detail": f"{len(odd)} of {len(sizes)} inner sizes not a multiple of 8" if sizes else "no shapes"},
    ]
    if op.calls and op.kernel_time_us:
        per_call = op.kernel_time_us / op.calls
        out.append({"cause": "small matrices (a small batch or sequence): too little work per kernel to fill the GPU",
                    "evidence": "supported" if per_call < 20.0 else "not supported",
                    "detail": f"{per_call:.1f} us of kernel time per call"})
    copies_us = sum(o.kernel_time_us for o in result.operators if o.name in _LAYOUT_COPIES)
    if result.matrix_kernel_time_us:
        out.append({"cause": "layout transposes: tensors copied to make them contiguous around the GEMMs (the whole "
                             "window's copies, not this operator's alone)",
                    "evidence": "supported" if copies_us >= LAYOUT_COPY_SHARE * result.matrix_kernel_time_us
                    else "not supported",
                    "detail": f"{copies_us:.1f} us of contiguous/clone/copy_ kernels beside "
                              f"{result.matrix_kernel_time_us:.1f} us of matrix kernels"})
    return out


@register("efficiency", "Matrix work against the device's peak")
def analyze_efficiency(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """FLOPs per step from recorded shapes, MFU, and achieved TFLOP/s and GB/s per kernel and operator against the
    device's peak; a finding when matrix work runs far below peak."""
    result, calls = compute(trace)
    findings: list[Finding] = []
    share = result.matrix_of_peak_fraction
    judged = result.judged_kernel_time_fraction
    if share is not None and share < LOW_EFFICIENCY and judged is not None and judged >= MIN_JUDGED_SHARE:
        worst = [o for o in result.operators if o.kind == "matrix" and o.lost_us][:TOP_OPERATORS]
        lost_us = sum(o.lost_us or 0.0 for o in result.operators if o.kind == "matrix")
        w = window(trace)
        findings.append(Finding(
            id="low_matrix_efficiency", rank=trace.rank,
            title=f"Matrix kernels run at {share:.0%} of {result.device}'s peak",
            evidence={
                "device": result.device, "peak_source": result.peak_source,
                "matrix_kernel_time_us": result.matrix_kernel_time_us,
                "matrix_of_peak_fraction": share,
                "judged_kernel_time_fraction": judged,
                "lost_us": round(lost_us, 3),
                "lost_window_fraction": round(lost_us * 1000.0 / w.dur_ns, 4) if w.dur_ns else None,
                "window": w.describe(),
                "mfu": result.mfu,
                "operators": [{"name": o.name, "calls": o.calls, "kernel_time_us": o.kernel_time_us,
                               "achieved_tflops": o.achieved_tflops, "peak_tflops": o.peak_tflops,
                               "peak_dtype": o.peak_dtype, "of_peak_fraction": o.of_peak_fraction,
                               "lost_us": o.lost_us, "hypotheses": _hypotheses(o, calls, trace, result)}
                              for o in worst],
            },
            recommendation="Look at the named operators first: use bf16/fp16 (torch.autocast) or allow TF32 for fp32 "
                           "matmuls, pad matrix sizes to multiples of 8 (16 for fp8), grow the batch per GPU, and "
                           "avoid layout copies around the GEMMs. The time lost is an upper bound: no kernel reaches "
                           "its peak.",
            impact_us=lost_us,
            # the peak is the datasheet's: what the trace's shapes could attain is not known, and no expert reading
            # has judged this finding yet (tests/expert): information until one does, its worth still recorded
            ceiling="info",
            ceiling_reason="what these shapes could attain is not known",
        ))
    return AnalysisResult(key="efficiency", metrics=EfficiencyResult(efficiency=result), tables={"efficiency": calls},
                          findings=tuple(findings))
