"""Issue 15: what each fix is worth. Traces built so the step time after each fix is known by construction
(worked out in each test's comments), the replay of the unchanged graph, the report's fields and ranking,
``kinetoscope whatif`` and the diff's predicted-vs-measured table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES, load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze import whatif
from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.report.builder import build_report

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]


def finding(id_: str, **evidence) -> Finding:
    return Finding(id=id_, severity="warning", rank=0, title=id_, evidence=evidence, recommendation="")


def gpu_bound_loader_trace(steps: int = 6) -> TraceBuilder:
    """Each 1000 us step: a 400 us kernel launched at once, a 600 us wait for data (the GPU finishes meanwhile),
    a sync that no longer waits, 380 us of host work."""
    b = TraceBuilder(device_properties=A100)
    for k in range(steps):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.kernel(t + 10, 400, launch_at=t, launch_dur=5)  # ends t + 410
        b.loader(t + 10, 600)  # ends t + 610
        b.runtime("cudaStreamSynchronize", t + 615, 5)  # the kernel ended long before: returns at once
    return b


def test_a_data_wait_hidden_behind_gpu_work_saves_only_what_the_gpu_leaves(tmp_path):
    """Naive: 600 us of wait removed, 400 us per step. By construction the sync must then wait for the
    kernel: 10 (launch to start) + 400 (kernel) + 5 (the sync's return) + 380 (host after the sync) = 795 us."""
    trace = load_built(tmp_path, gpu_bound_loader_trace())
    r = trace.ranks[0]
    assert whatif.replay_entry(r)["error"] == 0.0 and whatif.replay_entry(r)["measured_step_us"] == 1000
    est = whatif.estimate(r, finding("loader_stall"), {"num_workers": 4, "handoff_ms": 0})
    assert est["step_us_after"] == pytest.approx(795, abs=0.01)
    assert est["saving_us_per_step"] == pytest.approx(205, abs=0.01)
    assert est["saving_fraction"] == pytest.approx(0.205, abs=1e-4)
    assert est["method"].startswith("replay") and any("num_workers=4" in a for a in est["assumptions"])
    # a trace that does not record the host's cores: the estimate says what it takes for granted about them
    assert any("host's cores are not recorded" in a and "keeps its recorded speed" in a for a in est["assumptions"])


def test_syncs_removed_leave_the_step_to_the_gpu(tmp_path):
    """900 us steps: an 800 us kernel, the host waits for it every step, then 85 us of host work. Without
    the syncs the host runs ahead and the GPU's 800 us per step is the step; kept every 3rd step, the same
    (the GPU is the bound either way)."""
    b = TraceBuilder(device_properties=A100)
    for k in range(6):
        t = 10_000 + 900 * k
        b.step(k, t, 900)
        b.kernel(t + 10, 800, launch_at=t, launch_dur=5)  # ends t + 810
        b.runtime("cudaStreamSynchronize", t + 10, 805)  # waits, returns at t + 815
    r = load_built(tmp_path, b).ranks[0]
    est = whatif.estimate(r, finding("sync_in_loop"), {"every": 1000})
    assert est["step_us_after"] == pytest.approx(800, abs=0.01)
    assert est["saving_us_per_step"] == pytest.approx(100, abs=0.01)


def test_pageable_copy_made_pinned_and_async(tmp_path):
    """1300 us steps: a 1 MB pageable copy at 1 GB/s (1000 us) holds the host; a 200 us kernel waits for it on
    the stream; a sync waits for the kernel; 80 us of host work. Pinned on an A100 (24 GB/s, no pinned copy
    to measure): the copy takes 41.667 us, its call 10 us. Step after: the call returns at +10, the kernel
    launch moves to +15 and starts after the copy (+2 + 41.667 + 1 us stream gap = +44.667), ends +244.667;
    the sync returns 5 us later (+249.667); 80 us of host work: 329.667 us."""
    b = TraceBuilder(device_properties=A100)
    for k in range(5):
        t = 10_000 + 1300 * k
        b.step(k, t, 1300)
        b.memcpy(t + 2, 1000, host="Pageable", nbytes=1_000_000, call=None)
        b.runtime("cudaMemcpyAsync", t, 1005, b._corr)  # the copy's own call holds the host for it
        b.kernel(t + 1015, 200, launch_at=t + 1010, launch_dur=5)  # ends t + 1215
        b.runtime("cudaStreamSynchronize", t + 1020, 200)  # returns at t + 1220
    r = load_built(tmp_path, b).ranks[0]
    est = whatif.estimate(r, finding("h2d_pageable"))
    assert est["step_us_after"] == pytest.approx(329.667, abs=0.01)
    assert any("24.0 GB/s" in a and "A100" in a for a in est["assumptions"])


def test_a_cpu_run_has_no_sync_to_gain_from(tmp_path):
    """A control: .item() on CPU tensors does not wait for any device: the fix is worth nothing, said so."""
    b = TraceBuilder()
    for k in range(5):
        t = 1000 * k
        b.step(k, t, 1000).op("aten::item", t + 900, 20).op("aten::_local_scalar_dense", t + 905, 10)
    r = load_built(tmp_path, b).ranks[0]
    est = whatif.estimate(r, finding("sync_in_loop"))
    assert est["saving_us_per_step"] == 0 and est["step_us_after"] == 1000 and "saves nothing" in est["assumptions"][0]


def _captured(tmp_path: Path, b: TraceBuilder, dataloader: dict, host: dict | None = None) -> Path:
    """A trace beside a capture manifest (what the capture records about the DataLoader and the host)."""
    out = tmp_path / "run"
    b.write(out / "rank-0.step-1-12.pt.trace.json")
    (out / "rank-0.manifest.json").write_text(json.dumps({"windows": [], "dataloader": dataloader,
                                                          "host": host or {"cpus": 64, "torch_threads": 1}}))
    return out


def waiting_steps(step_us: int, wait_us: int, *, multiprocess: bool = False, steps: int = 12,
                  world_size: int | None = None) -> TraceBuilder:
    """``steps`` steps of ``step_us``, each opening with a ``wait_us`` wait for data; rank 0 of a job of
    ``world_size`` ranks where given."""
    b = TraceBuilder(rank=0, world_size=world_size) if world_size else TraceBuilder()
    for k in range(steps):
        t = step_us * k
        b.step(k + 1, t, step_us).loader(t, wait_us, multiprocess=multiprocess)
    return b


def _step_times(out: Path, *, cpu_ns: int, wait_cpu_ns: int, n: int = 14) -> None:
    """The capture's step timings beside the trace: 40 ms steps with 30 ms waits, and their process CPU time."""
    (out / "rank-0.steps.json").write_text(json.dumps({
        "step_wall_ns": [40_000_000] * n, "data_wait_ns": [30_000_000] * n, "profiled": [False] * n,
        "step_cpu_ns": [cpu_ns] * n, "data_wait_cpu_ns": [wait_cpu_ns] * n}))


def _probe(median_ns: int, p10_ns: int, p90_ns: int, batch_bytes: int = 33_024) -> dict:
    """The capture's measure of a ready batch's hand-over on the host (``dataloader.handover_probe``)."""
    return {"median_ns": median_ns, "p10_ns": p10_ns, "p90_ns": p90_ns, "samples": 20, "batch_bytes": batch_bytes,
            "workers": 1, "why": None}


def _window_times(out: Path, *, wall_ns: int, wait_ns: int, cpu_ns: int, wait_cpu_ns: int,
                  workers_cpu_ns: int | list[int]) -> None:
    """The capture's step timings of a run of 14 steps whose 12 middle ones are the window's (profiled): each step's
    wall, wait, process CPU, the training thread's CPU through the wait and the workers' CPU."""
    n = 14
    (out / "rank-0.steps.json").write_text(json.dumps({
        "step_wall_ns": [wall_ns] * n, "data_wait_ns": [wait_ns] * n, "profiled": [False] + [True] * 12 + [False],
        "step_cpu_ns": [cpu_ns] * n, "data_wait_cpu_ns": [wait_cpu_ns] * n,
        "data_wait_thread_cpu_ns": [wait_cpu_ns] * n,
        "workers_cpu_ns": workers_cpu_ns if isinstance(workers_cpu_ns, list) else [workers_cpu_ns] * n}))


def test_more_workers_for_a_steadily_stalled_loader(tmp_path):
    """2 workers, 20 ms steps: 10 ms waiting for data, 10 ms of compute. A stalled loader delivers one batch
    per step, so each worker takes 2 steps = 40 ms per batch. With 4 workers a batch is ready every 10 ms,
    exactly the compute: the step becomes 10 ms (waits vanish in steady state)."""
    b = waiting_steps(20_000, 10_000, multiprocess=True)
    r = load_trace(_captured(tmp_path, b, {"num_workers": 2, "prefetch_factor": 2})).ranks[0]
    est = whatif.estimate(r, finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(10_000, abs=1)
    assert any("num_workers=2, prefetch_factor=2 before" in a and "mean 40.0 ms" in a for a in est["assumptions"])
    # 3 workers: a batch every 13.33 ms, slower than the compute: the step is the loader's pace
    est3 = whatif.estimate(r, finding("loader_stall"), {"num_workers": 3})
    assert est3["step_us_after"] == pytest.approx(40_000 / 3, abs=1)


@pytest.mark.parametrize("getitem, collate", [("tensor_rows", "default"), ("custom", None),
                                             ("tensor_rows", "custom")])
def test_workers_serving_a_tensor_dataset_are_priced_as_the_batch_indexed_at_once(tmp_path, getitem, collate):
    """Was: workers handing over batches of a dataset already in memory as tensors were only replayed with more of
    them (nothing to gain where the wait is taking each batch over) and said so, information; two readers: drop the
    workers and index the batch in the training process, a warning. 2 workers, 12 steps of 10 ms, each opening with
    a 2.5 ms wait through which the process's CPU is busy 60%; the capture read the dataset as a TensorDataset of 2
    tensors, 2400 bytes, collated by PyTorch's own collate. Indexing the batch at once in the training process removes
    each wait: 7.5 ms steps, an upper bound (the indexing copy is not measured); over the run the waits are 25% of it
    (14 steps timed, one wait each), counted half: a warning. A dataset class of its own holding such tensors does
    per-item work the capture does not know: where its waits are the hand-over (the loop's CPU busy through 60% of
    them), the same advice and the same bound, its per-item work said to be unknown (and its collate, not recorded by
    the capture that made it, read as PyTorch's). A collate_fn of the loader's own (tokenising, padding: per-batch
    work in the workers) is not priced so: the workers' replay."""
    b = waiting_steps(10_000, 2_500, multiprocess=True)
    dl = {"num_workers": 2, "prefetch_factor": 2, "dataset_class": "Rows", "dataset_items": 100,
          "dataset_tensors": 2, "dataset_tensor_bytes": 2400, "dataset_getitem": getitem, "dataset_via": None}
    out = _captured(tmp_path, b, {**dl, "collate": collate} if collate else dl)
    n = 14
    (out / "rank-0.steps.json").write_text(json.dumps({
        "step_wall_ns": [10_000_000] * n, "data_wait_ns": [2_500_000] * n, "profiled": [False] * n,
        "step_cpu_ns": [9_000_000] * n, "data_wait_cpu_ns": [1_500_000] * n}))
    r = load_trace(out).ranks[0]
    est = whatif.estimate(r, finding("loader_stall"), {})
    (f,) = [f for f in build_report(load_trace(out)).findings if f.id == "loader_stall"]
    if collate == "custom":
        assert est["method"] != "replay: the batch indexed at once in the training process"
        assert f.evidence["dataset_in_memory"] is None and "TensorDataset" not in f.recommendation
        return
    assert (est["step_us_after"], est["bound"], est["method"]) == (
        7_500, "upper", "replay: the batch indexed at once in the training process")
    assert (f.evidence["dataset_in_memory"], f.severity, round(f.worth.fraction, 4), f.worth.basis) == (
        getitem, "warning", 0.25, "upper bound")
    if getitem == "tensor_rows":
        assert ("the training loader's 2 workers serve a TensorDataset (2 tensors in memory, 2.3 KiB, read by the "
                "capture)") in est["assumptions"][0]
        assert f.recommendation.startswith("the workers serve a TensorDataset, whose items are rows of tensors "
                                           "already in memory: index the whole batch at once in the training process")
        assert "raise num_workers" not in f.recommendation and "more workers" not in f.recommendation
    else:
        assert ("the training loader's 2 workers serve a dataset (Rows) whose waits are not the workers' own work "
                "(the hand-over of ready batches, or workers mostly idle) (2 tensors in memory, 2.3 KiB; its "
                "collate_fn not recorded, read as PyTorch's, read by the capture)") in est["assumptions"][0]
        assert f.recommendation.startswith(
            "the dataset (Rows) holds its items as tensors in memory: if its __getitem__'s per-item work can be "
            "done on a whole batch at once")


@pytest.mark.parametrize("probe_ms, kind", [(1.17, "handover"), (0.5, "idle_workers"), (None, "idle_workers")])
def test_waits_as_long_as_the_probed_hand_over_are_the_hand_over(tmp_path, probe_ms, kind):
    """Was: a loop idle through 54% of its 1.2 ms waits for 2 workers whose CPU was a small share of their time read
    as workers waiting themselves ("find which before raising num_workers", the replay an upper bound), where the
    capture had measured a ready batch's hand-over on the host at 1.17 ms: the batches were ready, the wait was
    taking them over (round trips with the worker included). 12 steps of 10 ms, each opening with a 1.2 ms wait, the
    training thread's CPU busy 0.552 ms of it (46%), the workers' CPU 1 ms a step (5% of the 20 ms a batch takes each
    of them). With a probe of 1.17 ms (1.2 <= 1.25 x 1.17): the hand-over; with one of 0.5 ms, or none: idle workers."""
    b = waiting_steps(10_000, 1_200, multiprocess=True)
    dl = {"num_workers": 2, "prefetch_factor": 2}
    if probe_ms is not None:
        ns = int(probe_ms * 1e6)
        dl["handover_probe"] = {"median_ns": ns, "p10_ns": ns, "p90_ns": ns, "samples": 20, "batch_bytes": 4096,
                                "workers": 1, "why": None}
    out = _captured(tmp_path, b, dl, host={"cpus": 2, "torch_threads": 1})
    n = 14
    (out / "rank-0.steps.json").write_text(json.dumps({
        "step_wall_ns": [10_000_000] * n, "data_wait_ns": [1_200_000] * n, "profiled": [False] * n,
        "step_cpu_ns": [9_000_000] * n, "data_wait_cpu_ns": [552_000] * n, "data_wait_thread_cpu_ns": [552_000] * n,
        "workers_cpu_ns": [1_000_000] * n}))
    (f,) = [f for f in build_report(load_trace(out)).findings if f.id == "loader_stall"]
    assert f.evidence["wait_kind"] == kind
    # the analyzer's own advice (a fix worth under 3% gives way to the advice for that case in the report)
    assert ("its waits, median 1.20 ms, are what the capture measured a ready batch's hand-over to cost on this host, "
            "1.17 ms" in f.extra["advice"]) == (kind == "handover")


def test_stalls_between_waits_as_long_as_the_probe_are_not_the_hand_over(tmp_path):
    """A median that matches the probe is not enough: 12 steps of 40 ms opening with waits of 1.2, 1.2 and 30 ms in
    turn (10.8 ms a step, 10 of it the stalls), the probe 1.17 ms, the loop's CPU busy 20% of its waits and the workers'
    CPU 1 ms a step: a third of the waits are stalls longer than twice the probe and half a millisecond, so the workers
    do not keep up - idle workers, not the hand-over."""
    b = TraceBuilder()
    waits = [1_200, 1_200, 30_000] * 4
    for k, w in enumerate(waits):
        b.step(k + 1, 40_000 * k, 40_000).loader(40_000 * k, w, multiprocess=True)
    probe = {"median_ns": 1_170_000, "p10_ns": 1_100_000, "p90_ns": 1_300_000, "samples": 20, "batch_bytes": 4096,
             "workers": 1, "why": None}
    out = _captured(tmp_path, b, {"num_workers": 2, "prefetch_factor": 2, "handover_probe": probe},
                    host={"cpus": 2, "torch_threads": 1})
    n = 14
    (out / "rank-0.steps.json").write_text(json.dumps({
        "step_wall_ns": [40_000_000] * n, "data_wait_ns": [10_800_000] * n, "profiled": [False] * n,
        "step_cpu_ns": [30_000_000] * n, "data_wait_cpu_ns": [2_160_000] * n,
        "data_wait_thread_cpu_ns": [2_160_000] * n, "workers_cpu_ns": [1_000_000] * n}))
    (f,) = [f for f in build_report(load_trace(out)).findings if f.id == "loader_stall"]
    assert f.evidence["wait_kind"] == "idle_workers"
    assert "what the capture measured a ready batch's hand-over to cost" not in f.extra["advice"]


def test_the_hand_over_the_loop_works_through_stays_with_more_workers(tmp_path):
    """Was: a loop whose waits were alike (2 ms a step) and whose CPU was busy 65% of them was told "the workers keep
    up: more workers will not help", yet the replay with twice the workers removed the whole wait (alike waits read
    as no ready batch, a hand-over of 0): a warning at 5% of the run (two readers: under 3%, info). 2 workers, 12
    steps of 10 ms, each opening with a 2.5 ms wait through which the process's CPU is busy 60%: taking a batch over
    costs 1.5 ms, and stays. With 64 workers batches are always ready: the step is its 7.5 ms of compute plus 1.5 ms."""
    b = waiting_steps(10_000, 2_500, multiprocess=True)
    out = _captured(tmp_path, b, {"num_workers": 2, "prefetch_factor": 2})
    n = 14
    (out / "rank-0.steps.json").write_text(json.dumps({
        "step_wall_ns": [10_000_000] * n, "data_wait_ns": [2_500_000] * n, "profiled": [False] * n,
        "step_cpu_ns": [9_000_000] * n, "data_wait_cpu_ns": [1_500_000] * n}))
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 64})
    assert est["step_us_after"] == pytest.approx(9_000, abs=1)
    assert any("taking a batch over costs the loop 1.50 ms: the process's CPU (all its threads) is busy 60% of its "
               "waits" in a for a in est["assumptions"])
    # a hand-over given by hand is the one used, and the only one said
    given = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 64, "handoff_ms": 0.2})
    assert given["step_us_after"] == pytest.approx(7_700, abs=1)
    assert not any("taking a batch over costs the loop 1.50" in a for a in given["assumptions"])


