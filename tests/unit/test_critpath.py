"""Issue 31 item 5: the critical path of a step and the slack beside it, on traces built so both are known by
construction (each test's comments work them out)."""

from __future__ import annotations

from conftest import load_built
from tracebuilder import NCCL, TraceBuilder

from kinetoscope.analyze import whatif
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.whatif.critpath import critical_path, critical_path_entry

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]


def path_of(step) -> list[tuple[str, str, float, float]]:
    """(kind, name, start from the step's start, duration) in us."""
    return [(s.kind, s.name, (s.start_ns - step.start_ns) / 1000, s.dur_ns / 1000) for s in step.segments]


def gpu_bound(steps: int = 3) -> TraceBuilder:
    """Each 1000 us step: K1 launched at +10 runs +20..+620, K2 launched at +30 queues behind it (+620..+920), the
    host syncs from +40 and returns at +930 (10 us after K2 ends), then 70 us of host work."""
    b = TraceBuilder(device_properties=A100)
    for k in range(steps):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.kernel(t + 20, 600, name="K1", launch_at=t + 10)
        b.kernel(t + 620, 300, name="K2", launch_at=t + 30)
        b.runtime("cudaDeviceSynchronize", t + 40, 890)
    return b


def test_a_gpu_bound_step_runs_through_its_kernels_and_the_host_has_the_sync_s_wait_to_spare(tmp_path):
    r = load_built(tmp_path, gpu_bound()).ranks[0]
    cp = critical_path(r)
    assert len(cp.steps) == 3
    for step in cp.steps:
        assert path_of(step) == [("host", "CPU work", 0, 10), ("launch", "launch", 10, 10), ("kernel", "K1", 20, 600),
                                 ("kernel", "K2", 620, 300), ("sync", "cudaDeviceSynchronize", 920, 10),
                                 ("host", "CPU work", 930, 70)]
        # every kernel is on the path: no GPU slack. The host could start its sync 885 us later (it returns at
        # +930 and costs at least 5 us of its own): 930 - 40 - 5
        assert step.gpu_slack_ns == 0
        assert step.host_slack_ns == 885_000


def test_the_report_block_sums_the_path_by_kind_and_lists_the_median_step(tmp_path):
    r = load_built(tmp_path, gpu_bound()).ranks[0]
    typed = critical_path_entry(r)
    assert typed is not None and typed.median_step.index == 1 and typed.by_kind[-1].kind == "kernel"
    e = typed.to_dict()  # the report's JSON object, its keys in the report's order
    assert list(e) == ["steps", "fraction_of", "mean_step_us", "by_kind", "names", "names_left_out", "gpu_slack_us",
                       "host_slack_us", "median_step"]
    assert list(e["median_step"]) == ["index", "step_us", "segments", "segments_left_out", "left_out_us",
                                      "gpu_slack_us", "host_slack_us"]
    assert e["steps"] == 3 and e["mean_step_us"] == 1000
    assert e["by_kind"] == [{"kind": "host", "dur_us": 80.0, "step_fraction": 0.08},
                            {"kind": "sync", "dur_us": 10.0, "step_fraction": 0.01},
                            {"kind": "launch", "dur_us": 10.0, "step_fraction": 0.01},
                            {"kind": "kernel", "dur_us": 900.0, "step_fraction": 0.9}]
    assert e["names"][0] == {"kind": "kernel", "name": "K1", "dur_us": 600.0, "step_fraction": 0.6}
    assert e["gpu_slack_us"] == 0 and e["host_slack_us"] == 885
    med = e["median_step"]
    assert med["index"] == 1 and med["step_us"] == 1000 and med["segments_left_out"] == 0
    assert [(s["kind"], s["start_us"], s["dur_us"]) for s in med["segments"]] == [
        ("host", 0, 10), ("launch", 10, 10), ("kernel", 20, 600), ("kernel", 620, 300), ("sync", 920, 10),
        ("host", 930, 70)]


def hidden_wait(steps: int = 6) -> TraceBuilder:
    """Each 1000 us step: a 400 us kernel launched at once (+10..+410), a 600 us wait for data (+10..+610), a sync
    at +615 that returns at once (5 us), 380 us of host work."""
    b = TraceBuilder(device_properties=A100)
    for k in range(steps):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.kernel(t + 10, 400, launch_at=t, launch_dur=5)
        b.loader(t + 10, 600)
        b.runtime("cudaStreamSynchronize", t + 615, 5)
    return b


def test_a_data_wait_on_the_path_gains_only_the_gpu_s_slack(tmp_path):
    """The path is the host's: 10 us of work, the 600 us wait, 5 us, the sync's own 5 us, 380 us. The kernel ends at
    +410; the sync returns 5 us after what it awaits and returned at +620, so the kernel could end at +615, 205 us
    later: the GPU's slack. Removing the wait gains 205 us, not 600: the replay's own estimate of that fix, worked
    out independently in tests/integration/test_whatif.py."""
    r = load_built(tmp_path, hidden_wait()).ranks[0]
    for step in critical_path(r).steps:
        # the launch call (+0..+5) is the step's forward (top-level work before any backward: the step's phases)
        assert path_of(step) == [("host", "forward", 0, 5), ("host", "CPU work", 5, 5), ("data", "DataLoader", 10, 600),
                                 ("host", "CPU work", 610, 5), ("sync", "cudaStreamSynchronize", 615, 5),
                                 ("host", "CPU work", 620, 380)]
        assert step.gpu_slack_ns == 205_000
        assert step.host_slack_ns == 0
    f = Finding(id="loader_stall", severity="warning", rank=0, title="", evidence={}, recommendation="")
    est = whatif.estimate(r, f, {"num_workers": 4, "handoff_ms": 0})
    assert est["saving_us_per_step"] == 205


