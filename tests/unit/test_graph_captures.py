"""CUDA/HIP graph replays whose kernels were not recorded, judged from their graph's capture (in the same trace, or
in a ``capture_traces/`` folder beside it). Times in us, as Kineto writes them; every number is known by
construction."""

from __future__ import annotations

import pytest
from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.model.graphs import graph_replays
from kinetoscope.analyze.report.builder import build_report


def _capture(b: TraceBuilder, at: float, ops: tuple[str, ...] = ("aten::mm", "aten::relu"),
             copy: bool = True) -> TraceBuilder:
    """A stream capture starting at ``at``: one kernel launch inside each op, then a copy outside any op; ends at
    ``at + 210``. Correlation ids follow the builder's (a jump of hundreds across a silence is a cut trace)."""
    b.runtime("cudaStreamBeginCapture", at, 5, b._next_corr())
    for i, op in enumerate(ops):
        b.op(op, at + 20 + 50 * i, 40)
        b.runtime("cudaLaunchKernel", at + 30 + 50 * i, 5, b._next_corr())  # captured: no kernel ran under this id
    if copy:
        b.runtime("cudaMemcpyAsync", at + 110, 5, b._next_corr())
    return b.runtime("cudaStreamEndCapture", at + 200, 10, b._next_corr())


def _replays(b: TraceBuilder, starts: tuple[float, ...] = (1000, 3000, 5000, 7000), after: float = 500) -> TraceBuilder:
    """A graph launch at each start (kernels not recorded), then a recorded kernel ``after`` us later."""
    for t in starts:
        b.runtime("cudaGraphLaunch", t, 20, b._next_corr())
        b.kernel(t + after, 100, launch_at=t + 30)
    return b


def _trace() -> TraceBuilder:
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    return _replays(_capture(b, 100))


def test_replays_get_their_graph_from_a_capture_in_the_same_trace(tmp_path):
    gpu = build_report(load_built(tmp_path, _trace())).ranks[0]["gpu"]
    missing = gpu["missing_activity"]
    assert missing["graph_launches_unrecorded"] == 4
    assert missing["graph_launches_from_capture"] == 4
    # each replay: from its launch to the next recorded kernel, 500 us
    assert missing["graph_replay_span_us"] == 2000
    assert missing["graph_launches_not_judged"] == {}
    (graph,) = missing["captured_graphs"]
    assert graph["source"] == "this trace" and graph["capture"] == 0 and graph["batch_size"] is None
    assert graph["launches"] == 3
    # CUPTI's runtime calls name no kernel, and the captured kernels never ran: nothing names them
    assert graph["launch_list"] == [{"call": "cudaLaunchKernel", "op": "aten::mm", "kernel": None, "grid": None},
                                    {"call": "cudaLaunchKernel", "op": "aten::relu", "kernel": None, "grid": None},
                                    {"call": "cudaMemcpyAsync", "op": None, "kernel": None, "grid": None}]
    assert graph["replays"] == 4 and graph["replays_judged"] == 4
    assert graph["matched_by"] == ["only_capture"] and graph["confidence"] == "medium"
    # only the capture itself (BeginCapture 100 .. EndCapture's end 310) stays unknown: 2.1% of the window
    assert missing["unknown_us"] == 210
    # judged: the window less the recorded work (50 + 4 x 100) less the replays' spans (4 x 500)
    device = gpu["devices"][0]
    assert device["idle_us"] == 10_000 - 450 - 2000
    assert gpu["idle_fraction"] == pytest.approx(0.755)


def test_without_the_capture_the_same_replays_are_not_judged(tmp_path):
    b = _replays(TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10))
    gpu = build_report(load_built(tmp_path, b)).ranks[0]["gpu"]
    missing = gpu["missing_activity"]
    assert missing["graph_launches_from_capture"] == 0 and missing["graph_replay_span_us"] is None
    assert missing["graph_launches_not_judged"] == {"no capture in the trace or beside it": 4}
    assert missing["unknown_us"] == 2000
    assert gpu["devices"][0]["idle_us"] is None


