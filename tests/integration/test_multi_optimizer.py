"""Issue 28, item 1 (capture side): the capture counts every optimizer's steps, makes a step of a GAN-like
iteration, and notices training it does not follow (child processes).

The scripts are tests/scripts/multi_optimizer.py (its docstring gives each loop's events, known by construction)
and tests/scripts/loop_marks.py. Real captures through ``kinetoscope capture``: counts only, never timings."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
#: steps 2-4 are recorded: skip 1, warm up 1, record 3
SCHEDULE = ("--skip-first", "1", "--wait", "0", "--warmup", "1", "--active", "3")

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def capture(out: Path, script: str, *args: str) -> tuple[dict, dict]:
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "capture", "--out", str(out), *SCHEDULE,
                           "--no-telemetry", "--", sys.executable, str(SCRIPTS / script), *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return (json.loads((out / "rank-0.manifest.json").read_text()), json.loads((out / "rank-0.steps.json").read_text()))


def marks_by_step(out: Path, name: str) -> dict[int, list[dict]]:
    (path,) = out.glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"}
    out_marks: dict[int, list[dict]] = {k: [] for k in steps}
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        if e.get("cat") == "kinetoscope" and e["name"] == "kinetoscope::" + name:
            for k, (t0, t1) in steps.items():
                if t0 <= e["ts"] < t1:
                    out_marks[k].append(e["args"])
    return out_marks


def test_a_gan_counts_both_optimizers_and_a_step_is_one_iteration(tmp_path):
    """12 batches; per batch D: 2 backward() + step, G: 1 backward() + step. Was: only D's 12 steps counted and a
    step ended at D's step. Now: G's step in the first iteration shows two optimizers per iteration, the profiler
    starts over at the second batch, and each later next() (batches 3-12 and the exhausted one) ends a step: 11
    steps of 3 backward() calls and 2 optimizer steps. The run's totals count all 12 iterations."""
    manifest, steps = capture(tmp_path / "out", "multi_optimizer.py", "gan", "--batches", "12")
    loop = manifest["loop"]
    assert (loop["step_source"], loop["step_source_why"]) == (
        "dataloader", "2 optimizers step in one DataLoader iteration: a step ends at each DataLoader iteration "
        "(one step = one iteration, every optimizer's step in it)")
    assert (loop["optimizers"], loop["optimizer_steps"], loop["backward_calls"]) == (2, 24, 36)
    assert manifest["steps_run"] == 11
    assert steps["optimizer_steps"] == [2] * 11 and steps["backward_calls"] == [3] * 11
    recorded = marks_by_step(tmp_path / "out", "optimizer_step")
    assert recorded == {k: [{"backward_calls": 2, "optimizer": 0}, {"backward_calls": 1, "optimizer": 1}]
                        for k in (2, 3, 4)}


def test_per_layer_optimizers_trained_in_turn_each_step_ends_a_step(tmp_path):
    """One batch, then 2 layers trained in turn, 5 Adam steps each: 10 optimizer steps, no DataLoader iteration
    between them. Was: the first layer's 5 steps only. The first next() started the first step: 10 steps, each one
    backward() and one optimizer step."""
    manifest, steps = capture(tmp_path / "out", "multi_optimizer.py", "per_layer", "--layers", "2", "--epochs", "5")
    loop = manifest["loop"]
    assert (loop["step_source"], loop["step_source_why"]) == (
        "optimizer", "a step ends at each optimizer.step(), any optimizer's")
    assert (loop["optimizers"], loop["optimizer_steps"], loop["backward_calls"]) == (2, 10, 10)
    assert manifest["steps_run"] == 10
    assert steps["optimizer_steps"] == [1] * 10 and steps["backward_calls"] == [1] * 10


