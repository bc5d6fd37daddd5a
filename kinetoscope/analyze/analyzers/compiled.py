"""Compiled code: torch.compile's regions entered per step (with one compiled function, each region beyond the
first is a graph break), the host and GPU time inside them against eager code, the Triton kernels Inductor
generated (their kind and the ops they fused) and the frames compiled more than once (the ``recompile`` finding's
compile ids, linked to the region they belong to)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kinetoscope.analyze.model import intervals as iv
from kinetoscope.analyze.model.analysis import AnalysisResult, register
from kinetoscope.analyze.model.compiled import BACKWARD, compiled_regions, gpu_region_of, triton_kind
from kinetoscope.analyze.model.config import AnalysisConfig
from kinetoscope.analyze.model.results import Compiled, CompiledRegion, CompiledResult, TritonKernel
from kinetoscope.analyze.model.timeline import gpu_work, kind_mask, step_at, window
from kinetoscope.analyze.model.trace import RankTrace
from kinetoscope.analyze.model.units import frac, us

#: Triton kernels listed (by time), the rest counted
LISTED_KERNELS = 10


def _busy(frame: pd.DataFrame, lo: int, hi: int) -> int:
    return iv.measure(iv.clip(iv.union(frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy()), lo, hi))


@register("compiled", "Compiled code")
def analyze_compiled(trace: RankTrace, config: AnalysisConfig) -> AnalysisResult:
    """Regions entered per step, time compiled against eager (host and GPU), Triton kernels, recompiled frames."""
    regions = compiled_regions(trace)
    if regions.empty:
        return AnalysisResult(key="compiled", metrics=CompiledResult(compiled=None))
    w = window(trace)
    inside = regions[((regions["end_ns"] > w.start_ns) & (regions["ts_ns"] < w.end_ns)).to_numpy()]
    steps = trace.steps
    complete = steps[~steps["partial"].to_numpy()] if len(steps) and "partial" in steps else steps
    n_steps = int(len(complete))
    forward = inside[(inside["region"] != BACKWARD).to_numpy()]
    in_step = step_at(trace, forward["ts_ns"].to_numpy()) >= 0 if n_steps else np.zeros(len(forward), dtype=bool)
    work = gpu_work(trace)
    work = work[((work["end_ns"] > w.start_ns) & (work["ts_ns"] < w.end_ns)).to_numpy()]
    kernels = work[kind_mask(work, ("kernel",))]
    region_of = gpu_region_of(trace).reindex(kernels.index)
    compiled_k = kernels[region_of.notna().to_numpy()]
    eager_k = kernels[region_of.isna().to_numpy()]
    by_region: list[CompiledRegion] = []
    for region, g in inside.groupby("region", sort=False):
        mine = kernels[(region_of == region).to_numpy()]
        first = g.iloc[0]
        by_region.append(CompiledRegion(
            region=str(region),
            frame=int(first["frame"]) if first["frame"] >= 0 else None,
            compile_id=int(first["compile_id"]) if first["compile_id"] >= 0 else None,
            entries=int(len(g)),
            host_us=us(_busy(g, w.start_ns, w.end_ns)),
            gpu_us=us(_busy(mine, w.start_ns, w.end_ns)) if trace.has_gpu else None,
            kernels=int(len(mine)),
        ))
    by_region.sort(key=lambda r: (r.frame is None, r.frame or 0, r.compile_id or 0))
    frames: dict[int, list[int]] = {}
    for f, c in zip(regions["frame"], regions["compile_id"], strict=False):
        if f >= 0:
            frames.setdefault(int(f), [])
            if int(c) not in frames[int(f)]:
                frames[int(f)].append(int(c))
    triton: list[TritonKernel] = []
    for name, g in kernels.groupby(kernels["name"].astype(str), observed=True, sort=False):
        tk = triton_kind(str(name))
        if tk is None:
            continue
        where = sorted({str(x) for x in region_of.reindex(g.index).dropna()})
        triton.append(TritonKernel(name=str(name), kind=tk[0], fused=tk[1], count=int(len(g)),
                                   time_us=us(int(g["dur_ns"].sum())), regions=where))
    triton.sort(key=lambda t: (-float(t.time_us or 0.0), t.name))
    gpu_compiled = _busy(compiled_k, w.start_ns, w.end_ns)
    gpu_eager = _busy(eager_k, w.start_ns, w.end_ns)
    kernel_ns = _busy(kernels, w.start_ns, w.end_ns)
    metrics = Compiled(
        regions=by_region,
        regions_entered_per_step=round(int(in_step.sum()) / n_steps, 3) if n_steps else None,
        host_compiled_us=us(_busy(inside, w.start_ns, w.end_ns)),
        host_compiled_fraction=frac(_busy(inside, w.start_ns, w.end_ns), w.dur_ns),
        gpu_compiled_us=us(gpu_compiled) if trace.has_gpu else None,
        gpu_eager_us=us(gpu_eager) if trace.has_gpu else None,
        gpu_compiled_fraction=frac(gpu_compiled, kernel_ns) if trace.has_gpu else None,
        fraction_of="window (host); the union of the window's kernels (gpu)",
        triton_kernels=triton[:LISTED_KERNELS],
        triton_kernels_left_out=max(0, len(triton) - LISTED_KERNELS),
        recompiled_frames={str(f): sorted(c) for f, c in sorted(frames.items()) if len(c) > 1},
    )
    return AnalysisResult(key="compiled", metrics=CompiledResult(compiled=metrics), tables={"regions": inside})
