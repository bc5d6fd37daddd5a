"""The app's views, computed in analyze: the timeline (rows per stream and nesting depth, spans under a pixel merged,
launch <-> kernel links), allocations by operator, input shapes, the Distributed view. Answers known by construction."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.views.ops import allocations_by_op, op_shapes
from kinetoscope.analyze.views.spans import host_depth, step_range_ms, timeline_view


def nested_trace() -> TraceBuilder:
    """Step 0 (0-1000 us): forward (100-600) holding aten::linear (150-400) holding aten::addmm (200-350), whose
    cudaLaunchKernel (210-220) runs a 100 us gemm at 300; then 300 ops of 1 us each from 600 to 900 (one per us)."""
    b = TraceBuilder().step(0, 0, 1000).step(1, 1000, 1000)
    b.op("forward", 100, 500, cat="user_annotation").op("aten::linear", 150, 250).op("aten::addmm", 200, 150)
    b.kernel(300, 100, launch_at=210, launch_dur=10)
    for i in range(300):
        b.op("aten::tiny", 600 + i, 0.5)
    return b


def test_nesting_depth_per_thread(tmp_path):
    r = load_built(tmp_path, nested_trace()).ranks[0]
    hd = host_depth(r)
    names = r.events["name"].astype(str).to_numpy()[hd["row"].to_numpy()]
    depth = dict(zip(names, hd["depth"], strict=True))
    assert depth["ProfilerStep#0"] == 0 and depth["forward"] == 1 and depth["aten::linear"] == 2
    assert depth["aten::addmm"] == 3 and depth["cudaLaunchKernel"] == 4 and depth["aten::tiny"] == 1


def test_rows_ms_from_the_window_start_and_the_launch_links(tmp_path):
    r = load_built(tmp_path, nested_trace()).ranks[0]
    start, end = step_range_ms(r, 0, 0)
    assert (start, end) == (0.0, 1.0)
    v = timeline_view(r, start, end, width_px=100_000)  # 0.01 ns per pixel: nothing merged
    assert v.rows == ["steps", "GPU 0 · stream 7", "thread 100 (training)", "thread 100 (training) · 1",
                      "thread 100 (training) · 2", "thread 100 (training) · 3", "thread 100 (training) · 4"]
    # step row, kernel, step op, 3 ops, launch, tiny
    assert v.merged_spans == 0 and v.total_spans == 1 + 1 + 1 + 3 + 1 + 300
    k = v.spans[v.spans["kind"] == "kernel"].iloc[0]
    assert (k["start_ms"], k["end_ms"]) == (0.3, 0.4)
    assert k["link"] == "launched by cudaLaunchKernel at 0.210 ms on thread 100"
    call = v.spans[v.spans["name"] == "cudaLaunchKernel"].iloc[0]
    assert call["link"] == "runs gemm_kernel on GPU 0 · stream 7 at 0.300 ms" and call["link_id"] == k["link_id"]
    assert call["kind"] == "runtime call" and call["row"] == "thread 100 (training) · 4"
    assert len(set(v.spans["link_id"])) == len(v.spans) - 1  # only the launch and its kernel share one
    assert list(v.steps["step"]) == [0]


def test_spans_under_a_pixel_are_merged_never_dropped(tmp_path):
    r = load_built(tmp_path, nested_trace()).ranks[0]
    v = timeline_view(r, 0.0, 1.0, width_px=100)  # 10 us per pixel: the 300 tiny ops fall into 30 blocks of 10
    tiny = v.spans[v.spans["name"].str.contains("aten::tiny")]
    assert len(tiny) == 30 and set(tiny["spans"]) == {10}
    assert tiny["dur_ms"].sum() == pytest.approx(300 * 0.0005)  # their busy time, not the blocks' extent
    assert tiny["name"].iloc[0] == "10 spans (cpu op), 0.005 ms busy, first: aten::tiny"
    assert v.merged_spans == 300 and v.resolution_ms == pytest.approx(0.01)
    assert int(v.spans["spans"].sum()) == v.total_spans  # every span in the range is in a mark


def test_allocations_are_charged_to_the_innermost_op_and_frees_to_the_allocation(tmp_path):
    """linear (100-500 us) holds addmm (150-250); relu at 600-700. Blocks A-D allocated in linear, addmm (two) and
    no op; addmm's 4 MiB block B freed inside relu (charged to addmm, which made it: was charged to relu, whose
    "net" went negative while addmm's stayed at 6 MiB, more than it holds); a 3 MiB block Z the window never saw
    allocated freed at 850. Per device the held column adds up to the change of allocated memory: 1 MiB."""
    from kinetoscope.analyze.views.ops import EARLIER, allocation_events

    b = TraceBuilder().step(0, 0, 1000)
    b.op("aten::linear", 100, 400).op("aten::addmm", 150, 100).op("aten::relu", 600, 100)
    b.memory(120, 1 << 20, allocated=1 << 20, addr=0xA)          # in linear, outside addmm
    b.memory(160, 4 << 20, allocated=5 << 20, addr=0xB)          # in addmm
    b.memory(170, 2 << 20, allocated=7 << 20, addr=0xC)          # in addmm
    b.memory(650, -(4 << 20), allocated=3 << 20, addr=0xB)       # B freed while relu runs
    b.memory(800, 1 << 20, allocated=4 << 20, addr=0xD)          # in no op
    b.memory(850, -(3 << 20), allocated=1 << 20, addr=0xE)       # Z: allocated before the window
    r = load_built(tmp_path, b).ranks[0]
    t = allocations_by_op(r)
    assert list(t["op"]) == ["aten::addmm", "aten::linear", "(no op)", EARLIER]
    t = t.set_index("op")
    assert t.loc["aten::addmm", ["allocations", "allocated_mib", "freed_mib", "held_mib", "largest_mib"]].tolist() == \
        [2, 6.0, 4.0, 2.0, 4.0]
    assert t.loc["aten::linear", "held_mib"] == 1.0 and t.loc["(no op)", "held_mib"] == 1.0
    assert t.loc[EARLIER, ["allocations", "allocated_mib", "freed_mib", "held_mib"]].tolist() == [0, 0.0, 3.0, -3.0]
    assert t["held_mib"].sum() == 1.0  # 1 + 4 + 2 - 4 + 1 - 3 MiB over the window
    e = allocation_events(r)
    assert e["time_ms"].tolist() == [0.12, 0.16, 0.17, 0.8] and e["size_mib"].tolist() == [1.0, 4.0, 2.0, 1.0]
    assert e["op"].tolist() == ["aten::linear", "aten::addmm", "aten::addmm", "(no op)"]
    assert e["freed_at_ms"].iloc[1] == 0.65 and e["lifetime_ms"].iloc[1] == pytest.approx(0.49)
    assert e["freed_at_ms"].isna().tolist() == [True, False, True, True]
    assert allocation_events(r, 0.15, 0.5)["time_ms"].tolist() == [0.16, 0.17]  # a range: what starts in it

def test_ops_by_input_shapes_read_from_the_file(tmp_path):
    b = TraceBuilder().step(0, 0, 1000)
    b.op("aten::mm", 100, 10, **{"Input Dims": [[64, 128], [128, 32]]})
    b.op("aten::mm", 200, 30, **{"Input Dims": [[64, 128], [128, 32]]})
    b.op("aten::mm", 300, 50, **{"Input Dims": [[8, 8], [8, 8]]}).op("aten::relu", 400, 5)
    path = b.write(tmp_path / "t.json")
    from kinetoscope.analyze.ingest.loader import load_trace

    t = op_shapes(path.read_bytes(), load_trace(path).ranks[0])
    rows = {(r.name, r.input_shapes): (r.calls, round(r.total_ms, 6)) for r in t.itertuples()}
    assert rows == {("aten::mm", "[[64, 128], [128, 32]]"): (2, 0.04), ("aten::mm", "[[8, 8], [8, 8]]"): (1, 0.05),
                    ("aten::relu", ""): (1, 0.005)}
    assert list(t["name"])[0] == "aten::mm" and json.loads(t["input_shapes"].iloc[0]) == [[8, 8], [8, 8]]


def test_memory_timeline_keeps_each_bins_dip_and_cpu_has_no_reserved_figure(tmp_path):
    """Was: each bin kept only its maximum (the V100 sample's timeline never went under 98 MiB while the per-step
    chart sat at 0), and the CPU allocator's "Total Reserved" 0 made a fragmentation of -24.3 MiB."""
    from kinetoscope.analyze.analyzers.memory import TIMELINE_POINTS
    from kinetoscope.analyze.report.builder import build_report

    b = TraceBuilder().step(0, 0, 10 * TIMELINE_POINTS)
    for i in range(2 * TIMELINE_POINTS):  # allocated alternates 100 MiB, 0: every bin of two holds a peak and a dip
        b.memory(1 + 4 * i, (100 << 20) if i % 2 == 0 else -(100 << 20), allocated=(100 << 20) if i % 2 == 0 else 0,
                 reserved=200 << 20)
    b.memory(5, 1 << 20, allocated=1 << 20, reserved=0, device_type=0, device_id=-1)
    b.memory(6, 2 << 20, allocated=3 << 20, reserved=0, device_type=0, device_id=-1)
    rep = build_report(load_built(tmp_path, b))
    tl = rep.results[0]["memory"].tables["memory_timeline"]
    cuda = tl[tl["device"] == "cuda:0"]
    assert len(cuda) == TIMELINE_POINTS
    assert set(cuda["allocated_mib"]) == {100.0} and set(cuda["allocated_min_mib"]) == {0.0}
    cpu = next(d for d in rep.ranks[0]["memory"]["devices"] if d["device"] == "cpu")
    assert cpu["peak_reserved_bytes"] is None and cpu["fragmentation_bytes_max"] is None
    assert cpu["peak_allocated_bytes"] == 3 << 20