def test_two_optimizers_after_one_backward_make_one_step_without_a_dataloader(tmp_path):
    """12 iterations, no DataLoader: one backward(), then SGD's and Adam's steps. Was: a step ended at each
    optimizer's step, so every iteration was a long step and a step holding Adam's step alone (read as an optimizer
    step without backward). Now: Adam's step after the first backward() shows two optimizers per iteration, the
    profiler starts over at the second iteration's SGD step, and each later SGD step (iterations 3-12) ends a step:
    10 steps, each one backward() and two optimizer steps (the previous iteration's Adam, this one's SGD)."""
    out = tmp_path / "out"
    manifest, steps = capture(out, "multi_optimizer.py", "two_after_backward", "--batches", "12")
    loop = manifest["loop"]
    assert (loop["step_source"], loop["step_source_why"]) == (
        "optimizer", "2 optimizers step after one backward(): a step ends at the first optimizer step after each "
        "backward() (one step = one iteration, every optimizer's step in it)")
    assert (loop["optimizers"], loop["optimizer_steps"], loop["backward_calls"]) == (2, 24, 12)
    assert manifest["steps_run"] == 10
    assert steps["optimizer_steps"] == [2] * 10 and steps["backward_calls"] == [1] * 10

    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report

    ids = {f.id for f in build_report(load_trace(out)).findings}
    assert not ids & {"no_backward", "optimizer_step_mismatch"}


def test_a_validation_pass_first_does_not_make_the_loop_a_dataloader_one(tmp_path):
    """3 validation batches under no_grad, then the 12 iterations above. Was: the validation loader's last next() and
    the two optimizer steps read as one DataLoader iteration of a GAN: steps at each next(), which never came again
    (no trace). A batch taken without gradients starts no training iteration: the same 10 steps as above."""
    manifest, steps = capture(tmp_path / "out", "multi_optimizer.py", "val_then_two", "--batches", "12")
    assert manifest["loop"]["step_source"] == "optimizer" and manifest["steps_run"] == 10
    assert steps["optimizer_steps"] == [2] * 10 and steps["backward_calls"] == [1] * 10
    assert manifest["traces"] == ["rank-0.step-2-4.pt.trace.json.gz"]


def test_a_closure_optimizer_after_two_optimizers_still_ends_steps(tmp_path):
    """3 iterations of SGD then Adam after one backward(), then 6 LBFGS steps whose closure runs backward() twice
    inside each (max_iter 2). Was: once the first phase set the step to the first optimizer after a backward(), a
    closure's backward (inside the step) was never seen and no LBFGS step ended a step: 1 step, no trace. The
    profiler starts at iteration 2's SGD step: iteration 3's SGD step ends the first step (Adam's, then iteration 3's
    forward, backward, SGD), then each LBFGS step one: 7 steps."""
    manifest, steps = capture(tmp_path / "out", "multi_optimizer.py", "two_then_lbfgs", "--epochs", "6")
    loop = manifest["loop"]
    assert (loop["optimizers"], loop["optimizer_steps"], loop["backward_calls"]) == (3, 12, 15)
    assert manifest["steps_run"] == 7
    assert steps["optimizer_steps"] == [2, 2, 1, 1, 1, 1, 1] and steps["backward_calls"] == [1] + [2] * 6


def test_an_optimizer_made_where_a_freed_one_lived_is_another_optimizer():
    """20 SGD optimizers, each made, stepped once and freed in turn: Python hands some of them a freed one's address
    (its ``id()``). 20 optimizers, numbered one after the other. Was: optimizers were told apart by ``id()``, so a
    new one at a freed one's address counted as it (CI: SGD and Adam freed, LBFGS made after them, 2 optimizers where
    the script has 3)."""
    import gc

    import torch

    from kinetoscope.capture import loop

    rec = loop.LoopRecorder()
    rec.attach()
    try:
        param = torch.nn.Parameter(torch.ones(1))
        param.grad = torch.ones(1)
        rec.begin_steps(0)
        addresses = []
        for _ in range(20):
            opt = torch.optim.SGD([param], lr=0.1)
            opt.step()
            addresses.append(id(opt))
            del opt
            gc.collect()
        assert len(set(addresses)) < 20, "Python never reused a freed optimizer's address: the test shows nothing"
        stepped = [e[4] for e in rec.pending if e[0] == "O"]
        rec.close_step(2**62, record=True, keep=True)
        # numbered in the process from where earlier optimizers left off (another test's, in one pytest process)
        assert stepped == list(range(stepped[0], stepped[0] + 20))
        assert rec.manifest("optimizer")["optimizers"] == 20
    finally:
        rec.detach()


