"""The GPU summary (what the TensorBoard profiler plugin's Overview showed): each device's name, memory, compute
capability and SM count (the trace's deviceProperties), the share of kernel time in kernels that run on Tensor
Cores (as far as their names say), and the estimated achieved occupancy and blocks per SM from the launch
parameters Kineto records for each kernel (grid, block, registers per thread, shared memory)."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from kinetoscope.analyze.model.timeline import gpu_work, kind_mask, window
from kinetoscope.analyze.model.trace import RankTrace, trace_view

#: kernel names that say the kernel runs on Tensor Cores (or AMD's matrix cores): MMA instructions and their shapes
#: (HMMA/IMMA/XMMA/WGMMA, 884/1688/16816/16832), CUTLASS and cuBLAS tensor-op kernels (tensorop, sm80/sm90 xmma
#: and gemm kernels), cuBLASLt's Hopper kernels (nvjet), FlashAttention and fused multi-head attention kernels,
#: FP8 GEMMs (e4m3/e5m2), AMD MFMA/WMMA kernels (Tensile names carry the instruction: MI32x32x8). A name that says
#: none of these says nothing: unknown, never "no".
TENSOR_CORE_RE = re.compile(
    r"hmma|imma|xmma|wgmma|wmma|mfma|tensorop|tensor_op|nvjet|gemmsm90|sm90_|sm100_|cutlass_80_|cutlass3x"
    r"|884gemm|1688gemm|16816gemm|16832gemm|_s1688|_h1688|_s16816|_h16816|_i8816|_i16832"
    r"|flash_fwd|flash_bwd|flash_attn|flashattn|pytorch_flash|fmha|flash::"
    r"|(?:gemm|matmul|_mm_|scaled_mm).*(?:e4m3|e5m2|fp8)|(?:e4m3|e5m2|fp8).*(?:gemm|matmul)"
    r"|_mi\d+x\d+x\d+",
    re.IGNORECASE,
)


def uses_tensor_cores(name: str) -> bool | None:
    """True where the kernel's name says it runs on Tensor Cores, None where it does not say."""
    return True if TENSOR_CORE_RE.search(name) else None


@trace_view
def device_summary(trace: RankTrace) -> pd.DataFrame:
    """One row per GPU of the rank (the trace's deviceProperties, and any device its kernels ran on): name, memory,
    compute capability, SMs, kernel time in the window (ms, the kernels' durations added: two streams' kernels at
    once both count), and the share of that time in kernels whose names say Tensor Cores."""
    w = window(trace)
    work = gpu_work(trace)
    k = work[kind_mask(work, ("kernel",))]
    k = k[((k["ts_ns"] >= w.start_ns) & (k["ts_ns"] < w.end_ns)).to_numpy()]
    dur = k["dur_ns"].to_numpy(np.int64)
    names = k["name"].astype("category")  # each distinct name judged once (a trace holds ~10^6 kernels)
    says = np.array([uses_tensor_cores(str(c)) is True for c in names.cat.categories] + [False], dtype=bool)
    tc = says[names.cat.codes.to_numpy()]  # code -1 (no name) reads the last entry: False
    dev = k["device"].to_numpy(dtype=np.float64, na_value=np.nan)
    props = {int(p["id"]) if isinstance(p.get("id"), (int, float)) else i: p
             for i, p in enumerate(trace.meta.device_properties)}
    devices = sorted(set(props) | {int(d) for d in dev[np.isfinite(dev)]})
    rows = []
    for d in devices:
        p = props.get(d, {})
        mine = dev == d
        total = int(dur[mine].sum())
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        rows.append({
            "device": d,
            "name": p.get("name"),
            "memory_bytes": p.get("totalGlobalMem"),
            "compute_capability": f"{major}.{minor}" if major is not None and minor is not None else None,
            "sms": p.get("numSms"),
            "kernels": int(mine.sum()),
            "kernel_ms": total / 1e6,
            "tensor_core_ms": int(dur[mine & tc].sum()) / 1e6,
            "tensor_core_fraction_of_kernel_time": (int(dur[mine & tc].sum()) / total) if total else None,
        })
    return pd.DataFrame(rows, columns=["device", "name", "memory_bytes", "compute_capability", "sms", "kernels",
                                       "kernel_ms", "tensor_core_ms", "tensor_core_fraction_of_kernel_time"])


class _LaunchArgs(msgspec.Struct, gc=False):
    device: Any = None
    grid: Any = None
    block: Any = None
    registers: Any = msgspec.field(name="registers per thread", default=None)
    shared: Any = msgspec.field(name="shared memory", default=None)
    recorded_occupancy: Any = msgspec.field(name="est. achieved occupancy %", default=None)


class _KernelEvent(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    args: _LaunchArgs | None = None


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw] = []  # noqa: N815 (the trace's key)


def _dims(value: Any) -> int | None:
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and v >= 1 for v in value):
        return int(math.prod(int(v) for v in value))
    return None