def test_workers_whose_hand_over_the_capture_measured_keep_it_idle_parts_included(tmp_path):
    """Was: where waits were alike and the loop's CPU busy 60% of them, the hand-over was that CPU alone (1.5 ms of
    a 2.5 ms wait) and the idle rest was read as workers falling behind, which more workers remove (a compiled job
    with 2 workers 28% busy was told 4 workers were worth 4% of its run; rerun, they gained nothing). Where the
    capture measured a worker's hand-over on the host (2.2 ms, round trips with the worker included), that is the
    hand-over, and a wait within its spread (under twice it and half a millisecond) took a ready batch, which more
    workers cannot make readier: with 64 workers each step stays 10 ms (was 9.7 ms: each wait credited down to the
    probe's median). A probe slower than the loop's own waits (3 ms) is bounded by them (their median): 2.5 ms a
    batch stays, the step is 10 ms. A probe quicker than the loop's CPU through its waits gives way to it."""
    b = waiting_steps(10_000, 2_500, multiprocess=True)
    probe = {"median_ns": 2_200_000, "p10_ns": 2_000_000, "p90_ns": 2_600_000, "samples": 20, "batch_bytes": 4096,
             "workers": 1, "why": None}
    n = 14
    timings = json.dumps({
        "step_wall_ns": [10_000_000] * n, "data_wait_ns": [2_500_000] * n, "profiled": [False] * n,
        "step_cpu_ns": [9_000_000] * n, "data_wait_cpu_ns": [1_500_000] * n})

    def with_probe(folder: Path, measured: dict) -> dict:
        """The estimate with 64 workers for this run, where the capture's probe measured ``measured``."""
        out = _captured(folder, b, {"num_workers": 2, "prefetch_factor": 2, "handover_probe": measured})
        (out / "rank-0.steps.json").write_text(timings)
        return whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 64})

    est = with_probe(tmp_path, probe)
    assert est["step_us_after"] == pytest.approx(10_000, abs=1)
    assert ("a batch from a worker costs the loop 2.20 ms to take: measured by the capture on this host, one worker "
            "handing over 20 batches shaped like the loop's (median 2.20 ms, 2.00-2.60 ms from the 10th to the 90th "
            "percentile)") in est["assumptions"]
    assert not any("is busy 60% of its waits" in a for a in est["assumptions"])

    est = with_probe(tmp_path / "slow", {**probe, "median_ns": 3_000_000, "p10_ns": 2_800_000, "p90_ns": 3_400_000})
    assert est["step_us_after"] == pytest.approx(10_000, abs=1)
    assert any(a.startswith("a batch from a worker costs the loop 2.50 ms to take") and
               a.endswith("(median 3.00 ms, 2.80-3.40 ms from the 10th to the 90th percentile; the loop's median "
                          "wait, 2.50 ms, bounds it here)") for a in est["assumptions"])

    # a probe that measures less than the loop's own CPU through its waits (1.5 ms: the probe's batches hold tensors
    # only and are never pinned) gives way to it: 7.5 + 1.5 = 9 ms, and both are said
    est = with_probe(tmp_path / "quick", {**probe, "median_ns": 500_000, "p10_ns": 400_000, "p90_ns": 700_000})
    assert est["step_us_after"] == pytest.approx(9_000, abs=1)
    assert any(a.startswith("taking a batch over costs the loop 1.50 ms") and
               a.endswith("(the capture's probe of a worker's hand-over measured less, 0.50 ms: its batches hold "
                          "tensors only and are never pinned)") for a in est["assumptions"])