def test_windows_of_steps_found_to_be_parts_of_iterations_are_removed(tmp_path):
    """9 iterations of one optimizer (a step each: window 2-4 written), then 3 where a second one steps after the
    same backward(): the steps so far were parts of iterations, the profiler starts over and its 1 step records no
    window. Was: the first window stayed on disk, named by no manifest, and analysed against the new run's 1 step."""
    out = tmp_path / "out"
    manifest, steps = capture(out, "multi_optimizer.py", "late_second", "--batches", "12")
    assert manifest["steps_run"] == 1 and manifest["traces"] == [] and steps["optimizer_steps"] == [2]
    assert not list(out.glob("*.pt.trace.json*"))


def test_a_single_optimizer_loop_keeps_its_steps_and_names_their_boundary(tmp_path):
    """loop_marks.py, 8 optimizer steps of 1 micro-step: the first next() starts the profiler and each optimizer step
    ends a step (8 steps), as before. Was: the manifest named the boundary "dataloader" (the kind that started the
    profiler), not the optimizer step that ends every step."""
    manifest, steps = capture(tmp_path / "out", "loop_marks.py", "auto", "--steps", "8", "--acc", "1", "--every",
                              "100")
    loop = manifest["loop"]
    assert (loop["step_source"], loop["optimizers"], loop["optimizer_steps"]) == ("optimizer", 1, 8)
    assert manifest["steps_run"] == 8 and steps["optimizer_steps"] == [1] * 8 and steps["backward_calls"] == [1] * 8


def test_training_in_spawned_children_is_said_not_analysed_as_training(tmp_path):
    """hogwild: 2 spawned processes train (target ``train``); the parent only evaluates 6 batches afterwards. The
    manifest names the children; the report says the window holds no training steps, as a rank warning and an
    info finding."""
    out = tmp_path / "out"
    manifest, steps = capture(out, "multi_optimizer.py", "hogwild", "--batches", "4", "--test-batches", "6")
    loop = manifest["loop"]
    assert loop["child_processes"] == {"started": 2, "targets": ["train"], "training_in_children": True,
                                       "dataloader_workers": 0, "spawned_ranks": 0}
    assert (loop["backward_calls"], loop["optimizer_steps"], loop["optimizers"]) == (0, 0, 0)
    # the parent's evaluation loader: its first next() starts the profiler, the 5 others and the exhausted one end
    # a step each
    assert manifest["steps_run"] == 6 and steps["backward_calls"] == [0] * 6

    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report

    report = build_report(load_trace(out))
    note = ("the window holds no training steps: the training ran in 2 Python child processes the capture does not "
            "follow (capture manifest)")
    assert note in report.ranks[0]["warnings"]
    (finding,) = [f for f in report.findings if f.id == "training_in_children"]
    assert finding.severity == "info" and finding.rank == 0
    assert finding.evidence == {"child_processes": 2, "targets": ["train"], "backward_calls": 0,
                                "optimizer_steps": 0}


def test_dataloader_workers_are_no_training_children(tmp_path):
    """A GAN over a DataLoader with 2 worker processes: the workers are counted as such, not as children that
    trained; the process trained itself."""
    manifest, _ = capture(tmp_path / "out", "multi_optimizer.py", "gan", "--batches", "6", "--workers", "2")
    assert manifest["loop"]["child_processes"] == {"started": 0, "targets": [], "training_in_children": False,
                                                   "dataloader_workers": 2, "spawned_ranks": 0}