def test_rounding_overlaps_are_not_nesting_and_step_labels_are_thinned(tmp_path):
    """Kineto rounds to the microsecond: step 1 "starts" 1 ns before step 0 ends; it is not step 0's child.
    With 300 steps in view, a label every k-th step (each needs ~60 px), every step still drawn."""
    b = TraceBuilder()
    for i in range(300):
        b.step(i, i * 100.0 - (0.001 if i else 0), 100.0).op("aten::mm", i * 100.0 + 10, 50)
    r = load_built(tmp_path, b).ranks[0]
    hd = host_depth(r)
    names = r.events["name"].astype(str).to_numpy()[hd["row"].to_numpy()]
    steps = hd[[n.startswith("ProfilerStep") for n in names]]
    assert set(steps["depth"]) == {0}
    v = timeline_view(r, width_px=1200)  # 20 labels fit
    assert len(v.steps) == 20 and list(v.steps["step"][:3]) == [0, 15, 30]
    assert int(v.spans[v.spans["row"] == "steps"]["spans"].sum()) == 300


def idle_gpu_trace(kernels: int = 1000, period_us: float = 10.0, busy_us: float = 3.7) -> TraceBuilder:
    """One 10 ms step; a 3.7 us kernel every 10 us on one stream: the GPU is busy 37% of the window, idle 63%."""
    b = TraceBuilder().step(0, 0, kernels * period_us)
    for i in range(kernels):
        b.kernel(i * period_us, busy_us, launch_at=i * period_us, launch_dur=1.0)
    return b