def test_a_ready_batch_measures_the_hand_over_whatever_the_cpu_says(tmp_path):
    """Short waits (0.3 ms: batches that were ready) measure taking a batch over; the process's CPU share through
    the waits (60%, all threads) does not replace that. 2 workers, 12 steps of 10 ms: a 9 ms stall every 4th step,
    0.3 ms waits between. With 64 workers every batch is ready: each step is its compute plus the 0.3 ms hand-over
    (the median of the short waits), 10 - 0.3 + 0.3 = 10 ms for the short steps and 10 - 9 + 0.3 = 1.3 ms for the
    stalled ones: (9 x 10 + 3 x 1.3) / 12 = 7.825 ms."""
    b = TraceBuilder()
    for k in range(12):
        wait = 9_000 if k % 4 == 3 else 300
        b.step(k + 1, 10_000 * k, 10_000).loader(10_000 * k, wait, multiprocess=True)
    out = _captured(tmp_path, b, {"num_workers": 2, "prefetch_factor": 2})
    n = 14
    (out / "rank-0.steps.json").write_text(json.dumps({
        "step_wall_ns": [10_000_000] * n, "data_wait_ns": [2_475_000] * n, "profiled": [False] * n,
        "step_cpu_ns": [9_000_000] * n, "data_wait_cpu_ns": [1_485_000] * n}))
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 64})
    assert est["step_us_after"] == pytest.approx(7_825, abs=1)
    assert not any("taking a batch over costs the loop" in a for a in est["assumptions"])