def test_a_device_sync_bounds_a_replay_before_the_next_recorded_work(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    _capture(b, 100)
    b.runtime("cudaGraphLaunch", 1000, 20, b._next_corr())
    b.runtime("cudaDeviceSynchronize", 1100, 200, b._next_corr())  # returns at 1300: the replay had finished by then
    b.kernel(2000, 100, launch_at=1400)
    (replay,) = graph_replays(load_built(tmp_path, b).ranks[0]).replays
    assert replay.finished_by_ns == 1_300_000 and replay.next_work_ns == 2_000_000
    missing = build_report(load_built(tmp_path, b, "again.json")).ranks[0]["gpu"]["missing_activity"]
    assert missing["graph_replay_span_us"] == 300


def test_work_on_another_stream_does_not_bound_a_replay(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10, stream=7)
    _capture(b, 100)
    b.runtime("cudaGraphLaunch", 1000, 20, b._next_corr())  # to stream 7: the thread's last launch went there
    b.kernel(1200, 100, launch_at=1050, stream=9)  # another stream: may run beside the replay
    b.kernel(4000, 100, launch_at=1100, stream=7)  # queued behind the replay
    (replay,) = graph_replays(load_built(tmp_path, b).ranks[0]).replays
    assert (replay.device, replay.stream, replay.next_work_ns) == (0, 7, 4_000_000)
    missing = build_report(load_built(tmp_path, b, "again.json")).ranks[0]["gpu"]["missing_activity"]
    assert missing["graph_replay_span_us"] == 3000


def test_work_launched_before_a_replay_does_not_bound_it(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    _capture(b, 100)
    b.kernel(1500, 100, launch_at=900)  # launched before the replay, queued: runs before it on the stream
    b.runtime("cudaGraphLaunch", 1000, 20, b._next_corr())
    b.kernel(4000, 100, launch_at=1100)  # launched after it: waited for it
    (replay,) = graph_replays(load_built(tmp_path, b).ranks[0]).replays
    assert (replay.stream, replay.next_work_ns) == (7, 4_000_000)


def test_a_replay_from_a_thread_that_launched_nothing_recorded_stays_unknown(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    _capture(b, 100)
    b.runtime("cudaGraphLaunch", 1000, 20, b._next_corr(), tid=555)
    b.kernel(2000, 100, launch_at=1500)
    missing = build_report(load_built(tmp_path, b)).ranks[0]["gpu"]["missing_activity"]
    assert missing["graph_launches_from_capture"] == 0
    assert missing["graph_launches_not_judged"] == {
        "matched, but its stream is not known (its thread launched no recorded work before it)": 1}
    (graph,) = missing["captured_graphs"]
    assert graph["replays"] == 1 and graph["replays_judged"] == 0


def test_captures_with_different_launches_leave_the_replays_unmatched(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    _capture(b, 100)
    _capture(b, 400, ops=("aten::addmm",))
    _replays(b)
    missing = build_report(load_built(tmp_path, b)).ranks[0]["gpu"]["missing_activity"]
    assert missing["graph_launches_from_capture"] == 0 and missing["captured_graphs"] == []
    assert missing["graph_launches_not_judged"] == {
        "2 captured graphs with different launches and nothing to tell them apart": 4}


def test_identical_captures_are_one_graph_for_the_match(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    _capture(b, 100)
    _capture(b, 400)
    _replays(b)
    missing = build_report(load_built(tmp_path, b)).ranks[0]["gpu"]["missing_activity"]
    (graph,) = missing["captured_graphs"]
    assert graph["capture"] == 1 and graph["matched_by"] == ["identical_captures"] and graph["replays"] == 4


def test_a_replay_before_the_only_capture_is_not_matched_to_it(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    _replays(b, starts=(1000,))
    _capture(b, 3000)
    missing = build_report(load_built(tmp_path, b)).ranks[0]["gpu"]["missing_activity"]
    assert missing["graph_launches_not_judged"] == {"the trace's captures all come after this replay": 1}


def test_recorded_replays_need_no_capture(tmp_path):
    b = TraceBuilder().step(1, 0, 2000).kernel(0, 50, launch_at=-10)
    _capture(b, 100)
    b.runtime("cudaGraphLaunch", 1000, 20, 4242)
    b.raw({"ph": "X", "cat": "kernel", "name": "graph_k", "pid": 0, "tid": 7, "ts": 1100, "dur": 300,
           "args": {"device": 0, "stream": 7, "correlation": 4242}})
    missing = build_report(load_built(tmp_path, b)).ranks[0]["gpu"]["missing_activity"]
    assert missing["graph_launches_unrecorded"] == 0 and missing["graph_launches_from_capture"] == 0
    assert missing["captured_graphs"] == [] and missing["graph_launches_not_judged"] == {}


def _rocm_capture(b: TraceBuilder, at: float, ops: tuple[str, ...]) -> TraceBuilder:
    """A capture as roctracer records one: each launch call's args name its kernel and grid."""
    b.runtime("hipStreamBeginCapture", at, 5, b._next_corr())
    for i, op in enumerate(ops):
        b.op(op, at + 20 + 50 * i, 40)
        args = {"correlation": b._next_corr(), "kernel": f"{op.split('::')[1]}_kernel", "grid": [4 * (i + 1), 1, 1],
                "block": [256, 1, 1]}
        b.raw({"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 100, "tid": 100,
               "ts": at + 30 + 50 * i, "dur": 5, "args": args})
    return b.runtime("hipStreamEndCapture", at + 200, 10, b._next_corr())


def _capture_file(tmp_path, name: str, ops: tuple[str, ...]) -> None:
    _rocm_capture(TraceBuilder(), 100, ops).write(tmp_path / "capture_traces" / name)


def test_a_rocm_capture_in_the_trace_names_the_graphs_kernels(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10, name="warmup_kernel")
    _replays(_rocm_capture(b, 100, ("aten::mm", "aten::gelu")), starts=(1000,))
    missing = build_report(load_built(tmp_path, b)).ranks[0]["gpu"]["missing_activity"]
    (graph,) = missing["captured_graphs"]
    assert [(x["kernel"], x["grid"]) for x in graph["launch_list"]] == [("mm_kernel", "[4,1,1]"),
                                                                          ("gelu_kernel", "[8,1,1]")]
    assert graph["recorded_replays_alike"] == 0 and graph["recorded_replay_busy_us"] is None


def test_a_recorded_replay_of_the_same_kernels_tells_what_a_replay_costs(tmp_path):
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    _rocm_capture(b, 100, ("aten::mm", "aten::gelu"))
    _replays(b, starts=(1000,))  # unrecorded
    for start, names in ((6000, ("gelu_kernel", "mm_kernel")), (8000, ("mm_kernel", "other_kernel"))):
        corr = b._next_corr()  # recorded: its kernels carry the launch's correlation id
        b.runtime("hipGraphLaunch", start, 20, corr)
        for j, name in enumerate(names):  # 100 us then 50 us, 10 us apart: 150 us busy
            b.raw({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start + 100 + 110 * j,
                   "dur": 100 - 50 * j, "args": {"device": 0, "stream": 7, "correlation": corr}})
    report = build_report(load_built(tmp_path, b))
    (graph,) = report.ranks[0]["gpu"]["missing_activity"]["captured_graphs"]
    from kinetoscope.render.text import render_text

    assert any(line.endswith("; a recorded replay of its kernels keeps the GPU busy 0.15 ms (median of 1)")
               for line in render_text(report).splitlines())
    # the replay at 6000 ran the graph's kernels (in another order); the one at 8000 ran others
    assert graph["replays"] == 1 and graph["recorded_replays_alike"] == 1
    assert graph["recorded_replay_busy_us"] == 150


def test_a_serving_iteration_picks_the_capture_trace_of_its_padded_batch_size(tmp_path):
    _capture_file(tmp_path, "bs_32_rank0.json.gz", ("aten::mm",))
    _capture_file(tmp_path, "bs_64_rank0.json.gz", ("aten::mm", "aten::silu"))
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    b.op("step[DECODE bs=20]", 900, 1500, cat="user_annotation")  # padded to 32
    b.op("execute_context_0(0)_generation_40(40)", 2900, 1500, cat="user_annotation")  # padded to 64
    b.op("step[DECODE bs=100]", 4900, 1500, cat="user_annotation")  # more than any capture
    b.op("step[DECODE bs=2]", 950, 20, cat="user_annotation")  # nested, ended before the replay: not its iteration
    _replays(b, starts=(1000, 3000, 5000))
    trace = load_trace(b.write(tmp_path / "exec.json"))
    missing = build_report(trace).ranks[0]["gpu"]["missing_activity"]
    by_file = {g["source"]: g for g in missing["captured_graphs"]}
    assert sorted(by_file) == ["bs_32_rank0.json.gz", "bs_64_rank0.json.gz"]
    assert by_file["bs_32_rank0.json.gz"]["batch_size"] == 32 and by_file["bs_32_rank0.json.gz"]["launches"] == 1
    assert by_file["bs_64_rank0.json.gz"]["launch_list"] == [
        {"call": "hipLaunchKernel", "op": "aten::mm", "kernel": "mm_kernel", "grid": "[4,1,1]"},
        {"call": "hipLaunchKernel", "op": "aten::silu", "kernel": "silu_kernel", "grid": "[8,1,1]"}]
    assert all(g["matched_by"] == ["batch_size"] and g["replays"] == 1 for g in by_file.values())
    assert missing["graph_launches_from_capture"] == 2
    assert missing["graph_launches_not_judged"] == {"the iteration's batch size 100 exceeds every captured one (64)": 1}


def test_piecewise_captures_pair_with_the_iterations_replays_in_order(tmp_path):
    capture = TraceBuilder()
    _capture(capture, 100, ops=("aten::mm",), copy=False)
    _capture(capture, 400, ops=("aten::silu",), copy=False)
    capture.write(tmp_path / "capture_traces" / "bs_8_rank0.json")
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    b.op("step[DECODE bs=8]", 900, 4500, cat="user_annotation")
    _replays(b, starts=(1000, 3000))
    gpu = build_report(load_trace(b.write(tmp_path / "exec.json"))).ranks[0]["gpu"]
    missing = gpu["missing_activity"]
    pieces = sorted(missing["captured_graphs"], key=lambda g: g["capture"])
    # nothing is unknown, but the replays' kernels are not in the trace: judged, not complete
    assert missing["unknown_us"] == 0 and gpu["idle_fraction"] is not None and gpu["activity_complete"] is False
    assert [(g["capture"], g["launch_list"][0]["op"], g["replays"]) for g in pieces] == [
        (0, "aten::mm", 1), (1, "aten::silu", 1)]


def test_the_capture_traces_launches_survive_the_cache(tmp_path):
    _capture_file(tmp_path, "bs_32_rank0.json.gz", ("aten::mm", "aten::silu"))
    b = TraceBuilder().step(1, 0, 10_000).kernel(0, 50, launch_at=-10)
    path = b.write(tmp_path / "exec.json")
    first = load_trace(path, cache=tmp_path / "cache").ranks[0].graph_captures
    again = load_trace(path, cache=tmp_path / "cache").ranks[0].graph_captures
    assert list(again["op"].astype(str)) == ["aten::mm", "aten::silu"] and list(again["batch_size"]) == [32, 32]
    assert list(again["kernel"].astype(str)) == ["mm_kernel", "silu_kernel"]
    assert again.dtypes.to_dict() == first.dtypes.to_dict()


def test_the_text_report_says_which_replays_were_judged_from_a_capture(tmp_path):
    from kinetoscope.render.text import render_text

    b = _trace()
    b.runtime("cudaGraphLaunch", 9000, 20, b._next_corr())  # one more replay, and no recorded work after it
    lines = render_text(build_report(load_built(tmp_path, b))).splitlines()
    assert ("  graph replays 5 without recorded kernels, 4 judged from their graph's capture (running a captured "
            "graph 2.00 ms: neither idle nor unknown)") in lines
    assert ("    graph 0 of this trace: 3 launches (aten::mm, aten::relu); 5 replays (4 judged), matched by "
            "only_capture, medium confidence") in lines
    assert "    1 not judged: matched, but nothing bounds when it finished (no later recorded work or device sync)" \
        in lines


def test_launch_args_are_read_narrowly_and_never_fail_a_load():
    from kinetoscope.analyze.ingest.parser import launched_kernels

    assert launched_kernels(b'[{"args": {"correlation": 3, "kernel": "k", "grid": [1, 1, 1], "stack": ["x"]}},'
                            b' {"args": null}, {"name": "no args"}, {"args": {"correlation": true, "kernel": "b"}}]'
                            ) == {3: ("k", "[1,1,1]")}
    assert launched_kernels(b'{"traceEvents": [{"args": [1]}]}') == {}  # args that are no object: no names at all
    assert launched_kernels(b'{"traceEvents": [') == {}