def test_a_merged_block_is_drawn_with_the_share_of_it_its_spans_cover(tmp_path):
    """Whole window, 1600 px: 6.25 us per pixel, so every 3.7 us kernel falls under a pixel. Each block is drawn as
    dark as the time it holds: its opacity times its drawn width adds up to the GPU's busy time (3.7 ms of the
    10 ms window), never to the blocks' extent (was: every block solid, a GPU 63% idle drawn as solid busy)."""
    r = load_built(tmp_path, idle_gpu_trace()).ranks[0]
    v = timeline_view(r, width_px=1600)
    gpu = v.spans[v.spans["row"] == "GPU 0 · stream 7"]
    assert int(gpu["spans"].sum()) == 1000 and v.merged_spans == 2000  # the kernels and their launches
    ink_ms = float((gpu["busy_fraction"] * (gpu["end_ms"] - gpu["start_ms"])).sum())
    assert ink_ms == pytest.approx(3.7, abs=1e-9) and gpu["dur_ms"].sum() == pytest.approx(3.7, abs=1e-9)
    assert gpu["busy_fraction"].max() < 1.0
    # a range narrow enough is read again at its own resolution: every kernel drawn alone, solid
    z = timeline_view(r, 1.0, 1.1, width_px=1600)
    zk = z.spans[z.spans["row"] == "GPU 0 · stream 7"]
    assert z.kernels == 10 and z.kernels_drawn == 10 and set(zk["busy_fraction"]) == {1.0}
    assert float((zk["end_ms"] - zk["start_ms"]).sum()) == pytest.approx(0.037, abs=1e-9)