def comm_after_compute(steps: int = 3) -> TraceBuilder:
    """Each 2000 us step: 100 us of data wait, a GEMM launched at +100 (+110..+910), an all-reduce launched at +120
    on another stream that waits for it (+910..+1810), a sync from +130 that returns 5 us after the all-reduce,
    185 us of host work."""
    b = TraceBuilder(device_properties=A100)
    for k in range(steps):
        t = 10_000 + 2000 * k
        b.step(k, t, 2000).loader(t, 100)
        b.kernel(t + 110, 800, name="gemm", launch_at=t + 100)
        b.kernel(t + 910, 900, name=NCCL, stream=20, launch_at=t + 120)
        b.runtime("cudaStreamSynchronize", t + 130, 1685)
    return b


def test_a_collective_waiting_for_compute_on_another_stream_is_on_the_path_after_it(tmp_path):
    r = load_built(tmp_path, comm_after_compute()).ranks[0]
    for step in critical_path(r).steps:
        assert path_of(step) == [("data", "DataLoader", 0, 100), ("launch", "launch", 100, 10),
                                 ("kernel", "gemm", 110, 800), ("collective", NCCL, 910, 900),
                                 ("sync", "cudaStreamSynchronize", 1810, 5), ("host", "CPU work", 1815, 185)]
        # the sync could start as late as 1815 - 5 (its own cost): 1680 us after +130
        assert step.host_slack_ns == 1_680_000
        assert step.gpu_slack_ns == 0
    e = critical_path_entry(r)
    assert [(k.kind, k.dur_us) for k in e.by_kind] == [
        ("host", 185), ("data", 100), ("sync", 5), ("launch", 10), ("kernel", 800), ("collective", 900)]


def test_whatif_says_why_removing_the_wait_gains_less_than_the_wait(tmp_path):
    """The loader fix targets the 600 us wait, all of it on the path; the GPU's 205 us of slack is what it gains."""
    from kinetoscope.render.text import render_whatif

    r = load_built(tmp_path, hidden_wait()).ranks[0]
    f = Finding(id="loader_stall", severity="warning", rank=0, title="", evidence={}, recommendation="")
    params = {"num_workers": 4, "handoff_ms": 0}
    plan = whatif.plan_for(r, whatif.replay_graph(r), f, params)
    limits = whatif.fix_limits(r, plan.edits)
    assert limits == {"targeted_us_per_step": 600.0, "on_critical_path_us_per_step": 600.0, "gpu_slack_us": 205.0}
    est = whatif.estimate(r, f, params)
    text = render_whatif("t", [], [{"rank": 0, "replay": None, "fixes": [
        {"id": "loader_stall", "estimate": est.to_dict(), "critical_path": limits}]}])
    assert ("gains less than the 0.60 ms per step of waiting it targets: 0.60 ms of it lies on the critical path; "
            "the GPU has 0.20 ms of slack beside it") in text


def test_the_timeline_draws_the_path_in_a_row_under_the_steps(tmp_path):
    from kinetoscope.analyze.views.spans import PATH_ROW, timeline_view

    r = load_built(tmp_path, gpu_bound()).ranks[0]
    v = timeline_view(r, 0.0, 1.0, width_px=100_000, with_path=True)  # the first step, nothing merged
    assert v.rows[:2] == ["steps", PATH_ROW]
    path = v.spans[v.spans["row"] == PATH_ROW]
    assert list(zip(path["name"], path["kind"], path["start_ms"], path["end_ms"], strict=True)) == [
        ("host: CPU work", "cpu op", 0.0, 0.01), ("launch: launch", "runtime call", 0.01, 0.02),
        ("kernel: K1", "kernel", 0.02, 0.62), ("kernel: K2", "kernel", 0.62, 0.92),
        ("sync: cudaDeviceSynchronize", "sync", 0.92, 0.93), ("host: CPU work", "cpu op", 0.93, 1.0)]
    assert PATH_ROW not in timeline_view(r, 0.0, 1.0).rows


def test_host_work_on_the_path_is_named_by_the_step_s_phase(tmp_path):
    """A host-bound step: forward (+0..+300, launching a 100 us kernel nothing waits for), the optimizer's step
    (+300..+800), 200 us of other host work. No sync awaits the kernel: its slack is unbounded (null)."""
    b = TraceBuilder(device_properties=A100)
    for k in range(2):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.op("aten::linear", t, 300)
        b.kernel(t + 20, 100, launch_at=t + 10)
        b.op("Optimizer.step#SGD.step", t + 300, 500, cat="user_annotation")
    r = load_built(tmp_path, b).ranks[0]
    for step in critical_path(r).steps:
        assert path_of(step) == [("host", "forward", 0, 300), ("host", "optimizer", 300, 500),
                                 ("host", "CPU work", 800, 200)]
        assert step.gpu_slack_ns is None and step.host_slack_ns == 0
