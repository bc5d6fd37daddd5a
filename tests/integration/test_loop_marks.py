"""Issue 28, items 1 and 7 (capture side): the capture writes down what the loop does - loader roles, micro-steps,
validation stretches, compilations, checkpoints - as marks in the trace, the manifest's ``loop`` object and the
per-step lists of steps.json, the same through ``kinetoscope capture``, ``Profiler`` and ``profile_loop``; and no
secret on the command line reaches a file the capture writes.

Every script is tests/scripts/loop_marks.py, whose loop events are known by construction (its docstring): T
optimizer steps of ACC micro-steps (one train batch, one backward() each), a validation pass of M batches after
every V-th optimizer step, saves after the listed steps. Timings are never asserted, only what is known: which
step holds which event, counts, roles, and that a measured time is 0 exactly where nothing was timed."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "scripts" / "loop_marks.py")
SECRET = "sk-proj4Tq9ZLx2Vb7NwE5rKc8YhJ3mPd6Ga1Su"
HF = "hf_Qm3Xv8Lt2Rb9Wn5Kp7Jd4Hs6Fc1Gz0Ay"
SECRET_ARGS = ("--api-key", SECRET, f"HF_TOKEN={HF}")
#: a DataLoader's description in the manifest, for the script's loaders (TensorDataset, batch_size 16, no workers)
LOADER = {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False, "pin_memory": False,
          "batch_size": 16, "class": "DataLoader", "collate": "default"}
#: the loaders' datasets as the capture reads them (``hooks.dataset_facts``): TensorDatasets of a 32-float and a
#: 1-float row per item, 16 x 8 steps x 4 micro-steps = 512 items to train on (512 x 33 float32: 67,584 bytes) and
#: 16 x 3 = 48 to validate on (6,336 bytes)
TRAIN_DATASET = {"dataset_class": "TensorDataset", "dataset_via": None, "dataset_items": 512, "dataset_tensors": 2,
                 "dataset_tensor_bytes": 67_584, "dataset_getitem": "tensor_rows"}
VAL_DATASET = {**TRAIN_DATASET, "dataset_items": 48, "dataset_tensor_bytes": 6_336}
ALL_KINDS = ["data_wait", "validation", "backward", "optimizer_step", "compile", "checkpoint", "workers"]
#: the trace's clock and time.time_ns() are two clocks: the marks are placed through each step's ProfilerStep span,
#: whose start is known only to lie between two host clock reads around prof.step() (a few us apart, more when
#: the thread is preempted there), and the profiler's clock is the TSC converted to wall time once at its start.
#: Measured: within 2 us; 1 ms is a bound no preemption or clock slew inside one window reaches.
CLOCK_TOLERANCE_US = 1000.0

pytestmark = pytest.mark.torch


def capture(out: Path, *args: str, schedule: tuple[str, ...] = ("--skip-first", "1", "--wait", "0", "--warmup", "1",
                                                                 "--active", "3")) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "capture", "--out", str(out), *schedule,
                           "--no-telemetry", "--", sys.executable, SCRIPT, "auto", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # one set of hooks (the loop recorder's: capture's step boundaries use them), and no pandas in a training job
    assert "wrappers: 1 1" in proc.stdout and "pandas imported: False" in proc.stdout, proc.stdout
    return proc


def run_api(mode: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, SCRIPT, mode, "--out", str(out), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "hooks restored: True" in proc.stdout, proc.stdout  # nothing left patched in the process
    assert "pandas imported: False" in proc.stdout, proc.stdout
    return proc


def sidecars(out: Path) -> tuple[dict, dict]:
    return (json.loads((out / "rank-0.manifest.json").read_text()), json.loads((out / "rank-0.steps.json").read_text()))


def trace_events(out: Path) -> list[dict]:
    (path,) = out.glob("*.pt.trace.json.gz")
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def marks(events: list[dict], name: str | None = None) -> list[dict]:
    return [e for e in events
            if e.get("cat") == "kinetoscope" and (name is None or e["name"] == "kinetoscope::" + name)]


def only_at(values: list, steps: set[int]) -> bool:
    """Positive exactly at ``steps``, 0 elsewhere."""
    return all((v > 0) if i in steps else (v == 0) for i, v in enumerate(values))


def in_step(events: list[dict], step: int, mark: dict) -> bool:
    (span,) = [e for e in events if e.get("name") == f"ProfilerStep#{step}" and e.get("cat") != "gpu_user_annotation"]
    return span["ts"] <= mark["ts"] < span["ts"] + span["dur"]


# --- kinetoscope capture: an unmodified script ------------------------------------------------------------------
@pytest.fixture(scope="module")
def auto(tmp_path_factory) -> Path:
    """8 optimizer steps of 4 micro-steps, validation (3 batches) after steps 3 and 7, torch.save after step 3."""
    out = tmp_path_factory.mktemp("auto") / "out"
    capture(out, "--steps", "8", "--acc", "4", "--every", "4", "--val-batches", "3", "--save-at", "3", *SECRET_ARGS)
    return out


@pytest.mark.slow
def test_a_validation_ended_by_setting_the_mode_directly_is_still_validation(tmp_path):
    """Lightning restores training mode by setting module.training itself, with no .train() call: the stretch ends
    at the next training batch (was: never ended, so it held a backward and counted as no validation at all)."""
    out = tmp_path / "out"
    capture(out, "--steps", "8", "--acc", "2", "--every", "4", "--val-batches", "3", "--restore-by-attribute")
    manifest, _ = sidecars(out)
    validation = manifest["loop"]["validation"]
    assert validation["stretches"] == 2 and validation["batches"] == 6


@pytest.mark.slow
def test_capture_writes_the_loop_into_the_manifest(auto):
    manifest, _ = sidecars(auto)
    loop = manifest["loop"]
    assert manifest["manifest_version"] == 2
    validation = loop.pop("validation")
    checkpoint = loop.pop("checkpoint")
    assert loop == {
        "marks": 3, "recorded": ALL_KINDS, "step_source": "optimizer",
        "step_source_why": "a step ends at each optimizer.step(), any optimizer's",
        # every one of the 32 train batches is followed by its backward(); the validation loader's 6 (two passes
        # of 3) by none, all taken in eval mode with grad disabled: for evaluation
        "loaders": [{"loader": 0, "role": "train", "batches": 32, "batches_followed_by_backward": 32,
                     "batches_for_evaluation": 0, **LOADER, **TRAIN_DATASET},
                    {"loader": 1, "role": "eval", "batches": 6, "batches_followed_by_backward": 0,
                     "batches_for_evaluation": 6, **LOADER, **VAL_DATASET}],
        "backward_calls": 32, "optimizer_steps": 8, "optimizers": 1,  # accumulation 4
        # no Python child process started (no DataLoader workers): 0, not null
        "child_processes": {"started": 0, "targets": [], "training_in_children": False, "dataloader_workers": 0,
                            "spawned_ranks": 0},
        "compile": {"compiles": 0, "recompiles": 0, "total_ns": 0, "recompile_total_ns": 0},  # armed, none: 0, not null
        "workers": {"starts": 0, "stops": 0, "restarts": 0, "total_ns": 0, "restart_total_ns": 0},  # no workers
    }
    assert validation["stretches"] == 2 and validation["batches"] == 6 and validation["total_ns"] > 0
    assert checkpoint["saves"] == 1 and checkpoint["total_ns"] > 0
    # the training loader's configuration is the manifest's DataLoader (was: the first one iterated)
    # with the hand-over of a batch like its own measured (num_workers=0): a 16x32 and a 16x1 float32 tensor
    probe = manifest["dataloader"].pop("handover_probe")
    assert probe["batch_bytes"] == 16 * 33 * 4 and probe["samples"] == 20 and probe["why"] is None
    assert manifest["dataloader"] == {**{k: v for k, v in LOADER.items() if k != "class"}, **TRAIN_DATASET}


def test_capture_writes_per_step_lists(auto):
    manifest, steps = sidecars(auto)
    # the first optimizer step starts the profiler: steps 0-6 are (optimizer step k, optimizer step k + 1]; the
    # validation and save after optimizer step 3 fall in step 3; the one after step 7 comes after the last step
    assert manifest["steps_run"] == 7
    assert steps["backward_calls"] == [4] * 7 and steps["optimizer_steps"] == [1] * 7
    assert only_at(steps["train_data_wait_ns"], set(range(7)))
    assert only_at(steps["eval_data_wait_ns"], {3}) and only_at(steps["validation_ns"], {3})
    assert only_at(steps["checkpoint_ns"], {3}) and steps["compile_ns"] == [0] * 7
    # every wait on the training thread is a train or an eval loader's, counted once
    assert steps["data_wait_ns"] == [a + b for a, b in zip(steps["train_data_wait_ns"], steps["eval_data_wait_ns"],
                                                           strict=True)]


def test_capture_splices_the_windows_marks(auto):
    events = trace_events(auto)
    waits = marks(events, "data_wait")
    # window: steps 2-4 (optimizer steps 3-5 and the batches 12-23 before them), and the validation after step 3
    train = [m["args"] for m in waits if m["args"]["loader"] == 0]
    assert train == [{"loader": 0, "role": "train", "batch": b, "evaluation": False} for b in range(12, 24)]
    assert [m["args"] for m in waits if m["args"]["loader"] == 1] == [
        {"loader": 1, "role": "eval", "batch": k, "evaluation": True} for k in range(3)] + [
        {"loader": 1, "role": "eval", "batch": 3, "evaluation": True, "exhausted": True}]
    assert [m["args"]["micro_step"] for m in marks(events, "backward")] == [1, 2, 3, 4] * 3
    assert {m["args"]["thread"] for m in marks(events, "backward")} == {"main"}
    assert [m["args"] for m in marks(events, "optimizer_step")] == [{"backward_calls": 4, "optimizer": 0}] * 3
    assert [m["args"] for m in marks(events, "validation")] == [{"module": "Sequential", "batches": 3, "loader": 1}]
    assert [m["args"] for m in marks(events, "checkpoint")] == [{"call": "torch.save"}]
    assert not marks(events, "compile")
    # on the trace's process and the training thread (the thread of its ProfilerStep spans)
    (step,) = [e for e in events if e.get("name") == "ProfilerStep#3" and e.get("cat") == "user_annotation"]
    assert {(m["pid"], m["tid"]) for m in marks(events)} == {(step["pid"], step["tid"])}
    (validation,) = marks(events, "validation")
    assert in_step(events, 3, validation)


def test_each_data_wait_mark_holds_torchs_own_dataloader_span(auto):
    """The mark times the whole next(); torch's enumerate(DataLoader)#... span is recorded inside that call: on the
    trace's clock each span lies inside its mark (tolerance: CLOCK_TOLERANCE_US), the k-th span in the k-th mark."""
    events = trace_events(auto)
    spans = sorted((e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("enumerate(DataLoader)#")),
                   key=lambda e: e["ts"])
    waits = sorted(marks(events, "data_wait"), key=lambda e: e["ts"])
    assert len(spans) == len(waits) == 16
    for mark, span in zip(waits, spans, strict=True):
        assert span["tid"] == mark["tid"]
        assert mark["ts"] - CLOCK_TOLERANCE_US <= span["ts"], (mark, span)
        assert span["ts"] + span["dur"] <= mark["ts"] + mark["dur"] + CLOCK_TOLERANCE_US, (mark, span)