def test_a_block_of_overlapping_spans_counts_their_union_once(tmp_path):
    """Two 4 us ops overlapping by 2 us on one row (deeper than MAX_DEPTH nesting shares a row) in one 10 us pixel:
    6 us busy, not 8."""
    import pandas as pd

    from kinetoscope.analyze.views.spans import _union_in_groups


    frame = pd.DataFrame({"row": ["a", "a", "a", "b"], "kind": ["k"] * 4, "bin": [0, 0, 0, 0],
                          "ts_ns": [1000, 3000, 9000, 0], "end_ns": [5000, 7000, 9500, 4000]})
    assert list(_union_in_groups(frame, ["row", "kind", "bin"])) == [4000, 2000, 500, 4000]


def test_the_distributed_view_does_not_call_unknown_gpu_time_idle(tmp_path):
    """Two ranks, a gemm and an all-reduce per 2 ms step. Rank 1 also replays a CUDA graph whose kernels were not
    recorded (400 us before its next kernel): its GPU idle is not judged on the Overview, and the Distributed view
    leaves its 'neither' part blank instead of charting it as idle (was: charted as GPU idle)."""
    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report
    from kinetoscope.analyze.views.distributed import distributed_view

    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2)
        for s in range(3):
            t = s * 2000
            b.step(s, t, 2000).kernel(t + 600, 600, name="gemm", launch_at=t + 550)
            b.kernel(t + 1300, 500, stream=20, name=nccl)
            if r == 1:
                b.runtime("cudaGraphLaunch", t + 150, 10, correlation=90_000 + s)
        b.write(tmp_path / "job" / f"rank-{r}.json")
    trace = load_trace(tmp_path / "job")
    report = build_report(trace)
    assert report.ranks[0]["gpu"]["idle_fraction"] is not None and report.ranks[1]["gpu"]["idle_fraction"] is None
    view = distributed_view(trace, report).ranks.set_index("rank")
    assert view.loc[0, "other_ms"] == pytest.approx(0.9)  # 2 ms - 0.6 gemm - 0.5 all-reduce, per step
    assert pd.isna(view.loc[1, "other_ms"]) and view.loc[1, "compute_only_ms"] == pytest.approx(0.6)


def test_findings_whose_savings_overlap_are_grouped():
    """Four fixes saving 10, 10, 3 and 5 ms: A and B are one cause (together 10), C and D add up (together 8), A and
    D add up, B and C overlap (together 11 of 13): groups {A, B, C}, D alone (not a group)."""
    from kinetoscope.analyze.report.savings import overlapping_groups

    together = {(0, 1): 10.0, (0, 2): 13.0, (0, 3): 15.0, (1, 2): 11.0, (1, 3): 15.0, (2, 3): 8.0}
    assert overlapping_groups([10.0, 10.0, 3.0, 5.0], lambda pair: together[pair]) == [(0, 1, 2)]
    assert overlapping_groups([10.0, 5.0], lambda pair: 15.0 - 0.5) == []  # within rounding: they add up
    assert overlapping_groups([10.0], lambda pair: 0.0) == []


