"""Loop-hygiene findings: on real CPU runs with one planted bug each, and on traces built in code."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report

CPU = Path(__file__).resolve().parents[2] / "sample_traces" / "cpu"
HYGIENE = {"zero_grad_missing", "optimizer_step_mismatch", "no_backward", "sync_in_loop", "worker_respawn", "recompile"}
PLANTED = {
    "no_zero_grad": "zero_grad_missing",
    "item_every_step": "sync_in_loop",
    "respawn_workers": "worker_respawn",
    "recompile": "recompile",
    "healthy": None,
    "loader_bound": None,
    "leak": None,
}


@pytest.fixture(scope="module")
def reports():
    return {name: build_report(load_trace(CPU / name)) for name in PLANTED}


@pytest.mark.parametrize("run", sorted(PLANTED))
def test_each_planted_bug_fires_on_its_run_and_no_other(reports, run):
    found = {f.id for f in reports[run].findings} & HYGIENE
    expected = {PLANTED[run]} if PLANTED[run] else set()
    assert found == expected


def test_planted_evidence(reports):
    (zg,) = [f for f in reports["no_zero_grad"].findings if f.id == "zero_grad_missing"]
    assert zg.evidence["steps"] == [5, 6, 7, 8] and zg.evidence["zero_grad_calls"] == 0
    (sync,) = [f for f in reports["item_every_step"].findings if f.id == "sync_in_loop"]
    assert sync.severity == "info" and sync.evidence["steps_with_sync"] == 5
    assert sync.evidence["ops"][0]["name"] == "aten::item"
    (respawn,) = [f for f in reports["respawn_workers"].findings if f.id == "worker_respawn"]
    assert len(respawn.evidence["respawns"]) >= 1
    (rc,) = [f for f in reports["recompile"].findings if f.id == "recompile"]
    assert any(not i.endswith("/0") for i in rc.evidence["compile_ids"])


def train_step(b, n, t0, *, zero_at=None, opt=True, bwd=True, item=False):
    b.step(n, t0, 1000)
    b.op("aten::linear", t0 + 10, 200)
    if zero_at is not None:
        b.op("Optimizer.zero_grad#SGD.zero_grad", t0 + zero_at, 20, cat="user_annotation")
    if bwd:
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 300, 300, tid=200)
    if opt:
        b.op("Optimizer.step#SGD.step", t0 + 700, 100, cat="user_annotation")
    if item:
        b.op("aten::item", t0 + 850, 100)
        b.op("aten::_local_scalar_dense", t0 + 851, 98)
    return b


def findings(tmp_path, b):
    return {f.id: f for f in build_report(load_built(tmp_path, b)).findings}


def test_zero_grad_between_backward_and_step_is_critical(tmp_path):
    b = TraceBuilder()
    for i in range(3):
        train_step(b, i, i * 1000, zero_at=650)
    f = findings(tmp_path, b)["zero_grad_missing"]
    assert f.severity == "critical" and f.evidence["steps"] == [0, 1, 2]


def test_zero_grad_before_backward_is_fine(tmp_path):
    b = TraceBuilder()
    for i in range(3):
        train_step(b, i, i * 1000, zero_at=250)
    assert not set(findings(tmp_path, b)) & HYGIENE


def test_gradient_accumulation_is_info(tmp_path):
    b = TraceBuilder()
    for i in range(6):
        train_step(b, i, i * 1000, zero_at=250 if i % 2 == 0 else None, opt=i % 2 == 1)
    f = findings(tmp_path, b)["optimizer_step_mismatch"]
    assert f.severity == "info" and f.evidence["accumulation_every"] == 2


def test_irregular_optimizer_steps_warn(tmp_path):
    b = TraceBuilder()
    for i, stepped in enumerate([True, False, True, True, False, False, True]):
        train_step(b, i, i * 1000, zero_at=250, opt=stepped)
    f = findings(tmp_path, b)["optimizer_step_mismatch"]
    assert f.severity == "warning" and f.evidence["optimizer_steps"] == 4


def test_optimizer_without_backward(tmp_path):
    b = TraceBuilder()
    for i in range(3):
        train_step(b, i, i * 1000, zero_at=250, bwd=False)
    assert findings(tmp_path, b)["no_backward"].evidence["steps"] == [0, 1, 2]


def two_optimizer_iterations(b, iterations, *, second_after_backward=True):
    """Iterations of 2,000 us: forward, backward, then Muon's step, which ends a step (as a capture ends one at every
    optimizer step without a DataLoader), then AdamW's step alone in the next step of 100 us."""
    for i in range(iterations):
        t0 = i * 2_100
        b.step(2 * i, t0, 2_000)
        b.op("aten::linear", t0 + 10, 200)
        if second_after_backward or i == 0:
            b.op("autograd::engine::evaluate_function: MmBackward0", t0 + 300, 900, tid=200)
        b.op("Optimizer.step#Muon.step", t0 + 1_300, 600, cat="user_annotation")
        b.step(2 * i + 1, t0 + 2_000, 100)
        b.op("Optimizer.step#AdamW.step", t0 + 2_010, 80, cat="user_annotation")
        b.op("aten::add_", t0 + 2_020, 50)
    return b