def test_no_secret_of_the_command_line_reaches_a_file(auto):
    manifest, _ = sidecars(auto)
    argv = manifest["argv"]
    assert argv[argv.index("--api-key") + 1] == "[redacted]" and "HF_TOKEN=[redacted]" in argv
    files = [p for p in auto.rglob("*") if p.is_file()]
    assert {p.name for p in files} == {"rank-0.manifest.json", "rank-0.steps.json", "rank-0.step-2-4.pt.trace.json.gz"}
    for p in files:
        data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        assert SECRET.encode() not in data and HF.encode() not in data, p.name


def test_the_analysis_reads_the_marks(auto):
    from kinetoscope.analyze.ingest.loader import load_trace

    r = load_trace(auto).ranks[0]
    manifest, steps = sidecars(auto)
    assert r.meta.capture["loop"] == manifest["loop"]
    assert r.marks["name"].astype(str).value_counts().to_dict() == {
        "kinetoscope::data_wait": 16, "kinetoscope::backward": 12, "kinetoscope::optimizer_step": 3,
        "kinetoscope::validation": 1, "kinetoscope::checkpoint": 1}
    assert (r.events["kind"].iloc[r.marks["row"]] == "mark").all() and int((r.events["kind"] == "mark").sum()) == 33
    waits = r.marks[r.marks["name"] == "kinetoscope::data_wait"]
    assert waits["loader"].tolist() == [0] * 4 + [1] * 4 + [0] * 8 and set(waits["role"]) == {"train", "eval"}
    assert waits["evaluation"].tolist() == [False] * 4 + [True] * 4 + [False] * 8  # taken with grad disabled
    assert r.marks.loc[r.marks["name"] == "kinetoscope::backward", "micro_step"].tolist() == [1, 2, 3, 4] * 3
    # the run's steps less those in which the capture wrote its trace
    kept = [i for i, b in enumerate(steps["capture_busy_ns"]) if not b]
    assert len(kept) < len(steps["capture_busy_ns"]) and r.run_steps["step"].tolist() == kept
    assert r.run_steps["backward_calls"].tolist() == [steps["backward_calls"][i] for i in kept]
    assert r.run_steps["validation_ns"].tolist() == [float(steps["validation_ns"][i]) for i in kept]