def test_the_loader_stall_and_the_gpu_idle_it_causes_share_one_saving():
    """The bundled V100 ResNet-50 trace: the GPU is idle 44% of the window, mostly waiting on the DataLoader
    (gpu_idle's causes), so gpu_idle's fix is the loader's: both findings are one group, worth the loader fix once."""
    from pathlib import Path

    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report
    from kinetoscope.analyze.report.savings import shared_savings

    trace = load_trace(Path(__file__).resolve().parents[2] / "sample_traces" / "real" / "v100_resnet50_2021.json.gz")
    report = build_report(trace)
    groups = {tuple(sorted(report.findings[i].id for i in g.findings)): g for g in shared_savings(trace, report)}
    loader = next(f for f in report.findings if f.id == "loader_stall")
    assert ("gpu_idle", "loader_stall") in groups
    assert groups[("gpu_idle", "loader_stall")].together["saving_us_per_step"] == loader.estimate["saving_us_per_step"]


def module_trace() -> TraceBuilder:
    """One 1 ms step run by train.py's main(): the module Net_0 (50-800 us) calls Linear_0 (100-300) and Linear_1
    (400-700); each Linear runs aten::linear holding aten::addmm, which launches a GEMM (200 us, then 100 us); Net_0
    then runs aten::relu (720-780), launching a 50 us kernel."""
    b = TraceBuilder().step(0, 0, 1000)
    b.op("train.py(10): main", 0, 900, cat="python_function")
    b.op("nn.Module: Net_0", 50, 750, cat="python_function")
    b.op("nn.Module: Linear_0", 100, 200, cat="python_function")
    b.op("nn.Module: Linear_1", 400, 300, cat="python_function")
    b.op("aten::linear", 110, 180).op("aten::addmm", 120, 160).kernel(150, 200, launch_at=130, launch_dur=5)
    b.op("aten::linear", 410, 280).op("aten::addmm", 420, 260).kernel(450, 100, launch_at=430, launch_dur=5)
    b.op("aten::relu", 720, 60).kernel(750, 50, launch_at=730, launch_dur=5)
    return b


def test_device_time_per_operator_through_correlation_ids(tmp_path):
    from kinetoscope.analyze.views.ops import op_device_time

    t = op_device_time(load_built(tmp_path, module_trace()).ranks[0]).set_index("name")
    assert t.loc["aten::addmm"].tolist() == [0.3, 0.3]  # self, total: its two GEMMs
    assert t.loc["aten::linear"].tolist() == [0.0, 0.3]  # launches nothing itself; its addmm does
    assert t.loc["aten::relu"].tolist() == [0.05, 0.05]


def test_the_module_hierarchy_with_host_and_device_time(tmp_path):
    from kinetoscope.analyze.views.ops import module_tree, op_call_stacks, op_modules

    r = load_built(tmp_path, module_trace()).ranks[0]
    m = module_tree(r)
    assert m["path"].tolist() == ["Net_0", "Net_0 / Linear_0", "Net_0 / Linear_1"] and m["depth"].tolist() == [0, 1, 1]
    assert m["host_ms"].tolist() == [0.75, 0.2, 0.3] and m["host_self_ms"].tolist() == [0.25, 0.2, 0.3]
    assert m["device_ms"].tolist() == [0.35, 0.2, 0.1] and m["calls"].tolist() == [1, 1, 1]
    by_module = op_modules(r).set_index(["module", "name"])["total_ms"]
    assert by_module[("Net_0 / Linear_0", "aten::addmm")] == 0.16
    assert by_module[("Net_0 / Linear_1", "aten::addmm")] == 0.26
    assert by_module[("Net_0", "aten::relu")] == 0.06
    stacks = op_call_stacks(r).set_index(["name", "call_stack"])
    assert stacks.loc[("aten::addmm", "train.py(10): main")].tolist() == [2, 0.42]  # module frames left out


def _steps_trace(tmp_path, name: str, step_us: float, steps: int = 12):
    b = TraceBuilder()
    for k in range(steps):
        b.step(k, k * step_us, step_us)
    return load_built(tmp_path, b, name)


@pytest.mark.parametrize("after_us, verdict", [(1000, "no change"), (1010, "no change"), (1100, "slower"),
                                               (900, "faster")])