def test_num_workers_zero_each_wait_is_a_batch(tmp_path):
    """num_workers=0: each 30 ms wait is one batch loaded inline; compute 10 ms; taking a batch from a worker
    costs the loop 1 ms (the hand-over a trace without workers cannot show). Two workers give a batch every
    15 ms, slower than 10 + 1 ms: the step is 15 ms; four workers: 7.5 ms per batch, the step is 11 ms."""
    b = waiting_steps(40_000, 30_000)
    out = _captured(tmp_path, b, {"num_workers": 0}, {"cpus": 2, "torch_threads": 1})
    r = load_trace(out).ranks[0]
    two = whatif.estimate(r, finding("loader_stall"), {"num_workers": 2})
    assert two["step_us_after"] == pytest.approx(15_000, abs=1)
    est = whatif.estimate(r, finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(11_000, abs=1)
    assert any("1.0 ms to take" in a for a in est["assumptions"])


def test_loading_that_computes_competes_for_the_cpus(tmp_path):
    """num_workers=0 on 2 CPUs; each 30 ms wait burns a full core (CPU-heavy decode) and the 10 ms of compute
    uses both cores (capture's process CPU time per step). Four workers: the queue alone would give 11 ms,
    but 30 ms of decode + 20 ms of compute + 1 ms of taking the batch over, per step on 2 CPUs, needs 25.5 ms:
    the step is 25.5 ms. The CPUs' worth together not measured: taken as their count, and said so."""
    b = waiting_steps(40_000, 30_000)
    out = _captured(tmp_path, b, {"num_workers": 0}, {"cpus": 2, "torch_threads": 2})
    _step_times(out, cpu_ns=30_000_000 + 20_000_000, wait_cpu_ns=30_000_000)
    r = load_trace(out).ranks[0]
    est = whatif.estimate(r, finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(25_500, abs=1)
    assert any("2 CPUs shared: loading uses 1.00 cores" in a and "training 2.00" in a and "not measured" in a
               for a in est["assumptions"])


@pytest.mark.parametrize("ranks_on_host, step_us, said", [
    (2, 25_500, "2 ranks share the host's CPUs"),
    (None, 12_750, "how many ranks share this host is not recorded"),
    (1, 12_750, None)])
def test_ranks_on_one_host_share_its_cpus(tmp_path, ranks_on_host, step_us, said):
    """Rank 0 of a 2-rank job on a 4-CPU host, the run above: 30 ms of decode on one core and 10 ms of compute on
    two per step, 1 ms to take a batch over. Where the launcher said both ranks run here, this rank's share is 2
    CPUs: (20 + 30 + 1) / 2 = 25.5 ms a step with four workers. Where no launcher said, or it said one rank per
    host, the rank counts all 4: (20 + 30 + 1) / 4 = 12.75 ms, above the queue's 11 ms (and the estimate says
    when the count was not recorded)."""
    b = waiting_steps(40_000, 30_000, world_size=2)
    out = _captured(tmp_path, b, {"num_workers": 0},
                    {"cpus": 4, "torch_threads": 2, "ranks_on_host": ranks_on_host})
    _step_times(out, cpu_ns=30_000_000 + 20_000_000, wait_cpu_ns=30_000_000)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(step_us, abs=1)
    told = [a for a in est["assumptions"] if "4 CPUs shared" in a]
    assert len(told) == 1 and (said in told[0] if said else "ranks" not in told[0])


@pytest.mark.parametrize("ranks_on_host, cpus, cpus_on_host, step_us, workers, said", [
    (1, 4, 4, 15_000, 2, "num_workers=2 after (4 CPUs, 2 for training)"),
    (2, 4, 4, 25_500, 4, "num_workers=4 after (enough to hide loading; 4 CPUs shared by 2 ranks, 2 for training: "
                         "the workers share the training's, which the CPU floor counts)"),
    (2, 2, 4, 25_500, 4, "this rank may run on 2 of the host's 4 CPUs (pinned by its launcher)")])
def test_the_workers_a_rank_can_have_are_its_share_of_the_cpus(tmp_path, ranks_on_host, cpus, cpus_on_host, step_us,
                                                              workers, said):
    """The same run with no worker count asked for: 4 workers would hide the 30 ms loads behind 10 ms of compute
    (30 / 10 + 1). Alone on 4 CPUs with 2 training threads, 2 are free: 2 workers, a batch every 15 ms, above the
    CPU floor ((20 + 30 + 1) / 4 = 12.75 ms): 15 ms. Two ranks on those 4 CPUs: this rank's 2 are the training's, so
    the workers share them: the 4 the queue needs, held to the floor over 2 CPUs, 25.5 ms, and said. A rank its
    launcher pinned to 2 of the host's 4 CPUs counts those 2 as its own (not halved again): 25.5 ms."""
    b = waiting_steps(40_000, 30_000, world_size=2)
    out = _captured(tmp_path, b, {"num_workers": 0}, {"cpus": cpus, "cpus_on_host": cpus_on_host,
                                                      "torch_threads": 2, "ranks_on_host": ranks_on_host})
    _step_times(out, cpu_ns=30_000_000 + 20_000_000, wait_cpu_ns=30_000_000)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"))
    assert est["step_us_after"] == pytest.approx(step_us, abs=1)
    assert any(a.startswith(f"num_workers={workers} after") for a in est["assumptions"])
    assert any(said in a for a in est["assumptions"])


def test_cpus_that_do_less_together_make_the_cpu_floor_higher(tmp_path):
    """The same run, where the capture measured the 2 CPUs doing 1.6 cores' work when both are busy (two vCPUs
    sharing a physical core). The training's 10 ms on 2 CPUs already ran at that rate: 16 ms of work, not 20; the
    decode's 30 ms ran alone on one; with the 1 ms hand-over, 47 ms of work per step at 1.6 cores: 29.375 ms."""
    b = waiting_steps(40_000, 30_000)
    out = _captured(tmp_path, b, {"num_workers": 0}, {"cpus": 2, "cores_effective": 1.6, "torch_threads": 2})
    _step_times(out, cpu_ns=30_000_000 + 20_000_000, wait_cpu_ns=30_000_000)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(29_375, abs=1)
    assert any("they do 1.60 cores' work (measured by the capture)" in a for a in est["assumptions"])


def test_a_hand_over_the_capture_measured_replaces_the_typical_one(tmp_path):
    """The same run, where the capture measured a batch shaped like the loop's taking 0.3 ms from a worker: 16 ms
    of training, 30 ms of decode and 0.3 ms of hand-over per step at 1.6 cores: 28.9375 ms (29.375 ms with the
    typical 1 ms). A probe that could not measure leaves the typical 1 ms, and says why."""
    b = waiting_steps(40_000, 30_000)
    probe = {"median_ns": 300_000, "p10_ns": 250_000, "p90_ns": 420_000, "samples": 20, "batch_bytes": 1024,
             "workers": 1, "why": None}
    out = _captured(tmp_path, b, {"num_workers": 0, "handover_probe": probe},
                    {"cpus": 2, "cores_effective": 1.6, "torch_threads": 2})
    _step_times(out, cpu_ns=30_000_000 + 20_000_000, wait_cpu_ns=30_000_000)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(28_937.5, abs=1)
    assert ("a batch from a worker costs the loop 0.30 ms to take: measured by the capture on this host, one worker "
            "handing over 20 batches shaped like the loop's (median 0.30 ms, 0.25-0.42 ms from the 10th to the 90th "
            "percentile)") in est["assumptions"]

    unmeasured = {**probe, "median_ns": None, "p10_ns": None, "p90_ns": None, "samples": 0,
                  "why": "the batch is 1024 MiB, over the probe's 512 MiB"}
    out = _captured(tmp_path / "b", b, {"num_workers": 0, "handover_probe": unmeasured},
                    {"cpus": 2, "cores_effective": 1.6, "torch_threads": 2})
    _step_times(out, cpu_ns=30_000_000 + 20_000_000, wait_cpu_ns=30_000_000)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(29_375, abs=1)
    assert any(a.endswith("the capture did not measure it (the batch is 1024 MiB, over the probe's 512 MiB))")
               for a in est["assumptions"])


@pytest.mark.parametrize("measured, why", [(True, "not measured"), ("1.6", "not measured"), (0.5, "was ignored"),
                                           (2.5, "was ignored")])
def test_a_cores_measure_that_cannot_be_right_is_not_used(tmp_path, measured, why):
    """A bool, a string, fewer than one core's work or more than the CPU count: the floor over the 2 CPUs,
    (20 + 30 + 1) / 2 = 25.5 ms, as without the measure, and the estimate says why."""
    b = waiting_steps(40_000, 30_000)
    out = _captured(tmp_path, b, {"num_workers": 0}, {"cpus": 2, "cores_effective": measured, "torch_threads": 2})
    _step_times(out, cpu_ns=30_000_000 + 20_000_000, wait_cpu_ns=30_000_000)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(25_500, abs=1)
    assert any("2 CPUs shared" in a and why in a for a in est["assumptions"])


def test_workers_cpu_per_step_is_their_mean(tmp_path):
    """2 workers on 2 CPUs, 20 ms steps: 10 ms waits, 10 ms of compute on one core (11 ms of process CPU, 1 ms of
    it while waiting). The workers' CPU per step alternates 12, 12, 24 ms (batches land unevenly): 16 ms a step
    on average (the median would say 12, and 11 ms). With 4 workers the queue alone gives 10 ms, but 10 + 16 ms
    of CPU per step on 2 CPUs needs 13 ms: the step is 13 ms."""
    b = waiting_steps(20_000, 10_000, multiprocess=True)
    out = _captured(tmp_path, b, {"num_workers": 2, "prefetch_factor": 2}, {"cpus": 2, "torch_threads": 1})
    n = 13  # the first step (the workers' start-up) is left out
    (out / "rank-0.steps.json").write_text(json.dumps({
        "step_wall_ns": [20_000_000] * n, "data_wait_ns": [10_000_000] * n, "profiled": [False] * n,
        "step_cpu_ns": [11_000_000] * n, "data_wait_cpu_ns": [1_000_000] * n,
        "workers_cpu_ns": [500_000_000] + [12_000_000, 12_000_000, 24_000_000] * 4}))
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(13_000, abs=1)
    assert any("the workers use 16.0 ms of CPU per batch" in a for a in est["assumptions"])


def test_waits_within_the_probed_hand_overs_spread_are_ready_batches(tmp_path):
    """Was: 2 persistent workers whose every wait (0.95 ms) sat inside the spread of the hand-over the capture probed
    on the host (median 0.70 ms, 0.65-1.00 ms) were told "the workers keep up: more workers will not help" beside "fix
    this with num_workers=4: 4.3% of the run", a warning (the replay credited each wait down to the probe's median;
    two readers and their consensus: the hand-over, information). 12 steps of 4 ms, each opening with a 0.95 ms wait
    through which the training thread's CPU is busy 0.60 ms: every batch was ready, so 4 workers give the same 4 ms
    step, and the finding is information, worth nothing over the run."""
    b = waiting_steps(4_000, 950, multiprocess=True)
    out = _captured(tmp_path, b, {"num_workers": 2, "prefetch_factor": 2,
                                  "handover_probe": _probe(700_000, 650_000, 1_000_000)},
                    {"cpus": 2, "torch_threads": 1})
    _window_times(out, wall_ns=4_000_000, wait_ns=950_000, cpu_ns=3_800_000, wait_cpu_ns=600_000,
                  workers_cpu_ns=1_400_000)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == 4_000 and est["saving_us_per_step"] == 0
    (f,) = [f for f in build_report(load_trace(out)).findings if f.id == "loader_stall"]
    assert (f.evidence["wait_kind"], f.severity, f.worth.fraction) == ("handover", "info", 0.0)


@pytest.mark.parametrize("stall_step, stall_workers_cpu_ns, step_us_after", [
    (11, 0, 10_000), (11, 8_000_000, 9_750), (7, 0, 9_750)])
def test_a_stall_in_a_step_the_workers_slept_through_took_a_ready_batch(tmp_path, stall_step, stall_workers_cpu_ns,
                                                                          step_us_after):
    """Was: a 3.5 ms wait at the end of an epoch, for its last batch, in a step through which the one worker burned no
    CPU (it had made every batch of the epoch), was read as the worker falling behind and 2 workers were worth 7% of
    the run (the consensus: the worker kept up, information). 2 workers (prefetch 2) busy 40% of the time a batch
    takes them; 12 steps of 10 ms, each opening with a 1 ms wait (ready batches: the hand-over) but one, 4 ms; the
    capture's marks number the batches 0 to 11 and the next() after the window ends the iterator at 12. Step 11's
    batch (index 10) is one of its last 4 (2 x 2: every index was with a worker by then): where the workers burned no
    CPU through that step, they had nothing left to make, the batch was ready, and 64 workers change nothing: 10 ms.
    Where they worked through it (8 ms), it was late: with 64 workers it is ready, the wait the 1 ms hand-over, (11 x
    10 + 7) / 12 = 9.75 ms. Step 7's batch (index 6) had 5 more to come: workers idle through it were waiting for
    something (storage), not done - late, 9.75 ms (was: any wait in an idle step read as ready, 25 ms ones too)."""
    b = TraceBuilder()
    for k in range(12):
        wait = 4_000 if k + 1 == stall_step else 1_000
        b.step(k + 1, 10_000 * k, 10_000).loader(10_000 * k, wait, multiprocess=True)
        b.op("kinetoscope::data_wait", 10_000 * k, wait, cat="kinetoscope", loader=0, role="train", batch=k)
    b.op("kinetoscope::data_wait", 120_000, 50, cat="kinetoscope", loader=0, role="train", batch=12, exhausted=True)
    out = _captured(tmp_path, b, {"num_workers": 2, "prefetch_factor": 2}, {"cpus": 64, "torch_threads": 1})
    manifest = json.loads((out / "rank-0.manifest.json").read_text())
    manifest["loop"] = {"marks": 3, "recorded": ["data_wait", "workers"],
                        "loaders": [{"loader": 0, "role": "train", "num_workers": 2}]}
    (out / "rank-0.manifest.json").write_text(json.dumps(manifest))
    workers = [8_000_000] * 14
    workers[stall_step] = stall_workers_cpu_ns
    _window_times(out, wall_ns=10_000_000, wait_ns=1_250_000, cpu_ns=9_000_000, wait_cpu_ns=200_000,
                  workers_cpu_ns=workers)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 64})
    assert est["step_us_after"] == pytest.approx(step_us_after, abs=1)


