"""Efficiency on real GPU traces with shapes: GEMMs checked by hand from the raw events, and no kernel above its
device's peak on any shared trace.

Each hand check names one op call by its start (``ts`` in the file, microseconds) and works from what the file
says about it: its "Input Dims" and "Input type", the runtime calls of its thread inside its span, and the kernels
of their correlation ids. FLOPs are 2*m*n*k (torch's count for mm/addmm); achieved TFLOP/s are FLOPs over the
summed kernel time; the peak is the datasheet's dense figure for the dtype (model/peaks.py).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from kinetoscope.analyze.analyzers.efficiency import compute
from kinetoscope.analyze.ingest.jobs import is_trace_file
from kinetoscope.analyze.ingest.loader import load_rank

ROOT = Path(__file__).resolve().parents[2]
#: ../shared beside the main checkout, or two levels up from a worktree under wt/
SHARED = next((p for p in (ROOT.parent / "shared" / "traces", ROOT.parent.parent / "shared" / "traces")
               if p.is_dir()), ROOT.parent / "shared" / "traces")

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="the shared traces are not here")

H100_OWLV2 = "TraceLens/tests/traces/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"
V100_RESNET = "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
B200_EAGER = "TraceLens/tests/traces/b200/eager_trace.json.gz"
MI300X_RESNET = "TraceLens/tests/traces/mi300/resnet_act_checkpoint.json.gz"

#: (trace, op, its ts in the file (us, as written), FLOPs, kernel time (ns), device peak TFLOP/s for its dtype)
HAND_CHECKS = [
    # H100 SXM, bf16: Input Dims [[1024], [5185, 1024], [1024, 1024], [], []] -> m=5185, k=1024, n=1024:
    # 2*5185*1024*1024 = 10,873,733,120 FLOPs. Its thread's calls inside it: cudaFuncGetAttributes, cudaMemsetAsync,
    # three cudaFuncSetAttribute, and cudaLaunchKernelExC (correlation 504453) -> one kernel
    # sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_..., dur 20.704 us. 10873733120 / 20704 ns =
    # 525.20 TFLOP/s, against 989.4 (bf16 dense): 0.5308 of peak.
    (H100_OWLV2, "aten::addmm", "1419116718866.112", 2 * 5185 * 1024 * 1024, 20704, 989.4),
    # V100 (DGXS: SXM2 rates), fp32, no TF32 on Volta: Input Dims [[1000], [32, 2048], [2048, 1000], [], []] ->
    # 2*32*1000*2048 = 131,072,000 FLOPs. Launches inside it: a copy kernel (5 us: the bias broadcast into the
    # output), volta_sgemm_64x32_sliced1x4_tn (25 us), splitKreduce_kernel (3 us): 33 us of kernels. 131072000 / 33000
    # ns = 3.972 TFLOP/s against 15.7 (fp32): 0.2530 of peak.
    (V100_RESNET, "aten::addmm", "1623142623927785.0", 2 * 32 * 1000 * 2048, 33000, 15.7),
    # B200, bf16: Input Dims [[2880], [888, 512], [512, 2880], [], []] -> 2*888*2880*512 = 2,618,818,560 FLOPs; one
    # kernel nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN (cuLaunchKernelEx, correlation 1317), 6.208 us: 421.85 TFLOP/s
    # against 2250 (bf16 dense): 0.1875 of peak.
    (B200_EAGER, "aten::addmm", "1365627882935.517", 2 * 888 * 2880 * 512, 6208, 2250.0),
    # MI300X, bf16: Input Dims [[1000, 10], [10, 512]] -> 2*1000*512*10 = 10,240,000 FLOPs; hipExtModuleLaunchKernel
    # (correlation 6546) -> Cijk_Ailk_Bjlk_BBS_BH_Bias_..., 5.559 us: 1.842 TFLOP/s against 1307.4: 0.0014 of peak.
    (MI300X_RESNET, "aten::mm", "3743411246245.642", 2 * 1000 * 512 * 10, 5559, 1307.4),
]


@pytest.mark.parametrize("case", HAND_CHECKS, ids=lambda c: c[0].split("/")[-1][:30])
def test_gemm_flops_and_achieved_tflops_by_hand(case):
    path, op, ts_us, flops, kernel_ns, peak = case
    result, calls = compute(load_rank(SHARED / path))
    ts_ns = int(Decimal(ts_us) * 1000)  # exact: epoch-scale microseconds do not fit a float's 53 bits
    call = calls[(calls["name"] == op).to_numpy() & (calls["ts_ns"] == ts_ns).to_numpy()]
    assert len(call) == 1
    assert call["flops"].iloc[0] == flops
    assert call["kernel_ns"].iloc[0] == kernel_ns
    row = next(o for o in result.operators if o.name == op)
    assert row.peak_tflops == peak


def test_h100_owlv2_step():
    """The OWLv2 capture: every matrix op's shapes tell its FLOPs; the bmm's run on Turing-era cutlass_75 kernels at
    about a twentieth of the bf16 peak (the finding's top operator)."""
    from kinetoscope.analyze.analyzers.efficiency import analyze_efficiency
    from kinetoscope.analyze.model.config import AnalysisConfig

    trace = load_rank(SHARED / H100_OWLV2)
    result, _ = compute(trace)
    assert result.device == "NVIDIA H100 80GB HBM3" and result.peak_dtype == "bf16"
    assert result.matrix_ops_unknown == 0 and result.steps == 1
    found = analyze_efficiency(trace, AnalysisConfig()).findings
    assert [f.id for f in found] == ["low_matrix_efficiency"]
    top = found[0].evidence["operators"][0]
    assert top["name"] == "aten::bmm" and top["of_peak_fraction"] < 0.1


def _shared_paths() -> list[Path]:
    return sorted(p for p in SHARED.rglob("*") if is_trace_file(p)) if SHARED.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("path", _shared_paths(), ids=lambda p: p.name[:40])
def test_no_kernel_above_its_devices_peak(path):
    result, _ = compute(load_rank(path))
    above = [(k.name, k.achieved_tflops, k.peak_tflops) for k in result.kernels
             if k.of_peak_fraction is not None and k.of_peak_fraction > 1]
    above += [(o.name, o.achieved_tflops, o.peak_tflops) for o in result.operators
              if o.of_peak_fraction is not None and o.of_peak_fraction > 1]
    assert above == []