def test_both_decoders_read_the_same_marks(auto):
    from kinetoscope.analyze.ingest.limits import LoadLimits
    from kinetoscope.analyze.ingest.loader import load_trace

    scanned = load_trace(auto).ranks[0].marks
    reference = load_trace(auto, LoadLimits(decoder="reference")).ranks[0].marks
    assert scanned.astype(object).equals(reference.astype(object))


def test_marks_tell_the_training_loaders_waits_from_the_validation_loaders(auto, tmp_path):
    """The same capture with and without its marks: with them, the validation loader's waits in the window (step 3
    holds a validation pass) are no training data wait, and are reported apart; without them (a trace from
    elsewhere) the same 4 waits are inferred to be the evaluation's - no backward follows them, several in a row
    (was: every wait on the training thread counted)."""
    bare = tmp_path / "bare"
    shutil.copytree(auto, bare)  # the sidecars too: the same capture, but for the marks
    (path,) = bare.glob("*.pt.trace.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "kinetoscope"]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))

    def loader(p: Path) -> dict:
        proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "analyze", "--format", "json", str(p)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode in (0, 1), proc.stderr
        return json.loads(proc.stdout)["ranks"][0]["loader"]

    with_marks, without = loader(auto), loader(bare)
    assert with_marks["eval_loader_wait_basis"] == "capture marks" and without["eval_loader_wait_basis"] == "inferred"
    # the 3 validation batches of the window's step 3, and the next() that found the validation loader exhausted,
    # left out of the training loop's waits either way
    assert with_marks["calls"] == without["calls"]
    # the inferred are the validation loader's torch spans, which the marks (whole next() calls) contain
    assert 0 < without["eval_loader_wait_us"] <= with_marks["eval_loader_wait_us"]


# --- the Python APIs record the same things -------------------------------------------------------------------
@pytest.mark.slow
def test_the_profiler_api_records_the_loop(tmp_path):
    """Was: no data waits at all ("waiting for data 0.0%"). One prof.step() after each optimizer step: step k holds
    optimizer step k; the step still open at stop (after the 8th prof.step()) holds nothing."""
    out = tmp_path / "out"
    run_api("profiler", out, "--steps", "8", "--acc", "4", "--every", "4", "--save-at", "5", "--dcp-at", "6",
            *SECRET_ARGS)
    manifest, steps = sidecars(out)
    loop = manifest["loop"]
    assert loop["step_source"] == "profiler_step" and loop["recorded"] == ALL_KINDS
    assert [(x["loader"], x["role"], x["batches"], x["batches_followed_by_backward"]) for x in loop["loaders"]] == [
        (0, "train", 32, 32), (1, "eval", 6, 0)]
    assert (loop["backward_calls"], loop["optimizer_steps"]) == (32, 8)
    assert (loop["validation"]["stretches"], loop["validation"]["batches"], loop["checkpoint"]["saves"]) == (2, 6, 2)
    assert manifest["steps_run"] == 9
    assert steps["backward_calls"] == [4] * 8 + [0] and steps["optimizer_steps"] == [1] * 8 + [0]
    assert only_at(steps["data_wait_ns"], set(range(8))) and only_at(steps["train_data_wait_ns"], set(range(8)))
    assert only_at(steps["validation_ns"], {3, 7}) and only_at(steps["eval_data_wait_ns"], {3, 7})
    assert only_at(steps["checkpoint_ns"], {5, 6})
    events = trace_events(out)
    assert [m["args"]["batch"] for m in marks(events, "data_wait") if m["args"]["loader"] == 0] == list(range(8, 20))
    assert [m["args"] for m in marks(events, "validation")] == [{"module": "Sequential", "batches": 3, "loader": 1}]
    assert not marks(events, "checkpoint")  # steps 5 and 6 are outside the window (2-4)
    argv = manifest["argv"]
    assert argv[argv.index("--api-key") + 1] == "[redacted]"
    for p in out.iterdir():
        data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        assert SECRET.encode() not in data and HF.encode() not in data, p.name


@pytest.mark.slow
def test_profile_loop_times_each_wait_once(tmp_path):
    """profile_loop over a DataLoader: one step per batch. Its own timing of next() and the loop recorder's are
    one wait, counted once: each profiled step's data_wait_ns is exactly its one data_wait mark."""
    out = tmp_path / "out"
    run_api("profile_loop", out, "--steps", "4", "--acc", "4", "--every", "2")
    manifest, steps = sidecars(out)
    loop = manifest["loop"]
    assert loop["step_source"] == "dataloader" and manifest["steps_run"] == 16
    assert [(x["role"], x["batches"], x["batches_followed_by_backward"]) for x in loop["loaders"]] == [
        ("train", 16, 16), ("eval", 6, 0)]
    assert steps["backward_calls"] == [1] * 16 and steps["optimizer_steps"] == [0, 0, 0, 1] * 4
    assert only_at(steps["validation_ns"], {7, 15}) and only_at(steps["eval_data_wait_ns"], {7, 15})
    assert steps["data_wait_ns"] == [a + b for a, b in zip(steps["train_data_wait_ns"], steps["eval_data_wait_ns"],
                                                           strict=True)]
    events = trace_events(out)
    for k in (2, 3, 4):
        inside = [m for m in marks(events, "data_wait") if in_step(events, k, m)]
        assert [m["args"] for m in inside] == [{"loader": 0, "role": "train", "batch": k, "evaluation": False}]
        assert steps["data_wait_ns"][k] == round(inside[0]["dur"] * 1000)


@pytest.mark.slow
def test_compile_and_recompile_are_recorded(tmp_path):
    """torch.compile (eager backend) compiles in the first step, before the profiler starts (counted in the run's
    totals), and recompiles once for the half batch of optimizer step 2's first micro-step: step 1."""
    out = tmp_path / "out"
    capture(out, "--steps", "4", "--acc", "2", "--every", "100", "--compile", "--recompile-at", "2",
            schedule=("--skip-first", "0", "--wait", "0", "--warmup", "1", "--active", "2"))
    manifest, steps = sidecars(out)
    compile_ = manifest["loop"]["compile"]
    assert (compile_["compiles"], compile_["recompiles"]) == (2, 1) and compile_["total_ns"] > 0
    assert manifest["steps_run"] == 3 and only_at(steps["compile_ns"], {1})
    assert [m["args"] for m in marks(trace_events(out), "compile")] == [
        {"compile_id": "0/1", "recompile": True, "trigger": "dynamo"}]


# --- the hooks come and go ------------------------------------------------------------------------------------
def test_hooks_are_reference_counted_and_put_back():
    import torch

    from kinetoscope.capture import loop

    dl = torch.utils.data.dataloader
    originals = (dl._BaseDataLoaderIter.__next__, torch.autograd.backward, torch.nn.Module.train, torch.save,
                 dl._MultiProcessingDataLoaderIter.__init__, dl._MultiProcessingDataLoaderIter._shutdown_workers)
    a, b = loop.LoopRecorder(), loop.LoopRecorder()
    a.attach()
    b.attach()
    assert torch.autograd.backward is not originals[1]
    a.detach()
    assert torch.autograd.backward is not originals[1]  # b still records
    x = torch.ones(2, requires_grad=True)
    x.sum().backward()
    b.close_step(2**62, record=False, keep=False)
    assert (a.backward_calls, b.backward_calls) == (0, 1)
    b.detach()
    mp_iter = dl._MultiProcessingDataLoaderIter
    assert (dl._BaseDataLoaderIter.__next__, torch.autograd.backward, torch.nn.Module.train, torch.save,
            mp_iter.__init__, mp_iter._shutdown_workers) == originals
    # a wrapper someone put over ours stays, and ours under it passes through
    a.attach()
    ours = torch.autograd.backward
    theirs = lambda *args, **kwargs: ours(*args, **kwargs)  # noqa: E731
    torch.autograd.backward = theirs
    a.detach()
    try:
        assert torch.autograd.backward is theirs
        x.sum().backward()
        assert a.pending == []
    finally:
        torch.autograd.backward = originals[1]


def test_status_files_hold_no_command_line(tmp_path, monkeypatch):
    """What the capture tells its CLI while it runs (.kinetoscope-status-<pid>.json): no argv, which may hold
    secrets."""
    from kinetoscope.capture import auto

    monkeypatch.setattr(sys, "argv", ["train.py", "--api-key", SECRET])
    auto.write_status(str(tmp_path), {"steps": 4, "source": "optimizer"})
    (status,) = tmp_path.glob(".kinetoscope-status-*.json")
    assert json.loads(status.read_text()) == {"pid": os.getpid(), "steps": 4, "source": "optimizer"}
    # the first one, written by the sitecustomize hook as a Python process under capture starts
    started = tmp_path / "started"
    started.mkdir()
    env = {**os.environ, "KINETOSCOPE_CAPTURE": json.dumps({"out_dir": str(started)}),
           "PYTHONPATH": str(ROOT / "kinetoscope" / "capture" / "_site")}
    env.pop("KINETOSCOPE_CAPTURE_PARENT", None)
    subprocess.run([sys.executable, "-c", "pass", "--api-key", SECRET], env=env, check=True, timeout=60)
    (status,) = started.glob(".kinetoscope-status-*.json")
    assert set(json.loads(status.read_text())) == {"pid", "python"} and SECRET not in status.read_text()


def test_the_marks_role_rule():
    from kinetoscope.capture.loop import _Loader

    assert _Loader(batches=4, followed=2).role() == "train"
    assert _Loader(batches=4, followed=1, evalish=4).role() == "unknown"
    # batches taken for evaluation leave the count: 3 of 4 training batches followed (was "unknown": 3 of 8)
    assert _Loader(batches=8, followed=3, evalish=4, for_evaluation=4).role() == "train"
    assert _Loader(batches=8, followed=1, evalish=4, for_evaluation=4).role() == "unknown"
    assert _Loader(batches=4, followed=0, evalish=4, for_evaluation=4).role() == "eval"
    assert _Loader(batches=4, followed=0, evalish=3).role() == "eval"
    assert _Loader(batches=4, followed=0, evalish=2).role() == "unknown"
    assert _Loader().role() == "unknown"


# --- kinetoscope redact DIR --------------------------------------------------------------------------------------
def test_redact_takes_a_capture_directory(auto, tmp_path, capsys):
    from kinetoscope.cli import main  # the command's own entry, in this process (a new one costs ~1.5 s a call)

    out = tmp_path / "shared"
    assert main(["redact", str(auto), "-o", str(out)]) == 0, capsys.readouterr().err
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in auto.iterdir())
    for p in out.iterdir():
        data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        assert SECRET.encode() not in data and HF.encode() not in data
        original = auto / p.name
        same = gzip.decompress(original.read_bytes()) if p.name.endswith(".gz") else original.read_bytes()
        assert json.loads(data) == json.loads(same)  # already redacted at capture: nothing else changes
    capsys.readouterr()
    code = main(["redact", str(auto), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_redact_refuses_a_directory_with_a_broken_trace_and_writes_nothing(tmp_path, capsys):
    from kinetoscope.cli import main

    src = tmp_path / "run"
    src.mkdir()
    (src / "rank-0.manifest.json").write_text(json.dumps({"argv": ["train.py", "--password", "hunter2"]}))
    (src / "rank-0.step-2-4.pt.trace.json").write_text('{"traceEvents": [')
    out = tmp_path / "shared"
    code = main(["redact", str(src), "-o", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "rank-0.step-2-4.pt.trace.json" in err and not out.exists()


def test_a_step_inside_a_validation_reads_its_wall_never_more():
    """Was: a Hogwild parent's test pass covered every step, and validation_ns summed to 1.00016 of the steps' walls
    (the recorder's step spans, on the hooks' wall clock, hold the Profiler's bookkeeping at each boundary; its walls,
    on a monotonic clock, start after it). Each step's marked time is given on the walls' clock: times wall / span.
    Events are fed by hand, their times known by construction: a stretch from 0 to 3000 ns over steps [0, 1000],
    [1000, 3000]; the walls 900 and 1900 ns."""
    import torch

    from kinetoscope.capture import loop

    rec = loop.LoopRecorder()
    rec.attach()
    try:
        module = torch.nn.Linear(1, 1)
        rec.begin_steps(0)
        rec.pending[:] = [("M", 0, rec.training_thread, id(module), "Linear", False)]
        rec.close_step(1000, record=True, keep=False)
        rec.pending[:] = [("M", 3000, rec.training_thread, id(module), "Linear", True)]
        rec.close_step(3000, record=True, keep=False)
        lists = rec.step_lists(2, [900, 1900])
        assert lists["validation_ns"] == [900, 1900]  # 1000 * 900 // 1000, 2000 * 1900 // 2000
        assert rec.step_lists(2)["validation_ns"] == [1000, 2000]  # on the hooks' clock when no walls are given
    finally:
        rec.detach()


# --- DataLoader workers started again ---------------------------------------------------------------------------
def test_a_restart_costs_its_start_and_the_stop_before_it():
    """Events fed by hand, times known by construction (ns). Loader 0 (an iterator per epoch): start [0, 100],
    stop [1000, 1050], start [2000, 2300] (a restart), stop [3000, 3040], start [4000, 4200] (a restart). Loader 1:
    one start [500, 520], never again. Loader 2 (iter() called again before the first iterator is dropped): start
    [5000, 5100], start [6000, 6100] (a restart, no stop before it), then the first iterator's stop [7000, 7030]
    (a newer one already runs: part of the restart). Restarts: 300 + 50 + 200 + 40 + 100 + 30 = 720 ns."""
    from kinetoscope.capture import loop

    rec = loop.LoopRecorder()
    rec.attach()
    try:
        tid = rec.training_thread
        rec.begin_steps(0)
        rec.pending[:] = [("L", 0, 100, tid, "start", 0, 2, None), ("L", 500, 520, tid, "start", 1, 4, None),
                          ("L", 1000, 1050, tid, "stop", 0, 2, None), ("L", 2000, 2300, tid, "start", 0, 2, None),
                          ("L", 3000, 3040, tid, "stop", 0, 2, None), ("L", 4000, 4200, tid, "start", 0, 2, None),
                          ("L", 5000, 5100, tid, "start", 2, 1, None), ("L", 6000, 6100, tid, "start", 2, 1, None),
                          ("L", 7000, 7030, tid, "stop", 2, 1, None)]
        rec.close_step(10_000, record=True, keep=True)
        workers = rec.manifest("optimizer")["workers"]
        assert workers == {"starts": 6, "stops": 3, "restarts": 3,
                           "total_ns": 100 + 20 + 50 + 300 + 40 + 200 + 100 + 100 + 30, "restart_total_ns": 720}
        kept = rec.take_marks(0, 10_000)
        assert [m[4]["restart"] for m in kept if m[0] == "workers_start"] == [False, False, True, True, False, True]
        # loader 0's stops are followed by restarts, loader 2's ends an iterator a newer one replaced
        assert [(m[4]["loader"], m[4]["restart"]) for m in kept if m[0] == "workers_stop"] == [
            (0, True), (0, True), (2, True)]
    finally:
        rec.detach()


@pytest.mark.parametrize("how", ["one loader", "persistent", "a loader per epoch", "two loaders"])
def test_real_worker_restarts_are_recorded(how):
    """Three epochs with 2 workers. One DataLoader: each epoch's iterator starts 2 new processes and stops them when
    exhausted (3 starts, 3 stops, 2 restarts). With persistent workers: one start and no stop while the loader
    lives. A DataLoader built anew each epoch over the same dataset: the same 2 restarts. Two loaders over the same
    dataset, both alive (a train and a test loader), each iterated once per epoch: 6 starts, 4 restarts (never one
    loader's start counted as the other's restart: 4, not 5)."""
    import torch

    from kinetoscope.capture import loop

    data = torch.utils.data.TensorDataset(torch.arange(8.0))

    def make():
        return torch.utils.data.DataLoader(data, batch_size=4, num_workers=2, persistent_workers=how == "persistent")

    loaders = [make(), make()] if how == "two loaders" else [make()]
    rec = loop.LoopRecorder()
    rec.attach()
    try:
        rec.begin_steps(time.time_ns())
        for _ in range(3):
            if how == "a loader per epoch":
                loaders = [make()]
            for loader in loaders:
                assert sum(len(b[0]) for b in loader) == 8
        rec.close_step(time.time_ns(), record=True, keep=True)
        workers = rec.manifest("dataloader")["workers"]
        marks_ = rec.take_marks(0, 2**62)
    finally:
        rec.detach()
        del loaders, loader
    expected = {"one loader": (3, 3, 2), "persistent": (1, 0, 0), "a loader per epoch": (3, 3, 2),
                "two loaders": (6, 6, 4)}[how]
    assert (workers["starts"], workers["stops"], workers["restarts"]) == expected
    assert (workers["restart_total_ns"] > 0) is (how != "persistent")
    assert {m[4]["workers"] for m in marks_ if m[0].startswith("workers_")} == {2}


@contextlib.contextmanager
def fed_recorder():
    """A loop recorder whose events the test feeds by hand (``rec.pending``), its first step starting at 0."""
    from kinetoscope.capture import loop

    rec = loop.LoopRecorder()
    rec.attach()
    try:
        rec.begin_steps(0)
        yield rec
    finally:
        rec.detach()


def tagged_iterator(loader: int):
    """Any DataLoader iterator, tagged as loader ``loader``'s (how the hooks number loaders)."""
    import torch

    it = iter(torch.utils.data.DataLoader([1, 2]))
    it._kinetoscope_loader = loader
    return it


def test_an_evaluator_over_the_training_loader_leaves_its_training_waits_the_loops():
    """Ignite's shape (was: its one loader "unknown", 93 of 188 batches followed by a backward, and every step's
    train_data_wait_ns 0 while the loop waited 5.6-11 ms a step). Events fed by hand (ns), one loader: two training
    steps take a batch (waits 100 and 200) and run backward; the third step's evaluator, in an eval stretch with grad
    disabled, takes four batches of the same loader (waits 1000, 100, 100, 1600) and a training batch after it (300)
    is followed by a backward. The loader is "train" (3 of its 3 training batches followed; was "unknown": 3 of 7);
    the training waits are 100, 200, 300 and the evaluation's 2800, per step; the marks say which batch was taken for
    evaluation."""
    import torch

    with fed_recorder() as rec:
        tid = rec.training_thread
        module = torch.nn.Linear(1, 1)
        it = tagged_iterator(0)
        rec.pending[:] = [("W", 200, 100, 0, 0, tid, it, 0, True, False), ("B", 300, 400, tid)]
        rec.close_step(1000, record=True, keep=True)
        rec.pending[:] = [("W", 1300, 200, 0, 0, tid, it, 1, True, False), ("B", 1400, 1500, tid)]
        rec.close_step(2000, record=True, keep=True)
        rec.pending[:] = [("M", 2100, tid, id(module), "Linear", False),
                          ("W", 3200, 1000, 0, 0, tid, it, 0, False, False),
                          ("W", 3400, 100, 0, 0, tid, it, 1, False, False),
                          ("W", 3600, 100, 0, 0, tid, it, 2, False, False),
                          ("W", 5300, 1600, 0, 0, tid, it, 3, False, False),
                          ("M", 5400, tid, id(module), "Linear", True),
                          ("W", 5800, 300, 0, 0, tid, it, 2, True, False), ("B", 5900, 6000, tid)]
        rec.close_step(7000, record=True, keep=True)
        assert rec.roles() == {0: "train"}
        lists = rec.step_lists(3)
        assert lists["train_data_wait_ns"] == [100, 200, 300]
        assert lists["eval_data_wait_ns"] == [0, 0, 2800]
        entry = rec.manifest("optimizer")["loaders"][0]
        assert (entry["role"], entry["batches"], entry["batches_followed_by_backward"],
                entry["batches_for_evaluation"]) == ("train", 7, 3, 4)
        waits = [m for m in rec.take_marks(0, 7000) if m[0] == "data_wait"]
        assert [(m[4]["batch"], m[4]["evaluation"]) for m in waits] == [
            (0, False), (1, False), (0, True), (1, True), (2, True), (3, True), (2, False)]
        assert {m[4]["role"] for m in waits} == {"train"}


def test_a_batch_taken_without_grad_then_trained_on_is_a_training_batch():
    """A reviewer's case: ``with torch.no_grad(): x, y = next(it)``, then forward, backward and step, every batch (was:
    the loader "eval", train_data_wait_ns 0 while the loop waited 67% of its run). Events fed by hand (ns), three
    steps, each a batch taken with grad disabled (waits 100, 200, 300) and a backward: the batch a backward follows
    with no training batch between was trained on - the loader is "train", its waits the training loop's, its marks
    not for evaluation."""
    with fed_recorder() as rec:
        tid = rec.training_thread
        it = tagged_iterator(0)
        for k, wait in enumerate((100, 200, 300)):
            t = k * 1000
            rec.pending[:] = [("W", t + 400, wait, 0, 0, tid, it, k, False, False), ("B", t + 500, t + 600, tid)]
            rec.close_step(t + 1000, record=True, keep=True)
        assert rec.roles() == {0: "train"}
        lists = rec.step_lists(3)
        assert lists["train_data_wait_ns"] == [100, 200, 300] and lists["eval_data_wait_ns"] == [0, 0, 0]
        entry = rec.manifest("optimizer")["loaders"][0]
        assert (entry["batches_followed_by_backward"], entry["batches_for_evaluation"]) == (3, 0)
        assert [m[4]["evaluation"] for m in rec.take_marks(0, 3000) if m[0] == "data_wait"] == [False] * 3


def test_a_training_batch_taken_before_model_train_is_training_and_the_last_validation_batch_is_not():
    """A reviewer's case: a validation pass (module in eval mode, loader 1: two batches of 1000 and 2000 ns, grad
    disabled), then the next training step takes loader 0's batch (500 ns) before calling ``model.train()`` - inside
    the eval stretch, so taken for evaluation - and runs its backward. That batch is the latest before the backward:
    training after all (was: its wait, a worker restart's, went to eval_data_wait_ns). The validation loader's last
    batch, also waiting when the backward came, is not: loader 1 stays "eval", its 3000 ns the evaluation's."""
    import torch

    with fed_recorder() as rec:
        tid = rec.training_thread
        module = torch.nn.Linear(1, 1)
        train, val = tagged_iterator(0), tagged_iterator(1)
        rec.pending[:] = [("W", 200, 100, 0, 0, tid, train, 0, True, False), ("B", 300, 400, tid)]
        rec.close_step(1000, record=True, keep=True)
        rec.pending[:] = [("M", 1100, tid, id(module), "Linear", False),
                          ("W", 2200, 1000, 0, 0, tid, val, 0, False, False),
                          ("W", 4300, 2000, 0, 0, tid, val, 1, False, False),
                          ("W", 4900, 500, 0, 0, tid, train, 1, True, False),
                          ("M", 5000, tid, id(module), "Linear", True), ("B", 5100, 5200, tid)]
        rec.close_step(6000, record=True, keep=True)
        assert rec.roles() == {0: "train", 1: "eval"}
        lists = rec.step_lists(2)
        assert lists["train_data_wait_ns"] == [100, 500] and lists["eval_data_wait_ns"] == [0, 3000]
        marks = [(m[4]["loader"], m[4]["batch"], m[4]["evaluation"]) for m in rec.take_marks(0, 6000)
                 if m[0] == "data_wait"]
        assert marks == [(0, 0, False), (1, 0, True), (1, 1, True), (0, 1, False)]


def test_the_next_that_stops_the_workers_waits_for_no_data():
    """Events fed by hand (ns): loader 0's last next() runs [1000, 1600] and raises StopIteration after stopping the
    workers [1100, 1500]: its wait for data is 600 - 400 = 200 ns (was: 600, the shutdown read as a data wait); an
    ordinary next() [2000, 2050] of a new iterator keeps its 50."""
    import torch

    from kinetoscope.capture import loop

    rec = loop.LoopRecorder()
    rec.attach()
    try:
        tid = rec.training_thread
        rec.begin_steps(0)
        rec.pending[:] = [("L", 0, 100, tid, "start", 0, 2, None)]
        it = iter(torch.utils.data.DataLoader([1, 2]))  # any iterator: a tag for loader 0
        it._kinetoscope_loader = 0
        rec.pending += [("L", 1100, 1500, tid, "stop", 0, 2, None), ("W", 1600, 600, 0, 0, tid, it, 2, True, True),
                        ("L", 1700, 1900, tid, "start", 0, 2, None), ("W", 2050, 50, 0, 0, tid, it, 0, True, False)]
        out = rec.close_step(10_000, record=True, keep=False)
        assert out.data_wait_ns == 250
    finally:
        rec.detach()


def test_a_grad_off_loop_of_the_trained_models_forward_is_an_evaluation():
    """The forty-ninth set's ddp_rank0_probe_eval_mlp_2rank: every 5 steps rank 0 alone ran its model over a probe set
    in 8 chunks under ``torch.no_grad()``, with no ``.eval()`` and no DataLoader - unmarked, so its partner's waits for
    it read as lateness that moves. Real hooks, one process: after the optimizer's first step, a no_grad stretch of the
    trained model's forward 8 times is one ``G`` event; one forward under no_grad (a pseudo-label) gives none; a stretch
    whose second forward runs after a nested no_grad's first gives one (the outermost stretch counts); a frozen
    teacher's forwards (parameters no optimizer holds) give none; inference_mode's two forwards of the trained model
    give one."""
    import torch

    from kinetoscope.capture import loop

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    teacher = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(3, 4)
    rec = loop.LoopRecorder()
    rec.attach()
    try:
        with torch.no_grad():  # before any optimizer step: whose model it is, is not known yet
            model(x), model(x)
        model(x).sum().backward()
        opt.step()
        with torch.no_grad():
            for _ in range(8):
                model(x)
        with torch.no_grad():  # one forward: part of a training step
            model(x)
        with torch.no_grad():
            with torch.no_grad():  # nested: the outermost stretch counts
                model(x)
            model(x)
        with torch.no_grad():
            teacher(x), teacher(x)
        with torch.inference_mode():
            model(x), model(x)
        grad_off = [e for e in rec.pending if e[0] == "G"]
    finally:
        rec.detach()
    # the count stops at two (the hook is removed there: an evaluation pays for two calls, not all of its modules')
    assert [(e[4], e[5]) for e in grad_off] == [("Sequential", 2)] * 3
    assert torch.is_grad_enabled()


def test_a_grad_off_evaluation_is_a_validation_stretch_unless_it_belongs_to_a_step_or_is_one_already():
    """Events fed by hand (ns). Step 2 (1000-2000): a training batch and its backward, then a grad-off stretch of the
    trained model's forwards (1200-1700) taking two batches of loader 1 with grad disabled; step 3's training batch
    (2100) tells it apart: an evaluation - a mark with ``grad_off``, 500 ns of step 2's validation_ns, the manifest's
    stretches and batches. Not evaluations: in step 3, one an eval stretch holds (2300-2400: the eval stretch is the
    mark), one holding a mode change (2550-2700: ``@torch.no_grad()`` around ``model.eval()``; was counted twice), one
    holding a backward; in step 4, one taken while a training batch waits for its backward (MixMatch's label guesses)
    and one a backward follows before any training batch (a rollout). The last, in step 5, is settled when the
    recording ends: an evaluation."""
    import torch

    with fed_recorder() as rec:
        tid = rec.training_thread
        module = torch.nn.Linear(1, 1)
        train, val = tagged_iterator(0), tagged_iterator(1)
        rec.pending[:] = [("W", 200, 100, 0, 0, tid, train, 0, True, False), ("B", 300, 400, tid)]
        rec.close_step(1000, record=True, keep=True)
        rec.pending[:] = [("W", 1100, 50, 0, 0, tid, train, 1, True, False), ("B", 1150, 1180, tid),
                          ("W", 1300, 100, 0, 0, tid, val, 0, False, False),
                          ("W", 1500, 100, 0, 0, tid, val, 1, False, False),
                          ("G", 1200, 1700, tid, "Sequential", 2)]
        rec.close_step(2000, record=True, keep=True)
        rec.pending[:] = [("W", 2100, 50, 0, 0, tid, train, 2, True, False), ("B", 2150, 2180, tid),
                          ("M", 2200, tid, id(module), "Linear", False), ("G", 2300, 2400, tid, "Linear", 2),
                          ("M", 2500, tid, id(module), "Linear", True),
                          ("M", 2600, tid, id(module), "Linear", False), ("M", 2650, tid, id(module), "Linear", True),
                          ("G", 2550, 2700, tid, "Sequential", 2),
                          ("B", 2750, 2800, tid), ("G", 2720, 2900, tid, "Sequential", 2)]
        rec.close_step(3000, record=True, keep=True)
        rec.pending[:] = [("W", 3100, 50, 0, 0, tid, train, 3, True, False), ("G", 3200, 3300, tid, "Sequential", 2),
                          ("B", 3400, 3500, tid), ("G", 3600, 3700, tid, "Sequential", 2), ("B", 3800, 3900, tid)]
        rec.close_step(4000, record=True, keep=True)
        rec.pending[:] = [("G", 4100, 4300, tid, "Sequential", 2)]
        rec.close_step(5000, record=True, keep=True)
        rec.finish(5000, keep=True)
        lists = rec.step_lists(5)
        assert lists["validation_ns"] == [0, 500, 300 + 50, 0, 200]
        marks = [m for m in rec.take_marks(0, 5000) if m[0] == "validation"]
        assert [(m[1], m[2], m[4]) for m in marks] == [
            (1200, 1700, {"module": "Sequential", "batches": 2, "loader": 1, "grad_off": True}),
            (2200, 2500, {"module": "Linear", "batches": 0, "loader": None}),
            (2600, 2650, {"module": "Linear", "batches": 0, "loader": None}),
            (4100, 4300, {"module": "Sequential", "batches": 0, "loader": None, "grad_off": True})]
        assert rec.manifest("optimizer")["validation"]["stretches"] == 4
        assert rec.manifest("optimizer")["validation"]["batches"] == 2