def test_waits_the_loop_sat_idle_through_beyond_the_probes_spread_are_stalls(tmp_path):
    """A wait is the probed hand-over's only within its spread: 2 workers, 12 steps of 2 ms, each opening with a
    1.0 ms wait the training thread is on a CPU for 0.1 ms of; the probe measured 0.30 ms (0.28-0.35 ms). 1.0 ms is
    2.9 times the probe's 90th percentile, and the loop sat idle through 90% of it: the workers were late (was: ready,
    under twice the median and half a millisecond, and worth nothing). With 4 workers each wait is the 0.30 ms
    hand-over: 2.0 - 1.0 + 0.3 = 1.3 ms a step; over the run the waits are half of it, and the fix removes 70% of
    them: 35%, critical."""
    b = waiting_steps(2_000, 1_000, multiprocess=True)
    out = _captured(tmp_path, b, {"num_workers": 2, "prefetch_factor": 2,
                                  "handover_probe": _probe(300_000, 280_000, 350_000)},
                    {"cpus": 64, "torch_threads": 1})
    _window_times(out, wall_ns=2_000_000, wait_ns=1_000_000, cpu_ns=1_100_000, wait_cpu_ns=100_000,
                  workers_cpu_ns=1_500_000)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})
    assert est["step_us_after"] == pytest.approx(1_300, abs=1)
    (f,) = [f for f in build_report(load_trace(out)).findings if f.id == "loader_stall"]
    assert (f.severity, f.worth.fraction) == ("critical", 0.35)


