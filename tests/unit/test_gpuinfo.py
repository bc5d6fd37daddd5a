"""The GPU summary (analyze.gpuinfo): the Tensor Core rule, each device's facts and Tensor Core share, and the
occupancy estimated from the launch parameters Kineto records. Answers known by construction."""

from __future__ import annotations

import json

import pytest
from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.views.gpuinfo import (
    device_summary,
    kernel_launches,
    occupancy,
    occupancy_summary,
    uses_tensor_cores,
)

A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_051_572_224, "computeMajor": 8,
        "computeMinor": 0, "numSms": 108, "maxThreadsPerMultiprocessor": 2048, "regsPerMultiprocessor": 65536,
        "sharedMemPerMultiprocessor": 167_936, "warpSize": 32}


@pytest.mark.parametrize("name", [
    "volta_h884gemm_64x64_ldg8_nn", "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn",
    "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4>(Params)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
    "nvjet_tst_128x192_64x4_2x1_v_bz_coopA_NTN", "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64>>(Params)",
    "fmha_cutlassF_f16_aligned_64x64_rf_sm80", "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize64x128x128",
    "Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1_ABV0", "void wmma_example(half*, half*)",
])
def test_names_that_say_tensor_cores(name):
    assert uses_tensor_cores(name) is True


@pytest.mark.parametrize("name", [
    "ampere_sgemm_32x32_sliced1x4_nn", "volta_sgemm_128x64_nn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda, c10::Float8_e4m3fn>(int)",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "void implicit_convolve_sgemm<float, float, 1024, 6, 7>(int)",
])
def test_names_that_say_nothing_are_unknown_not_no(name):
    assert uses_tensor_cores(name) is None


def test_each_device_with_its_tensor_core_share_of_kernel_time(tmp_path):
    """An A100: a 300 us Tensor Core GEMM and a 100 us elementwise kernel per step, two steps: 75% of 0.8 ms."""
    b = TraceBuilder(device_properties=[A100])
    for s in range(2):
        t = s * 1000
        b.step(s, t, 1000).kernel(t + 100, 300, name="ampere_fp16_s16816gemm_fp16_128x128_nn")
        b.kernel(t + 500, 100, name="void at::native::vectorized_elementwise_kernel<4>(int)")
    (row,) = device_summary(load_built(tmp_path, b).ranks[0]).to_dict("records")
    assert (row["name"], row["memory_bytes"], row["compute_capability"], row["sms"]) == (
        "NVIDIA A100-SXM4-80GB", 85_051_572_224, "8.0", 108)
    assert row["kernels"] == 4 and row["kernel_ms"] == 0.8 and row["tensor_core_ms"] == 0.6
    assert row["tensor_core_fraction_of_kernel_time"] == 0.75


def test_occupancy_from_the_launch_parameters():
    """216 blocks of 256 threads (8 warps), 64 registers per thread, on 108 SMs of 64 warps and 64K registers: 2
    blocks per SM bring 16 warps (25%); registers let 4 blocks fit (50% theoretical). 1,080 blocks: 10 per SM would
    bring 125%, the theoretical 50% bounds it. 48 KiB of shared memory per block: 3 blocks fit (37.5%)."""
    assert occupancy(216, 256, 64, 0, A100) == (2.0, 0.25)
    assert occupancy(1080, 256, 64, 0, A100) == (10.0, 0.5)
    assert occupancy(1080, 256, 32, 48 * 1024, A100) == (10.0, 0.375)
    assert occupancy(216, 256, 64, 0, {"name": "no limits"}) is None


def test_kernel_launches_are_read_from_the_file_and_summed_by_duration(tmp_path):
    """Two kernels of the window: 300 us at 25% (216 blocks) and 100 us at 50% (1,080 blocks): the duration-weighted
    occupancy is 31.25%, blocks per SM (2 x 300 + 10 x 100) / 400 = 4; a kernel before the window is left out."""
    b = TraceBuilder(device_properties=[A100]).step(1, 1000, 1000)
    b.kernel(0, 50, name="warmup")
    b.kernel(1100, 300, name="k1").kernel(1500, 100, name="k2")
    doc = b.document()
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            grid = [216, 1, 1] if e["name"] != "k2" else [1080, 1, 1]
            e["args"].update({"grid": grid, "block": [256, 1, 1], "registers per thread": 64, "shared memory": 0})
    data = json.dumps(doc).encode()
    path = tmp_path / "t.json"
    path.write_bytes(data)
    from kinetoscope.analyze.ingest.loader import load_trace

    launches = kernel_launches(data, load_trace(path).ranks[0])
    assert list(launches["name"]) == ["k1", "k2"]
    assert list(launches["est_achieved_occupancy_fraction"]) == [0.25, 0.5]
    (summary,) = occupancy_summary(launches).to_dict("records")
    assert summary["kernels_estimated"] == 2 and summary["est_achieved_occupancy_fraction"] == pytest.approx(0.3125)
    assert summary["blocks_per_sm"] == pytest.approx(4.0)


def test_occupancy_of_a_real_h100_kernel_agrees_with_kinetos_estimate():
    """The bundled H100 trace's first kernel: grid 564, block 128, 32 registers on 132 SMs: 4.27 blocks per SM,
    17.1 warps of 64: Kineto recorded 27% (its 'est. achieved occupancy %'), ours 26.7% from the same parameters."""
    from pathlib import Path

    from kinetoscope.analyze.ingest.loader import read_bytes

    path = Path(__file__).resolve().parents[2] / "sample_traces" / "real" / "h100_bert-small.json.gz"
    from kinetoscope.analyze.ingest.loader import load_trace

    launches = kernel_launches(read_bytes(path), load_trace(path).ranks[0])
    first = launches.iloc[0]
    assert (first["blocks"], first["threads_per_block"], first["registers_per_thread"]) == (564, 128, 32)
    assert first["blocks_per_sm"] == pytest.approx(564 / 132)
    assert first["est_achieved_occupancy_fraction"] == pytest.approx(564 / 132 * 4 / 64)
    assert round(first["est_achieved_occupancy_fraction"] * 100) == 27
