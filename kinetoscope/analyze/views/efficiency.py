"""The efficiency page's tables and roofline, from a rank's report entry (``efficiency``): everything the screen
draws, computed here (the screen only draws)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

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


def efficiency_view(entry: dict[str, Any]) -> EfficiencyView | None:
    """The view of a rank's ``efficiency`` entry; None where the report has none."""
    eff = entry.get("efficiency")
    if not eff:
        return None
    operators = pd.DataFrame(eff.get("operators") or [], columns=list(OPERATOR_COLUMNS))
    kernels = pd.DataFrame(eff.get("kernels") or [], columns=list(KERNEL_COLUMNS))
    known = operators[operators["arithmetic_intensity"].notna() & operators["achieved_tflops"].notna()]
    points = pd.DataFrame({"operator": known["name"], "kind": known["kind"],
                           "intensity": known["arithmetic_intensity"].astype(float),
                           "tflops": known["achieved_tflops"].astype(float)})
    peak, bw = eff.get("peak_tflops"), None
    for rows in (eff.get("kernels") or [], eff.get("operators") or []):
        bw = bw or next((r.get("peak_gbps") for r in rows if r.get("peak_gbps")), None)
    roof = pd.DataFrame(columns=["intensity", "tflops"])
    if peak and bw:
        lo = min([1.0, *points["intensity"].tolist()]) / 2
        hi = max([peak * 1e3 / bw * 4, *points["intensity"].tolist()]) * 2
        x = np.geomspace(lo, hi, 64)
        roof = pd.DataFrame({"intensity": x, "tflops": np.minimum(peak, bw * x / 1e3)})
    note = None
    if not eff.get("shapes_recorded"):
        note = "The trace records no input shapes: FLOPs cannot be counted (capture with record_shapes=True)."
    elif peak is None:
        note = (f"No peak is known for {eff.get('device') or 'this device'}: achieved rates are shown, MFU and the "
                "share of peak are not.")
    return EfficiencyView(
        device=eff.get("device"),
        peak=f"{peak:,.1f} TFLOP/s {eff.get('peak_dtype')} ({eff.get('peak_source')})" if peak else None,
        mfu=eff.get("mfu"), flops_per_step=eff.get("flops_per_step"), note=note,
        operators=operators, kernels=kernels, points=points, roof=roof)