def test_a_wait_the_loop_worked_through_took_a_ready_batch(tmp_path):
    """Was: waits the training thread worked through two thirds of (taking each batch over from 3 workers) were told
    "the workers keep up: more workers will not help" beside "fix this with num_workers=6: 3.7% of the run" (a
    warning; the fifty-seventh set's consensus: information): the replay credited the idle third of each wait. A
    batch the loop takes over through half its wait or more was ready, whatever the probe says (its batches hold
    tensors alone): 2 workers, 12 steps of 10 ms opening with 1.6 ms waits the training thread is on a CPU for 1.2 ms
    of (75%), the probe 0.9 ms (0.86-1.07 ms). 4 workers change nothing: 10 ms (was 9.3 ms, each wait credited down
    to the probe's median); with 0.6 ms of the thread's CPU in each wait (37.5%) they were late: 9.3 ms."""
    def estimate(folder: Path, thread_cpu_ns: int) -> dict:
        b = waiting_steps(10_000, 1_600, multiprocess=True)
        out = _captured(folder, b, {"num_workers": 2, "prefetch_factor": 2,
                                    "handover_probe": _probe(900_000, 860_000, 1_070_000, 1 << 20)},
                        {"cpus": 64, "torch_threads": 1})
        _window_times(out, wall_ns=10_000_000, wait_ns=1_600_000, cpu_ns=9_800_000, wait_cpu_ns=thread_cpu_ns,
                      workers_cpu_ns=7_500_000)
        return whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 4})

    assert estimate(tmp_path / "taking", 1_200_000)["step_us_after"] == pytest.approx(10_000, abs=1)
    assert estimate(tmp_path / "idle", 600_000)["step_us_after"] == pytest.approx(9_300, abs=1)


def test_one_long_stall_among_hand_overs_is_not_the_workers_keeping_up(tmp_path):
    """Was: without the capture's CPU times or a probe, eleven 0.2 ms waits and one 30 ms wait read as "the workers
    keep up (the waits are alike and short, batches were ready): more workers will not help" - 11 of 12 waits short,
    though the stall held 30 of the 32.2 ms waited - beside a replay with more workers worth a fifth of the run. The
    waits alone tell the hand-over by the time in stalls, not their count: 93% here, so which it is cannot be told
    without the capture's CPU times, and the advice says so."""
    b = TraceBuilder()
    t = 0
    for k in range(12):
        wait = 30_000 if k + 1 == 6 else 200
        b.step(k + 1, t, 9_800 + wait).loader(t, wait, multiprocess=True)
        t += 9_800 + wait
    out = _captured(tmp_path, b, {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True})
    (f,) = [f for f in build_report(load_trace(out)).findings if f.id == "loader_stall"]
    assert f.evidence["wait_kind"] == "unknown"
    assert "more workers will not help" not in f.recommendation
    assert "cannot be told without the capture's CPU times" in f.recommendation


@pytest.mark.parametrize("whose, step_us_after", [(1, 11_666.667), (0, 10_000)])
def test_only_the_training_loaders_worker_start_makes_its_batches_new(tmp_path, whose, step_us_after):
    """Was: any loader's workers starting (a validation loader's, loader 1) made the training loader's next batches
    untimed, so its measured 30 ms stall was replaced by a guess that two workers hide. 1 persistent worker, prefetch
    2, 12 steps of 9.8 ms of compute after a 0.2 ms wait (the hand-over), but step 6's 30 ms wait. Loader 1's start
    leaves the stall timed: batch 5's worker was free once batch 4 was ready (asked for, 10 ms before batch 5 was),
    so it loaded in 10 + 29.8 = 39.8 ms. With 2 workers (prefetch 1) it starts once batch 3 is taken, 19.8 ms before
    the loop asks for it: it waits 20 ms + 0.2 ms instead of 30 ms, 9.8 ms saved of the 149.8 ms window, (149.8 -
    9.8) / 12 = 11.67 ms a step. The training loader's own start in step 5 leaves batch 5 with no earlier batch of its
    worker to time it from: it loads at the one worker's pace, the window's batches apart, (140.0 - 0.2) / 11 = 12.7
    ms, which the second worker hides: every wait the 0.2 ms hand-over, (149.8 - 29.8) / 12 = 10 ms a step."""
    b = TraceBuilder()
    t = 0
    for k in range(12):
        wait = 30_000 if k + 1 == 6 else 200
        dur = 9_800 + wait
        b.step(k + 1, t, dur).loader(t, wait, multiprocess=True)
        if k + 1 == 5:
            b.op("kinetoscope::workers_start", t + 3_000, 1_000, cat="kinetoscope", loader=whose, workers=1,
                 restart=whose == 0)
        t += dur
    out = _captured(tmp_path, b, {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True})
    manifest = json.loads((out / "rank-0.manifest.json").read_text())
    manifest["loop"] = {"marks": 3, "recorded": ["data_wait", "workers"],
                        "loaders": [{"loader": 0, "role": "train", "num_workers": 1},
                                    {"loader": 1, "role": "eval", "num_workers": 1}]}
    (out / "rank-0.manifest.json").write_text(json.dumps(manifest))
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"), {"num_workers": 2, "prefetch_factor": 1})
    assert est["step_us_after"] == pytest.approx(step_us_after, abs=1)


def test_worker_respawn_wait_becomes_a_typical_one(tmp_path):
    """Six 10 ms steps with 1 ms waits, one with a 61 ms start-up wait: the fix gives back 60 ms over 6 steps."""
    b = TraceBuilder()
    t = 0
    for k in range(6):
        wait = 61_000 if k == 2 else 1_000
        b.step(k, t, wait + 9_000).loader(t, wait, multiprocess=True)
        t += wait + 9_000
    r = load_built(tmp_path, b).ranks[0]
    est = whatif.estimate(r, finding("worker_respawn"))
    assert est["saving_us_per_step"] == pytest.approx(10_000, abs=0.01)
    assert est["step_us_after"] == pytest.approx(10_000, abs=0.01)


def test_fixes_together_do_not_simply_add(tmp_path):
    """The GPU-bound loader trace plus syncs that wait: fixing the loader alone gives 795 us (above); removing
    the sync alone saves nothing (it never waited long); together the GPU's 400 us per step still bounds."""
    r = load_built(tmp_path, gpu_bound_loader_trace()).ranks[0]
    together = whatif.combined(r, [finding("loader_stall"), finding("sync_in_loop")],
                               {"loader_stall": {"num_workers": 4, "handoff_ms": 0}, "sync_in_loop": {"every": 1000}})
    # without the wait and the sync the host step is 10 + 5 + 380 = 395 us; the GPU needs 400 us per step
    assert together["step_us_after"] == pytest.approx(400, abs=0.01)


def test_memory_growth_is_worth_no_time_but_says_when_it_runs_out(tmp_path):
    r = load_built(tmp_path, gpu_bound_loader_trace()).ranks[0]
    est = whatif.estimate(r, finding("memory_growth", steps_to_out_of_memory=1234))
    assert est["saving_us_per_step"] == 0 and est["method"] == "none" and est["steps_to_out_of_memory"] == 1234


def test_report_carries_estimates_ranked_by_saving_and_the_replay(tmp_path):
    rep = build_report(load_trace(SAMPLES / "real" / "v100_resnet50_2021.json.gz"))
    r = rep.ranks[0]
    assert r["replay"]["error"] == 0.0 and r["replay"]["measured_step_us"] == pytest.approx(174829.333, abs=0.01)
    doc = rep.to_dict()
    loader = next(f for f in doc["findings"] if f["id"] == "loader_stall")
    assert set(loader["estimate"]) >= {"step_us_after", "saving_us_per_step", "saving_fraction", "method",
                                       "assumptions"}
    # within one severity, the larger saving first
    warnings = [f for f in rep.findings if f.severity == "warning"]
    savings = [(f.estimate or {}).get("saving_us_per_step", -1) for f in warnings]
    assert savings == sorted(savings, reverse=True)