def test_the_run_level_step_change_gives_no_verdict_inside_the_noise(tmp_path, after_us, verdict):
    """Twelve 1 ms steps against twelve of 1.00, 1.01, 1.1 and 0.9 ms: the 1% change is inside what reruns of one job
    differ by (2%): no verdict; 10% either way is one."""
    from kinetoscope.analyze.views.compare import run_change

    got = run_change(_steps_trace(tmp_path, "a.json", 1000), _steps_trace(tmp_path, "b.json", after_us))
    assert got["verdict"] == verdict and got["change"] == pytest.approx(after_us / 1000 - 1)
    assert got["before_steps"] == 12 and got["after_steps"] == 12


def test_findings_are_matched_by_id_and_the_ranks_they_were_found_on():
    """Before: a loader stall on ranks 0-3 of a 4-rank job and a sync point on rank 1; after (8 ranks): the loader
    stall on ranks 0-3 still, a straggler on the job, GPU idle on rank 5. Rank 3's stall is the same finding only
    because the set is the same; the sync point is gone."""
    from types import SimpleNamespace

    from kinetoscope.analyze.model.findings import Finding
    from kinetoscope.analyze.views.compare import finding_sets

    def f(fid, rank):
        return Finding(id=fid, severity="warning", rank=rank, title=f"{fid} title", evidence={}, recommendation="")

    before = SimpleNamespace(findings=[f("loader_stall", r) for r in range(4)] + [f("sync_point", 1)],
                             ranks=[{"rank": r} for r in range(4)])
    after = SimpleNamespace(findings=[f("loader_stall", r) for r in (0, 1)] + [f("straggler", None), f("gpu_idle", 5)],
                            ranks=[{"rank": r} for r in range(8)])
    t = finding_sets(before, after).set_index("id")
    assert t.loc["loader_stall", ["status", "ranks_before", "ranks_after"]].tolist() == ["on other ranks", "0-3", "0-1"]
    assert t.loc["straggler", ["status", "ranks_after"]].tolist() == ["appeared", "the job"]
    assert t.loc["gpu_idle", "status"] == "appeared" and t.loc["sync_point", "status"] == "gone"
    assert t.loc["sync_point", ["ranks_before", "ranks_after"]].tolist() == ["1", ""]
    assert t["ranks_of_the_job_before"].unique().tolist() == [4]
    assert t["ranks_of_the_job_after"].unique().tolist() == [8]


def test_kernel_and_operator_diffs_per_step(tmp_path):
    """Before: a 300 us gemm per 1 ms step; after: a 200 us gemm and a new 50 us relu kernel: -0.1 and +0.05 ms."""
    from kinetoscope.analyze.views.compare import name_diffs

    def run(name, gemm_us, relu_us):
        b = TraceBuilder()
        for k in range(4):
            b.step(k, k * 1000, 1000).kernel(k * 1000 + 10, gemm_us, name="gemm")
            if relu_us:
                b.kernel(k * 1000 + 500, relu_us, name="relu")
        return load_built(tmp_path, b, name)

    d = name_diffs(run("a.json", 300, 0), run("b.json", 200, 50), ("kernel",)).set_index("name")
    assert d.loc["gemm"].tolist() == [0.3, 0.2, pytest.approx(-0.1)]
    assert d.loc["relu"].tolist() == [0.0, 0.05, 0.05] and list(d.index) == ["gemm", "relu"]


def test_a_step_label_that_would_run_past_the_range_is_left_out(tmp_path):
    """Two 1 ms steps viewed over 0-1.99 ms at 1600 px: step 1 starts 0.99 ms before the range ends and keeps its
    label; viewed over 0-1.02 ms it has 0.02 ms left, under a label's 60 px (0.038 ms): drawn unlabelled."""
    b = TraceBuilder().step(0, 0, 1000).step(1, 1000, 1000)
    r = load_built(tmp_path, b).ranks[0]
    assert list(timeline_view(r, 0.0, 1.99).steps["step"]) == [0, 1]
    assert list(timeline_view(r, 0.0, 1.02).steps["step"]) == [0]