def test_an_iteration_split_by_its_two_optimizers_runs_backward(tmp_path):
    """Was: 'no_backward' (a correctness warning) on a Muon + AdamW loop whose capture ended a step at each
    optimizer's step: AdamW's step, alone in its step, follows the same backward as Muon's. An optimizer step runs
    without backward only where no backward ran since that optimizer's previous step."""
    b = two_optimizer_iterations(TraceBuilder(), 4)
    assert "no_backward" not in findings(tmp_path, b)


def test_an_optimizer_with_no_backward_since_its_last_step_is_still_found(tmp_path):
    """The same loop where only the first iteration runs backward: every later step of both optimizers has no
    backward since that optimizer's previous one (steps 2-7); the first ones follow the first backward."""
    b = two_optimizer_iterations(TraceBuilder(), 4, second_after_backward=False)
    f = findings(tmp_path, b)["no_backward"]
    assert f.evidence["steps"] == [2, 3, 4, 5, 6, 7] and f.severity == "warning"


def test_two_optimizers_of_one_class_after_one_backward_run_backward(tmp_path):
    """Two AdamW (a generator's and a discriminator's, or matrices and the rest) step one after the other after each
    backward, one step an iteration: the trace names both alike, so the second's step follows the first's with no
    backward between (review: was 'no_backward' on every step)."""
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 1_000
        b.step(i, t0, 1_000)
        b.op("aten::linear", t0 + 10, 100)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 200, 300)
        b.op("Optimizer.step#AdamW.step", t0 + 600, 100, cat="user_annotation")
        b.op("Optimizer.step#AdamW.step", t0 + 750, 100, cat="user_annotation")
    assert "no_backward" not in findings(tmp_path, b)


def test_an_optimizer_step_alone_at_the_windows_start_in_a_step_with_backward_is_not_judged(tmp_path):
    """A window of one step as the capture makes it for Muon + AdamW: AdamW's step (after the previous iteration's
    backward, before the window) opens the step, then forward, backward and Muon's step (review: was 'no_backward',
    1 of 1 steps)."""
    b = TraceBuilder().step(0, 0, 1_000)
    b.op("Optimizer.step#AdamW.step", 10, 80, cat="user_annotation")
    b.op("aten::linear", 100, 100)
    b.op("autograd::engine::evaluate_function: MmBackward0", 250, 400)
    b.op("Optimizer.step#Muon.step", 700, 250, cat="user_annotation")
    assert "no_backward" not in findings(tmp_path, b)


def test_a_window_opening_on_an_optimizers_lone_step_does_not_judge_it_from_the_windows_start(tmp_path):
    """Muon + AdamW, a step ending at each optimizer's step, and a window that opens on AdamW's lone step (its
    backward ran before the window): every later AdamW step follows a backward, so the first is not judged (last
    read: the documented rule, a first step judged only where its later ones lack a backward too, was coded as its
    opposite when every later one had one)."""
    b = TraceBuilder()
    b.step(0, 0, 100)
    b.op("Optimizer.step#AdamW.step", 10, 80, cat="user_annotation")
    b.op("aten::add_", 20, 50)
    for i in range(3):
        t0 = 100 + i * 2_100
        b.step(1 + 2 * i, t0, 2_000)
        b.op("aten::linear", t0 + 10, 200)
        b.op("autograd::engine::evaluate_function: MmBackward0", t0 + 300, 900, tid=200)
        b.op("Optimizer.step#Muon.step", t0 + 1_300, 600, cat="user_annotation")
        b.step(2 + 2 * i, t0 + 2_000, 100)
        b.op("Optimizer.step#AdamW.step", t0 + 2_010, 80, cat="user_annotation")
        b.op("aten::add_", t0 + 2_020, 50)
    assert "no_backward" not in findings(tmp_path, b)


def test_a_closure_step_cut_by_the_windows_end_is_not_judged(tmp_path):
    """Lightning steps its optimizer with a closure: each Optimizer.step span holds the closure's backward, and runs
    past its ProfilerStep. The last one runs past the window's end, where the profiler stopped recording, so the
    backward inside it is not in the trace (a public Lightning trace: was 'no_backward' on its last step)."""
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 1_000
        b.step(i, t0, 1_000)
        b.op("aten::linear", t0 + 10, 100)
        b.op("Optimizer.step#AdamW.step", t0 + 600, 900, cat="user_annotation")
        if i < 2:
            b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 700, 300)
    assert "no_backward" not in findings(tmp_path, b)


def test_sync_every_step_on_a_gpu_run_with_the_time_lost(tmp_path):
    b = TraceBuilder()
    for i in range(3):
        train_step(b, i, i * 1000, zero_at=250, item=True)
        b.runtime("cudaStreamSynchronize", i * 1000 + 855, 90)  # a CUDA tensor's .item() waits for its stream
        b.kernel(i * 1000 + 20, 860)  # runs 30 us into the 100 us .item() of each step: the sync drains it
    f = findings(tmp_path, b)["sync_in_loop"]
    assert f.evidence["host_blocked_us"] == 300
    # the GPU idles from 880 until the next step's kernel at 1020 (the last step: until the window ends at 3000);
    # without the 100 us sync the host would have got there at most 100 us sooner: each sync costs 100 us of it
    assert f.evidence["gpu_idle_caused_us"] == 100 + 100 + 100