@pytest.mark.parametrize("path", sorted(p for p in (SAMPLES / "real").rglob("*.json*")) +
                         sorted((SAMPLES / "cpu").glob("*/*.pt.trace.json.gz")) +
                         sorted((SAMPLES / "pairs").glob("*.json.gz")),
                         ids=lambda p: p.name[:40])
def test_the_unchanged_replay_reproduces_every_sample(path):
    trace = load_trace(path)
    for r in trace.ranks:
        entry = whatif.replay_entry(r)
        if entry is not None:
            assert entry["error"] <= 0.03, (r.rank, entry)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinetoscope.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_whatif_command(tmp_path):
    sample = str(SAMPLES / "real" / "v100_resnet50_2021.json.gz")
    proc = run_cli("whatif", sample, "--fix", "loader_stall,h2d_pageable", "--set", "loader_stall.num_workers=4",
                   "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (rank,) = doc["ranks"]
    assert [f["id"] for f in rank["fixes"]] == ["loader_stall", "h2d_pageable"]
    alone = min(f["estimate"]["step_us_after"] for f in rank["fixes"])
    assert rank["together"]["step_us_after"] <= alone
    text = run_cli("whatif", sample, "--fix", "loader_stall")
    assert text.returncode == 0
    assert "fix this with num_workers=" in text.stdout and "together (loader_stall)" in text.stdout
    bad = run_cli("whatif", sample, "--fix", "no_such_thing")
    assert bad.returncode == 2 and "unknown finding id" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli("whatif", sample, "--fix", "loader_stall", "--set", "loader_stall.num_workers=many")
    assert bad.returncode == 2 and "not a number" in bad.stderr


@pytest.mark.slow
def test_diff_puts_the_prediction_beside_the_measurement():
    """The public V100 pair (num_workers 0 -> 4): the loader stall is gone; the measured mean step after is
    the after trace's 139.692 ms, the prediction the before trace's estimate."""
    before = SAMPLES / "real" / "v100_resnet50_2021.json.gz"
    after = SAMPLES / "pairs" / "v100_resnet50_num_workers_4.json.gz"
    proc = run_cli("diff", str(before), str(after), "--format", "json")
    doc = json.loads(proc.stdout)
    (row,) = [x for x in doc["fixes"] if x["id"] == "loader_stall"]
    estimate = next(f for f in build_report(load_trace(before)).findings if f.id == "loader_stall").estimate
    assert row["measured_step_us"] == pytest.approx(139692.0, abs=0.01)
    assert row["predicted_step_us"] == estimate["step_us_after"]
    assert row["error"] == pytest.approx(estimate["step_us_after"] / 139692.0 - 1)
    text = run_cli("diff", str(before), str(after)).stdout
    assert "Findings gone: the step time their fix was predicted to give" in text and "measured 139.69 ms" in text


def _capture_train(out: Path, *knobs: str) -> dict:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "kinetoscope.cli", "capture", "--out", str(out), "--no-telemetry",
                           "--", sys.executable, str(root / "benchmarks" / "whatif_train.py"), "--steps", "12", *knobs],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "rank-0.steps.json").read_text())


@pytest.mark.slow
@pytest.mark.torch
def test_capture_records_what_the_whatif_needs(tmp_path):
    """Process CPU time per step and during the data wait tell loading that computes (a decode: the wait
    burns a core) from loading that waits (storage: it burns none); the training thread's own CPU in the wait is
    recorded apart from another thread's; the manifest names the host's CPUs, torch's threads and the DataLoader's
    configuration."""
    import os

    spin = _capture_train(tmp_path / "spin", "--cpu-ms", "20")
    sleep = _capture_train(tmp_path / "sleep", "--io-ms", "20")
    helper = _capture_train(tmp_path / "helper", "--helper-cpu-ms", "20")
    for doc in (spin, sleep, helper):
        assert (len(doc["step_cpu_ns"]) == len(doc["data_wait_cpu_ns"]) == len(doc["data_wait_thread_cpu_ns"])
                == len(doc["step_wall_ns"]) == 12)
    # by construction, whatever the machine's load: each batch of the spinning Dataset costs at least 20 ms of its
    # thread's CPU time (it spins until thread_time has advanced 20 ms), all of it inside the wait; each batch of the
    # sleeping one waits at least 20 ms (a sleep) and burns no more CPU than making a 64x512 tensor (well under 10 ms)
    assert min(spin["data_wait_cpu_ns"][1:]) >= 20_000_000, spin["data_wait_cpu_ns"]
    assert min(sleep["data_wait_ns"][1:]) >= 20_000_000, sleep["data_wait_ns"]
    assert max(sleep["data_wait_cpu_ns"][1:]) < 10_000_000, sleep["data_wait_cpu_ns"]
    # the spin runs on the training thread: its own CPU holds it; a helper thread's 20 ms (which the training thread
    # waits for, blocked in a join) is the process's CPU, not the training thread's
    assert min(spin["data_wait_thread_cpu_ns"][1:]) >= 20_000_000, spin["data_wait_thread_cpu_ns"]
    # a thread's CPU time inside a wait is never more than the wait: the CPU clocks are read inside the wall clock's
    # interval (was: after its end, so a wait spent on the CPU read up to 1.0016 of itself, "a bug in Kinetoscope")
    for doc in (spin, sleep, helper):
        assert all(c <= w for c, w in zip(doc["data_wait_thread_cpu_ns"], doc["data_wait_ns"], strict=True)), doc
    assert min(helper["data_wait_cpu_ns"][1:]) >= 20_000_000, helper["data_wait_cpu_ns"]
    assert max(helper["data_wait_thread_cpu_ns"][1:]) < 10_000_000, helper["data_wait_thread_cpu_ns"]
    manifest = json.loads((tmp_path / "spin" / "rank-0.manifest.json").read_text())
    cpus = len(os.sched_getaffinity(0))
    host = manifest["host"]
    assert host["cpus"] == cpus and host["torch_threads"] == 1
    # measured as the capture ended (test_capture.py checks the probe's arithmetic): none for one CPU
    assert (host["cores_effective"] is None) if cpus < 2 else isinstance(host["cores_effective"], float)
    probe = manifest["dataloader"].pop("handover_probe")  # one 64x512 float32 tensor (test_capture.py: the rest)
    assert probe["batch_bytes"] == 64 * 512 * 4 + 256 and probe["samples"] == 20
    # its dataset builds each item in __getitem__ (nothing held in memory per item): custom, no tensors
    assert manifest["dataloader"] == {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False,
                                      "pin_memory": False, "batch_size": None, "dataset_class": "Batches",
                                      "dataset_via": None, "dataset_items": 10_000, "dataset_tensors": 0,
                                      "dataset_tensor_bytes": 0, "dataset_getitem": "custom", "collate": "default"}
    workers = _capture_train(tmp_path / "workers", "--workers", "2", "--prefetch", "3", "--cpu-ms", "20")
    assert workers["step_cpu_ns"] and len(workers["workers_cpu_ns"]) == 12
    # the workers' own CPU time (they spin 20 ms per batch); none without workers
    assert sorted(workers["workers_cpu_ns"][2:])[5] > 10_000_000 and spin["workers_cpu_ns"] == [None] * 12
    manifest = json.loads((tmp_path / "workers" / "rank-0.manifest.json").read_text())
    assert manifest["dataloader"]["num_workers"] == 2 and manifest["dataloader"]["prefetch_factor"] == 3
    # the analysis reads them back
    r = load_trace(tmp_path / "workers").ranks[0]
    assert r.meta.capture["dataloader"]["num_workers"] == 2 and r.run_steps["cpu_ns"].notna().all()