def occupancy(
    blocks: int, threads: int, registers: int, shared: int, props: dict[str, Any]
) -> tuple[float, float] | None:
    """(blocks per SM, estimated achieved occupancy) of a launch, the way Kineto estimates it: blocks per SM is the
    grid over the SMs; the warps those blocks bring are capped by how many blocks fit an SM at once (by its warps,
    registers and shared memory: the theoretical occupancy), over the SM's warps. None without the device's limits."""
    # Kineto writes maxThreadsPerMultiprocessor (CUDA's own struct spells it ...MultiProcessor)
    sms = props.get("numSms")
    max_threads = props.get("maxThreadsPerMultiprocessor") or props.get("maxThreadsPerMultiProcessor")
    warp = props.get("warpSize") or 32
    if not sms or not max_threads or threads < 1:
        return None
    warps_per_block = math.ceil(threads / warp)
    max_warps = max_threads // warp
    fit = [max_warps // warps_per_block]
    regs_per_sm = props.get("regsPerMultiprocessor")
    if regs_per_sm and registers:
        fit.append(regs_per_sm // (registers * warps_per_block * warp))
    smem_per_sm = props.get("sharedMemPerMultiprocessor")
    if smem_per_sm and shared:
        fit.append(smem_per_sm // shared)
    theoretical = min(fit) * warps_per_block / max_warps
    per_sm = blocks / sms
    return per_sm, min(per_sm * warps_per_block / max_warps, theoretical)


def kernel_launches(data: bytes, trace: RankTrace) -> pd.DataFrame:
    """Every kernel of the window with its launch parameters, read from the trace's JSON ``data`` again (the loader
    does not keep them): name, device, duration (ms), blocks, threads per block, registers per thread, shared
    memory (bytes), blocks per SM and estimated achieved occupancy (ours from the parameters and the device's
    limits; Kineto's recorded estimate where the trace has no deviceProperties). Blank where the trace says nothing."""
    w = window(trace)
    lo, hi = w.start_ns / 1000.0, w.end_ns / 1000.0
    props = {int(p["id"]) if isinstance(p.get("id"), (int, float)) else i: p
             for i, p in enumerate(trace.meta.device_properties)}
    try:
        doc = msgspec.json.decode(data, type=_Doc)
    except msgspec.DecodeError:
        doc = _Doc(traceEvents=msgspec.json.decode(data, type=list[msgspec.Raw]))
    decode = msgspec.json.Decoder(_KernelEvent)
    rows = []
    for raw in doc.traceEvents:
        try:
            e = decode.decode(raw)
        except msgspec.DecodeError:
            continue
        if e.ph != "X" or e.cat.lower() != "kernel" or not (lo <= e.ts < hi) or e.args is None:
            continue
        a = e.args
        blocks, threads = _dims(a.grid), _dims(a.block)
        regs = a.registers if isinstance(a.registers, (int, float)) else None
        shared = a.shared if isinstance(a.shared, (int, float)) else None
        device = int(a.device) if isinstance(a.device, (int, float)) else None
        est = None
        if blocks is not None and threads is not None and device in props:
            est = occupancy(blocks, threads, int(regs or 0), int(shared or 0), props[device])
        recorded = a.recorded_occupancy if isinstance(a.recorded_occupancy, (int, float)) else None
        rows.append({"name": e.name, "device": device, "dur_ms": e.dur / 1000.0, "blocks": blocks,
                     "threads_per_block": threads, "registers_per_thread": regs, "shared_memory_bytes": shared,
                     "blocks_per_sm": est[0] if est else None,
                     "est_achieved_occupancy_fraction": est[1] if est else
                     (recorded / 100.0 if recorded is not None else None)})
    return pd.DataFrame(rows, columns=["name", "device", "dur_ms", "blocks", "threads_per_block",
                                       "registers_per_thread", "shared_memory_bytes", "blocks_per_sm",
                                       "est_achieved_occupancy_fraction"])


def occupancy_summary(launches: pd.DataFrame) -> pd.DataFrame:
    """Per device: kernels with an estimate, and over them (weighted by each kernel's duration, as the TensorBoard
    plugin did) the mean estimated achieved occupancy and the mean blocks per SM."""
    cols = ["device", "kernels_estimated", "kernels", "est_achieved_occupancy_fraction", "blocks_per_sm"]
    rows = []
    for device, g in launches.groupby("device", dropna=False, sort=True):
        known = g[g["est_achieved_occupancy_fraction"].notna()]
        weight = known["dur_ms"].to_numpy(np.float64)
        total = weight.sum()
        occ = float((known["est_achieved_occupancy_fraction"] * weight).sum() / total) if total > 0 else None
        bps = known["blocks_per_sm"].astype("float64")
        per_sm = float((bps * weight).sum() / total) if total > 0 and bps.notna().all() and len(bps) else None
        rows.append({"device": None if device != device else device, "kernels_estimated": len(known),
                     "kernels": len(g), "est_achieved_occupancy_fraction": occ, "blocks_per_sm": per_sm})
    return pd.DataFrame(rows, columns=cols)
