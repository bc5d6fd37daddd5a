"""The efficiency page's tables and roofline, from a rank's typed ``efficiency`` record: everything the screen
draws, computed here (the screen only draws)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kinetoscope.analyze.model.results import Efficiency

#: the operator table's columns, in the order shown
OPERATOR_COLUMNS = ("name", "kind", "calls", "input_type", "kernel_time_us", "achieved_tflops", "peak_tflops",
                    "peak_dtype", "of_peak_fraction", "achieved_gbps", "arithmetic_intensity", "roofline", "lost_us",
                    "calls_unknown", "why_unknown")
KERNEL_COLUMNS = ("name", "kind", "calls", "time_us", "achieved_tflops", "peak_tflops", "peak_dtype",
                  "of_peak_fraction", "achieved_gbps", "peak_gbps", "bandwidth_of_peak")


@dataclass(frozen=True)
class EfficiencyView:
    #: one line each: the device and its peak, MFU, FLOPs per step (None: not shown)
    device: str | None
    peak: str | None
    mfu: float | None
    flops_per_step: float | None
    #: why no number can be given (no shapes, no peak), or None
    note: str | None
    operators: pd.DataFrame
    kernels: pd.DataFrame
    #: the roofline: one point per operator with FLOPs and bytes (intensity, achieved TFLOP/s, name, kind)
    points: pd.DataFrame
    #: the roof for the main dtype: (intensity, TFLOP/s) along min(peak, bandwidth x intensity), log-spaced
    roof: pd.DataFrame


def efficiency_view(eff: Efficiency | None) -> EfficiencyView | None:
    """The view of a rank's ``efficiency`` record; None where the report has none (its analyzer failed)."""
    if eff is None:
        return None
    operators = pd.DataFrame([o.to_dict() for o in eff.operators], columns=list(OPERATOR_COLUMNS))
    kernels = pd.DataFrame([k.to_dict() for k in eff.kernels], columns=list(KERNEL_COLUMNS))
    known = operators[operators["arithmetic_intensity"].notna() & operators["achieved_tflops"].notna()]
    points = pd.DataFrame({"operator": known["name"], "kind": known["kind"],
                           "intensity": known["arithmetic_intensity"].astype(float),
                           "tflops": known["achieved_tflops"].astype(float)})
    peak = eff.peak_tflops
    bw = next((r.peak_gbps for r in eff.kernels if r.peak_gbps), None) \
        or next((r.peak_gbps for r in eff.operators if r.peak_gbps), None)
    roof = pd.DataFrame(columns=["intensity", "tflops"])
    if peak and bw:
        lo = min([1.0, *points["intensity"].tolist()]) / 2
        hi = max([peak * 1e3 / bw * 4, *points["intensity"].tolist()]) * 2
        x = np.geomspace(lo, hi, 64)
        roof = pd.DataFrame({"intensity": x, "tflops": np.minimum(peak, bw * x / 1e3)})
    note = None
    if not eff.shapes_recorded:
        note = "The trace records no input shapes: FLOPs cannot be counted (capture with record_shapes=True)."
    elif peak is None:
        note = (f"No peak is known for {eff.device or 'this device'}: achieved rates are shown, MFU and the "
                "share of peak are not.")
    return EfficiencyView(
        device=eff.device,
        peak=f"{peak:,.1f} TFLOP/s {eff.peak_dtype} ({eff.peak_source})" if peak else None,
        mfu=eff.mfu, flops_per_step=eff.flops_per_step, note=note,
        operators=operators, kernels=kernels, points=points, roof=roof)
