"""Operator and kernel views: self and total time by construction, kernels by name, Tensor Cores by name."""

from __future__ import annotations

import pytest
from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.views.ops import kernel_table, op_table


def test_self_time_is_the_op_less_its_direct_children(tmp_path):
    """Per step: aten::linear [0,100] calls aten::addmm [10,40] (which calls aten::copy_ [15,25]) and
    aten::relu [50,70]. Self: linear 100-30-20 = 50, addmm 30-10 = 20, copy_ 10, relu 20 (us); two steps."""
    b = TraceBuilder()
    for k in range(2):
        t = 1000 * k
        b.step(k, t, 1000)
        b.op("aten::linear", t, 100).op("aten::addmm", t + 10, 30).op("aten::copy_", t + 15, 10)
        b.op("aten::relu", t + 50, 20)
    table = op_table(load_built(tmp_path, b).ranks[0]).set_index("name")
    assert table.loc["aten::linear", "calls"] == 2
    assert table.loc["aten::linear", "total_ms"] == pytest.approx(0.200)
    assert table.loc["aten::linear", "self_ms"] == pytest.approx(0.100)
    assert table.loc["aten::addmm", "self_ms"] == pytest.approx(0.040)
    assert table.loc["aten::copy_", "self_ms"] == pytest.approx(0.020)
    assert table.loc["aten::relu", "self_ms"] == pytest.approx(0.040)
    assert list(table.index)[0] == "aten::linear"  # the most self time first
    assert "ProfilerStep#0" not in table.index  # record_function containers are not operators


def test_kernels_by_name_with_tensor_cores_only_where_the_name_says(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000)
    for t, d in ((100, 10), (200, 20), (300, 30)):
        b.kernel(t, d, name="sm80_xmma_gemm_f16f16_f16f32", stream=7)
    b.kernel(400, 40, name="vectorized_elementwise_kernel", stream=8)
    table = kernel_table(load_built(tmp_path, b).ranks[0]).set_index("name")
    gemm = table.loc["sm80_xmma_gemm_f16f16_f16f32"]
    assert (gemm["count"], gemm["total_ms"], gemm["mean_ms"], gemm["max_ms"]) == (3, 0.06, 0.02, 0.03)
    assert gemm["streams"] == "7" and gemm["share_of_kernel_time"] == pytest.approx(0.6)
    assert gemm["tensor_cores"] is True and table.loc["vectorized_elementwise_kernel", "tensor_cores"] is None
