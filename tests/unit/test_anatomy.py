"""Step anatomy on traces built in code: exact phase times."""

from __future__ import annotations

import pytest
from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.model.phases import PHASES
from kinetoscope.analyze.report.builder import build_report

BWD_TID = 200


def one_step(b, t0=0.0, gpu=True):
    b.step(1 if t0 == 0 else 2, t0, 1000)
    b.loader(t0 + 0, 100)
    b.op("aten::to", t0 + 100, 50)
    if gpu:
        b.memcpy(t0 + 115, 25, host="Pinned", call="cudaMemcpyAsync", call_at=t0 + 110)
    b.op("aten::linear", t0 + 160, 140)
    if gpu:
        b.kernel(t0 + 210, 50, launch_at=t0 + 200)
    b.op("aten::mse_loss", t0 + 310, 40)
    b.op("Optimizer.zero_grad#SGD.zero_grad", t0 + 350, 30, cat="user_annotation")
    b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 400, 300, tid=BWD_TID)
    if gpu:
        b.kernel(t0 + 460, 100, launch_at=t0 + 450, launch_tid=BWD_TID)
    b.op("Optimizer.step#SGD.step", t0 + 720, 130, cat="user_annotation")
    b.op("aten::item", t0 + 860, 40)
    if gpu:
        b.runtime("cudaStreamSynchronize", t0 + 865, 30)  # a CUDA tensor's .item() waits for its stream
    return b


EXPECTED_HOST = {"data_wait": 100, "compile": 0, "h2d": 50, "forward": 210, "zero_grad": 30, "backward": 300,
                 "optimizer": 130, "sync": 40, "other": 140}


def test_host_phases_are_exact_and_sum_to_the_window(tmp_path):
    rep = build_report(load_built(tmp_path, one_step(TraceBuilder())))
    phases = rep.ranks[0]["phases"]
    assert {p: phases[p]["time_us"] for p in PHASES} == EXPECTED_HOST
    assert sum(phases[p]["fraction"] for p in PHASES) == pytest.approx(1.0)
    assert rep.ranks[0]["phases_per_step_us"] == [{"step": 1, **{p: float(v) for p, v in EXPECTED_HOST.items()}}]


def test_gpu_time_follows_the_launching_phase(tmp_path):
    phases = build_report(load_built(tmp_path, one_step(TraceBuilder()))).ranks[0]["phases"]
    gpu = {p: phases[p]["gpu_time_us"] for p in PHASES}
    assert gpu == {"data_wait": 0, "compile": 0, "h2d": 25, "forward": 50, "zero_grad": 0, "backward": 100,
                   "optimizer": 0, "sync": 0, "other": 0}


def test_every_step_gets_its_own_row(tmp_path):
    b = one_step(one_step(TraceBuilder()), t0=1000)
    rows = build_report(load_built(tmp_path, b)).ranks[0]["phases_per_step_us"]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["backward"] == 300 and rows[1]["forward"] == 210


def test_cpu_only_trace_copies_count_as_forward(tmp_path):
    phases = build_report(load_built(tmp_path, one_step(TraceBuilder(), gpu=False))).ranks[0]["phases"]
    # forward then runs from aten::to (100) to backward (400), less zero_grad (30)
    assert phases["h2d"]["time_us"] == 0 and phases["forward"]["time_us"] == 270
    assert phases["forward"]["gpu_time_us"] is None


def test_2021_backward_nodes_without_the_engine_wrapper(tmp_path):
    b = TraceBuilder().step(1, 0, 1000).op("aten::linear", 0, 100).op("AddmmBackward", 200, 300, tid=BWD_TID)
    phases = build_report(load_built(tmp_path, b)).ranks[0]["phases"]
    assert phases["backward"]["time_us"] == 300 and phases["forward"]["time_us"] == 200


def _fwdbwd(b, ts):
    """The start of an autograd fwd->bwd flow at a forward op (what the profiler writes for ops with grad)."""
    b.raw({"ph": "s", "id": int(ts), "pid": 1, "tid": 1, "ts": ts, "cat": "fwdbwd", "name": "fwdbwd"})


def test_a_closure_optimizer_forward_passes_are_forward(tmp_path):
    """LBFGS runs its closure (forward, then backward) several times inside one Optimizer.step. Was (issue-18
    review): every forward after the first was counted as optimizer time (46% optimizer where 13% was true).
    One step of 1000 us: data 50; the step 50..950 holds three evaluations (forward 100 + backward 100, each
    marked by a fwdbwd flow at its first op) with the optimizer's own arithmetic (no_grad ops, no flow)
    between them and after them: 50+50+60, the last update 40 and 100 us to the step's end."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.loader(0, 50)
    b.op("Optimizer.step#LBFGS.step", 50, 900, cat="user_annotation")
    t = 50.0
    for gap in (50, 50, 60):  # optimizer arithmetic before each evaluation
        b.op("aten::dot", t, gap)
        t += gap
        b.op("aten::linear", t, 60)
        _fwdbwd(b, t)
        b.op("aten::mse_loss", t + 60, 40)
        _fwdbwd(b, t + 60)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t + 100, 100, tid=BWD_TID)
        t += 200
    b.op("aten::add_", t, 40)  # the last update
    phases = build_report(load_built(tmp_path, b)).ranks[0]["phases"]
    got = {p: phases[p]["time_us"] for p in PHASES}
    assert got == {"data_wait": 50, "compile": 0, "h2d": 0, "forward": 300, "zero_grad": 0, "backward": 300,
                   "optimizer": 300, "sync": 0, "other": 50}