# --- review of issue 15: traces that tripped the first version ----------------------------------------
def item_trace(steps: int = 10) -> TraceBuilder:
    """.item() as CUDA runs it: an 800 us kernel; aten::item's cudaMemcpyAsync (Device -> Pageable, 4 bytes)
    holds the host until the copy ran after the kernel; the stream sync after it returns at once."""
    b = TraceBuilder(device_properties=A100)
    for k in range(steps):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.kernel(t + 10, 800, launch_at=t, launch_dur=5)  # ends t + 810
        b.op("aten::item", t + 20, 800).op("aten::_local_scalar_dense", t + 22, 797)
        b.memcpy(t + 811, 1, direction="DtoH", host="Pageable", nbytes=4, call=None)
        b.runtime("cudaMemcpyAsync", t + 25, 790, b._corr)  # returns t + 815, after its copy
        b.runtime("cudaStreamSynchronize", t + 816, 2)
    return b


def test_the_item_readback_is_a_wait_the_sync_fix_removes(tmp_path):
    """Was: 'no measurable change' (the wait hides in cudaMemcpyAsync, not a sync call). Without the read-back
    the host runs ahead and the GPU's 800 us kernel + 1 us copy per step is the step: 801 us."""
    r = load_built(tmp_path, item_trace()).ranks[0]
    est = whatif.estimate(r, finding("sync_in_loop"), {"every": 1000})
    assert est["step_us_after"] == pytest.approx(801, abs=0.01)


def test_a_sync_on_another_thread_is_not_the_training_loops_wait(tmp_path):
    """The training thread is busy on the CPU for 1000 us a step and never waits; a second thread syncs on
    its own 600 us kernel. Removing that sync gives the training loop nothing (was: -39%)."""
    b = TraceBuilder(device_properties=A100)
    for k in range(6):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000).op("aten::mm", t + 1, 998)
        b.kernel(t + 10, 600, stream=9, launch_at=t + 2, launch_dur=5, launch_tid=77)
        b.runtime("cudaStreamSynchronize", t + 8, 605, tid=77)
    r = load_built(tmp_path, b).ranks[0]
    est = whatif.estimate(r, finding("sync_point"), {"every": 1000})
    assert est["saving_us_per_step"] == 0 and est["step_us_after"] == 1000


def test_a_sync_inside_a_data_wait_is_an_item_of_its_own(tmp_path):
    """A collate that syncs on the GPU's 600 us kernel inside a 690 us data wait, 300 us of host work after
    (1000 us steps). Without the sync the wait keeps its 100 us of loading: 10 + 100 + 300 = 410 us of host
    per step, the GPU's 600 us bounds it: 600 us (was: 1000, the sync swallowed by the wait)."""
    b = TraceBuilder(device_properties=A100)
    for k in range(8):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.kernel(t + 5, 600, launch_at=t, launch_dur=4)  # ends t + 605
        b.loader(t + 10, 690)
        b.runtime("cudaStreamSynchronize", t + 20, 590)  # returns t + 610
    r = load_built(tmp_path, b).ranks[0]
    assert whatif.replay_entry(r)["error"] == 0.0
    assert whatif.estimate(r, finding("sync_point"), {"every": 1000})["step_us_after"] == pytest.approx(600, abs=0.01)


def test_an_event_wait_on_another_stream_follows_the_op_it_waits_for(tmp_path):
    """A 500 us input copy on stream 7; the compute kernel on stream 8 waits for it (an event) and starts 1 us
    after it ends; a sync ends the step. Prefetched on a side stream (copy time off the path), the kernel
    starts at its launch + the rank's typical launch latency (12 us, the copies'): t + 32, ends t + 332; the
    sync returns 5 us later; 182 us of host work: 519 us (was: 1000, the wait frozen as a launch offset)."""
    b = TraceBuilder(device_properties=A100)
    for k in range(8):
        t = 10_000 + 1000 * k
        b.step(k, t, 1000)
        b.memcpy(t + 12, 500, host="Pinned", nbytes=12_000_000, stream=7, call=None)
        b.runtime("cudaMemcpyAsync", t, 10, b._corr)
        b.kernel(t + 513, 300, stream=8, launch_at=t + 20, launch_dur=5)
        b.runtime("cudaStreamSynchronize", t + 30, 788)  # returns t + 818
    r = load_built(tmp_path, b).ranks[0]
    assert whatif.replay_entry(r)["error"] == 0.0
    assert whatif.estimate(r, finding("h2d_not_overlapped"))["step_us_after"] == pytest.approx(519, abs=0.01)


def test_measured_savings_of_one_thing_count_once_and_never_below_the_gpu(tmp_path):
    """Two estimates of the CUDA-graph saving (gpu_idle's and launch_bound's) are one fix: the larger counts,
    and the GPU's 400 us of work per step still bounds the step (was: 'together 0.00 ms, 100% faster')."""
    r = load_built(tmp_path, gpu_bound_loader_trace()).ranks[0]
    g = whatif.replay_graph(r)
    a = whatif.plan_from_measure("launch", 700_000, "m", ()).edits
    b = whatif.plan_from_measure("launch", 500_000, "m", ()).edits
    assert a.merge(b).analytic_ns == {"launch": 700_000}
    assert whatif.replay(g, a.merge(b)).mean_step_ns == 400_000
    c = whatif.plan_from_measure("launch", 100_000, "m", ()).edits
    assert whatif.replay(g, c).mean_step_ns == 900_000


def test_fixes_together_take_the_named_fixs_parameters_in_any_order(tmp_path):
    """gpu_idle (mostly data wait) stands for the loader fix: with loader_stall.num_workers=1 named, either
    order gives the 1-worker answer (was: the order decided which plan won)."""
    b = waiting_steps(40_000, 30_000)
    out = _captured(tmp_path, b, {"num_workers": 0})
    r = load_trace(out).ranks[0]
    params = {"loader_stall": {"num_workers": 1, "handoff_ms": 0}}
    one = whatif.combined(r, [finding("loader_stall"), finding("gpu_idle", idle_by_cause_us={"data_wait": 1})], params)
    two = whatif.combined(r, [finding("gpu_idle", idle_by_cause_us={"data_wait": 1}), finding("loader_stall")], params)
    # one worker loads a batch in 30 ms while the loop computes for 10 ms: the step is the loader's 30 ms
    assert one["step_us_after"] == two["step_us_after"] == pytest.approx(30_000, abs=1)


def test_loading_that_waits_is_not_capped_by_the_cores(tmp_path):
    """num_workers=0 on 2 CPUs, 30 ms waits that burn no CPU (storage), 10 ms of compute: by default the fix
    takes enough workers to hide loading (4), not the 1 core the training leaves free."""
    b = waiting_steps(40_000, 30_000)
    out = _captured(tmp_path, b, {"num_workers": 0}, {"cpus": 2, "torch_threads": 1})
    _step_times(out, cpu_ns=10_000_000, wait_cpu_ns=0)
    est = whatif.estimate(load_trace(out).ranks[0], finding("loader_stall"))
    assert est["num_workers"] == 4 and est["step_us_after"] == pytest.approx(11_000, abs=1)


@pytest.mark.parametrize("setting, message", [
    ("loader_stall.num_workers=nan", "not a finite number"),
    ("loader_stall.num_workers=inf", "not a finite number"),
    ("loader_stall.num_workers=-3", "must be at least 1"),
    ("loader_stall.num_workers=2.5", "must be a whole number"),
    ("loader_stall.handoff_ms=-50", "must be at least 0"),
    ("h2d_pageable.pinned_gbps=-5", "must be at least"),
    ("sync_in_loop.every=0.5", "must be a whole number"),
    ("loader_stall.foo=1", "unknown (known:"),
    ("nosuch.key=1", "takes no parameters"),
])
def test_whatif_refuses_bad_parameters(setting, message):
    proc = run_cli("whatif", str(SAMPLES / "cpu" / "loader_bound"), "--fix", "loader_stall", "--set", setting)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
