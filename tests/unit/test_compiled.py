"""Issue 31 item 4: compiled code, on a trace built so each region's entries, the GPU time inside them and the
Triton kernels are known by construction."""

from __future__ import annotations

from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.analyzers.compiled import analyze_compiled
from kinetoscope.analyze.model.compiled import triton_kind
from kinetoscope.analyze.model.config import DEFAULT_CONFIG
from kinetoscope.analyze.model.results import CompiledResult

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]


def compiled_steps() -> TraceBuilder:
    """Two 1000 us steps: frame 0's region (+10..+300; compile 0, then 1 in the second step: a recompile) launches a
    100 us pointwise and a 50 us reduction kernel; a graph break resumes in frame 1's region (+400..+500) with a 30 us
    persistent reduction; an eager 200 us GEMM (+600..+800); the compiled backward (+700..+800) launches 40 us."""
    b = TraceBuilder(device_properties=A100)
    for k in range(2):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.op(f"Torch-Compiled Region: 0/{k}", t + 10, 290)
        b.op("CompiledFunction", t + 12, 280)
        b.kernel(t + 20, 100, name="triton_poi_fused_add_mul_0", launch_at=t + 15)
        b.kernel(t + 125, 50, name="triton_red_fused_sum_1", launch_at=t + 30)
        b.op("Torch-Compiled Region: 1/0", t + 400, 100)
        b.kernel(t + 410, 30, name="triton_per_fused__softmax_0", launch_at=t + 405)
        b.kernel(t + 600, 200, name="ampere_sgemm_128x64_nn", launch_at=t + 595)
        b.op("CompiledFunctionBackward", t + 700, 100)
        b.kernel(t + 800, 40, name="triton_poi_fused_mul_2", launch_at=t + 710)
    return b


def test_regions_time_compiled_against_eager_triton_kernels_and_the_recompiled_frame(tmp_path):
    r = load_built(tmp_path, compiled_steps()).ranks[0]
    typed = analyze_compiled(r, DEFAULT_CONFIG).metrics
    assert isinstance(typed, CompiledResult) and typed.compiled is not None
    assert typed.compiled.regions[0].region == "0/0" and typed.compiled.triton_kernels[0].kind == "pointwise"
    m = typed.to_dict()["compiled"]  # the report's JSON object
    assert [(x["region"], x["entries"], x["host_us"], x["gpu_us"], x["kernels"]) for x in m["regions"]] == [
        ("0/0", 1, 290.0, 150.0, 2), ("0/1", 1, 290.0, 150.0, 2), ("1/0", 2, 200.0, 60.0, 2),
        ("backward", 2, 200.0, 80.0, 2)]
    assert m["regions_entered_per_step"] == 2.0  # frame 0's region and, after the graph break, frame 1's
    # kernels: 2 x (100 + 50 + 30 + 40) = 440 us compiled, 2 x 200 = 400 us eager
    assert (m["gpu_compiled_us"], m["gpu_eager_us"]) == (440.0, 400.0)
    assert m["gpu_compiled_fraction"] == 440 / 840
    assert m["host_compiled_us"] == 2 * (290 + 100 + 100)
    assert m["recompiled_frames"] == {"0": [0, 1]}
    top = m["triton_kernels"][0]
    assert top == {"name": "triton_poi_fused_add_mul_0", "kind": "pointwise", "fused": "add_mul", "count": 2,
                   "time_us": 200.0, "regions": ["0/0", "0/1"]}
    assert [t["name"] for t in m["triton_kernels"]] == ["triton_poi_fused_add_mul_0", "triton_red_fused_sum_1",
                                                         "triton_poi_fused_mul_2", "triton_per_fused__softmax_0"]


def test_triton_kernel_names():
    assert triton_kind("triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1") == \
        ("reduction", "_unsafe_view_add_mean_mul_pow_rsqrt")
    assert triton_kind("triton_tem_fused_mm_0") == ("template", "mm")
    assert triton_kind("ampere_sgemm_128x64_nn") is None


def test_an_eager_trace_has_no_compiled_block(tmp_path):
    b = TraceBuilder(device_properties=A100).step(0, 0, 100)
    b.kernel(10, 50, launch_at=5)
    assert analyze_compiled(load_built(tmp_path, b).ranks[0], DEFAULT_CONFIG).metrics == CompiledResult(compiled=None)
