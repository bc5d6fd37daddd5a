"""Multi-rank depth: collectives overlap, clock skew, wait vs transfer, the waited-for rank; diff and CI gates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_built
from tracebuilder import TraceBuilder

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report

ROOT = Path(__file__).resolve().parents[2]
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_comm_overlap_with_compute_is_exact(tmp_path):
    b = TraceBuilder().step(1, 0, 1000)
    b.kernel(0, 100, stream=20, name=NCCL).kernel(60, 140, stream=7, name="gemm")
    comm = build_report(load_built(tmp_path, b)).ranks[0]["comm"]
    assert comm["collectives"] == 1 and comm["time_us"] == 100
    assert comm["overlap_fraction"] == pytest.approx(0.4) and comm["exposed_us"] == 60
    assert comm["by_op"] == {"allreduce": {"count": 1, "time_us": 100}}


def test_legacy_nccl_kernel_names_are_collectives(tmp_path):
    b = TraceBuilder().step(1, 0, 1000).kernel(0, 100, name="ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)")
    by_op = build_report(load_built(tmp_path, b)).ranks[0]["comm"]["by_op"]
    assert by_op == {"allgather": {"count": 1, "time_us": 100}}


def skewed_job(folder: Path, skew_us: float = 250.0) -> None:
    """Rank 1 arrives 300 us late at every all-reduce; its clock also reads 250 us ahead."""
    for rank, (arrive, offset) in {0: (100, 0.0), 1: (400, skew_us)}.items():
        b = TraceBuilder(rank=rank, world_size=2)
        for step in range(3):
            t = step * 1000 + offset
            b.step(step, t, 1000).kernel(t + 10, 80, name="gemm").kernel(t + arrive, 600 - arrive, stream=20, name=NCCL)
        b.write(folder / f"rank-{rank}.json")


def test_clock_skew_wait_transfer_and_the_waited_for_rank(tmp_path):
    skewed_job(tmp_path / "job")
    report = build_report(load_trace(tmp_path / "job"))
    coll = report.job["collectives"]
    assert coll["matched"] == 3 and coll["unmatched"] == 0 and coll["most_waited_for_rank"] == 1
    ranks = {r["rank"]: r for r in coll["ranks"]}
    assert ranks[1]["clock_skew_us"] == 250 and ranks[0]["clock_skew_us"] == 0
    assert ranks[0]["wait_us"] == 900 and ranks[1]["wait_us"] == 0
    assert ranks[1]["waited_for_count"] == 3
    table = report.job_results["collectives"].tables["collectives"]
    assert list(table["waited_for_rank"]) == [1, 1, 1]
    assert list(table["transfer_us"]) == [200, 200, 200]  # the shortest duration of each collective


def test_point_to_point_kernels_of_a_real_two_rank_set_are_never_matched():
    """HTA's sampled 2-rank set (ranks 0 and 1 of 128): each file holds 10 NCCL SendRecv kernels and no other
    collective (counted from the files). A send/recv completes on its two peers, which need not be these two
    ranks, at different times: pairing them would invent clock skews and waits."""
    report = build_report(load_trace(ROOT / "sample_traces" / "real" / "hta_2rank"))
    coll = report.job["collectives"]
    assert coll["matched"] == 0 and coll["unmatched"] == 0
    assert [r["point_to_point"] for r in coll["ranks"]] == [10, 10]
    assert [r["clock_skew_us"] for r in coll["ranks"]] == [None, None]
    assert not [f for f in report.findings if f.id == "straggler"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kinetoscope.cli", *args], capture_output=True, text=True, timeout=300)


def step_trace(path: Path, step_us: float, kernel: str = "gemm") -> Path:
    b = TraceBuilder()
    for i in range(3):
        t = i * step_us
        b.step(i, t, step_us).kernel(t, step_us * 0.9, name=kernel)
    return b.write(path)


@pytest.mark.slow
def test_diff_reports_a_known_regression_and_gates_on_it(tmp_path):
    before = step_trace(tmp_path / "before.json", 1000)
    after = step_trace(tmp_path / "after.json", 1100)
    proc = run_cli("diff", str(before), str(after), "--max-regression", "5%", "--format", "json")
    assert proc.returncode == 3 and "grew +10.0%" in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["step_change"] == pytest.approx(0.10) and doc["regressed"]
    assert doc["kernels"][0]["name"] == "gemm" and doc["kernels"][0]["change_us_per_step"] == pytest.approx(90)
    assert run_cli("diff", str(before), str(after), "--max-regression", "20%").returncode == 0
    text = run_cli("diff", str(before), str(after)).stdout
    assert "mean step (us)" in text and "+10.0% worse" in text


def test_diff_lists_findings_that_appeared_and_disappeared():
    cpu = ROOT / "sample_traces" / "cpu"
    doc = json.loads(run_cli("diff", str(cpu / "loader_bound"), str(cpu / "healthy"), "--format", "json").stdout)
    assert {(f["status"], f["id"]) for f in doc["findings"]} == {("gone", "loader_stall")}


def test_fail_on_gate():
    loader_bound = ROOT / "sample_traces" / "cpu" / "loader_bound"
    proc = run_cli("analyze", "--fail-on", "warning", str(loader_bound))
    assert proc.returncode == 3 and "loader_stall" in proc.stderr and "Findings" in proc.stdout
    assert run_cli("analyze", "--fail-on", "warning", str(ROOT / "sample_traces" / "cpu" / "healthy")).returncode == 0


@pytest.mark.slow
def test_hta_breakdowns_are_results_or_reasons_never_exceptions():
    pytest.importorskip("hta")
    from kinetoscope.analyze.crosscheck.hta import hta_breakdowns, hta_comm_comp_overlap

    files = sorted((ROOT / "sample_traces" / "real" / "hta_2rank").glob("*.json.gz"))
    results = hta_breakdowns(files)
    assert set(results) == {"temporal_breakdown", "kernel_breakdown", "comm_comp_overlap", "launch_stats",
                            "queue_length"}
    overlap = hta_comm_comp_overlap(files)
    from kinetoscope.analyze.model import intervals as iv
    from kinetoscope.analyze.model.collectives import comm_compute_sets

    # the report does not judge these ranks' overlap (events were cut out of the files); the sets it is made of are
    # what HTA measures too: collective time hidden behind compute kernels, over all recorded collective time
    ours = {}
    for r in load_trace(ROOT / "sample_traces" / "real" / "hta_2rank").ranks:
        comm, compute = comm_compute_sets(r)
        ours[r.rank] = iv.measure(iv.intersect(comm, compute)) / iv.measure(comm)
    assert all(rank["comm"]["overlap_fraction"] is None
               for rank in build_report(load_trace(ROOT / "sample_traces" / "real" / "hta_2rank")).ranks)
    assert set(overlap) == set(ours) == {0, 1}
    # both measure the collective time hidden behind compute; HTA drops the last step and rounds to us
    assert all(abs(overlap[r] - ours[r]) < 0.05 for r in ours)
    broken = hta_breakdowns([ROOT / "sample_traces" / "real" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
    assert all(isinstance(v, str) or v is not None for v in broken.values())


def test_a_long_process_group_is_named_short_and_alike_on_every_rank():
    """A 1,024-rank group's ranks list (~6 KB) was repeated in every collective of every rank's summary: 900 KB per
    rank in the batch store, 0.9 GB in the driver at the reduce. Now abbreviated, still unique per group."""
    from kinetoscope.analyze.model.collectives import group_name

    ranks = "[" + ", ".join(str(r) for r in range(1024)) + "]"
    other = "[" + ", ".join(str(r) for r in range(1024) if r != 500) + ", 1024]"
    name = group_name("0", ranks)
    assert name.startswith("0 [0, 1, …, 1023] (1024 ranks, #") and len(name) < 64
    assert group_name("0", ranks) == name and group_name("0", other) != name
    assert group_name("0", "[0, 1, 2, 3]") == "0 [0, 1, 2, 3]" and group_name(None, None) == "default"


def test_a_rank_missing_from_a_job_is_said_and_no_straggler_is_claimed(tmp_path):
    """4 ranks (distributedInfo: world size 4), rank 3 waiting 300 us longer for data each step: with every file, rank
    3 is the straggler; without rank 2's file, the job says rank 2 is missing and claims no straggler (the others
    may have waited for rank 2 as much)."""
    from tracebuilder import straggler_job

    from kinetoscope.render.text import render_text

    straggler_job(tmp_path / "job", slow=3, n=4)
    whole = build_report(load_trace(tmp_path / "job"))
    assert whole.job["missing_ranks"] == [] and [f.rank for f in whole.findings if f.id == "straggler"] == [3]
    (tmp_path / "job" / "rank-2.json").unlink()
    partial = build_report(load_trace(tmp_path / "job"))
    assert partial.job["ranks"] == 3 and partial.job["world_size"] == 4 and partial.job["missing_ranks"] == [2]
    assert not [f for f in partial.findings if f.id == "straggler"]
    assert partial.job["collectives"]["matched"] == whole.job["collectives"]["matched"]  # what the ranks show, shown
    assert ("Job: 1 of the job's 4 ranks have no file (rank 2): nothing is claimed about the whole job (its "
            "straggler)") in render_text(partial)


def test_missing_ranks_from_file_names_and_none_when_files_name_no_rank(tmp_path):
    """No distributedInfo: rank-0 and rank-2 named in the files' names miss rank 1; files that name no rank are
    numbered in file order, and no gap can be told."""
    for name in ("rank-0.json", "rank-2.json"):
        TraceBuilder().step(1, 0, 1000).write(tmp_path / "named" / name)
    for name in ("a.json", "b.json"):
        TraceBuilder().step(1, 0, 1000).write(tmp_path / "unnamed" / name)
    assert load_trace(tmp_path / "named").missing_ranks == (1,)
    assert load_trace(tmp_path / "unnamed").missing_ranks == ()
    single = TraceBuilder(rank=34, world_size=300).step(1, 0, 1000).write(tmp_path / "one.json")
    assert load_trace(single).missing_ranks == tuple(r for r in range(300) if r != 34)


def test_rank_ranges_read_as_ranges():
    from kinetoscope.render.format import rank_ranges

    assert rank_ranges([2]) == "2" and rank_ranges([8, 0, 1, 2, 5, 7]) == "0-2, 5, 7-8" and rank_ranges([]) == ""


def test_fsdp2_on_a_host_its_ranks_fill_is_priced_as_replicated_on_a_real_capture():
    """A real FSDP2 character LM on 2 ranks of a 2-CPU host (the forty-eighth held-out set, bundled): FSDP2's own spans
    on the training thread (a union of ``FSDP::``/``fsdp::`` events clipped to the window, computed apart from the tool
    from the raw events) hold 367,035.24 us of rank 0's 1,084,554.01 us window and 333,658.87 us of rank 1's
    1,085,854.19 us; the state (28-30 MiB at its peak) fits the 11.8 GiB each rank may use many times over.
    Replicated (DDP), a step saves that time, less the rank's waits for the other (those stay): both ranks critical.
    Measured on the program itself, unprofiled (five alternating pairs): 78.5 ms a step as written, 54.0 ms as DDP.
    Was: overlap alone, worth nothing with no core free."""
    rep = build_report(load_trace(ROOT / "sample_traces" / "heldout48" / "fsdp2_gru_charlm_2rank"))
    fs = {f.rank: f for f in rep.findings if f.id == "exposed_comm"}
    assert sorted(fs) == [0, 1]
    for rank, union_us in ((0, 367_035.24), (1, 333_658.87)):
        f = fs[rank]
        ev = f.evidence
        assert ev["sharding_us"] == pytest.approx(union_us, abs=0.05)
        assert ev["replicate_instead"] is True and ev["host_memory_per_rank_bytes"] == 25_276_203_008 // 2
        per_step = union_us / 10 - ev["waiting_for_other_ranks_us"] / 10
        assert f.estimate.saving_us_per_step == pytest.approx(per_step, abs=0.01)
        assert f.estimate.bound is None and f.severity == "critical"
        assert f.recommendation.startswith("FSDP's own work holds the training thread")
        assert "bucket_cap_mb" not in f.recommendation  # its reduce-scatters run as gloo all-reduces: no DDP knobs


def test_a_rank_with_more_steps_over_uneven_shards_is_the_straggler_on_a_real_capture():
    """A real DDP job under Join over uneven shards (the fifty-first held-out set, bundled): rank 0 ran 40 steps, rank
    1 52. Computed apart from the tool from rank-1.steps.json: its steps 40-51 took 82,635.68 us; its ordinary steps
    (not step 0, not the capture's steps 25-27) have a median of 7,845.8115 us; equal shards (46 each) leave it 6 of
    them: 82,635.68 - 6 x 7,845.8115 = 35,560.811 us saved of its 397,241.132 us run (the capture's steps left out):
    8.95%, a warning. Its consensus read a warning at 7.8% (ordinary steps by their mean). Was: no straggler - the
    window's arrivals are lateness that moves."""
    rep = build_report(load_trace(ROOT / "sample_traces" / "heldout51" / "ddp_uneven_shards_mlp_2rank"))
    (f,) = [f for f in rep.findings if f.id == "straggler"]
    ev = f.evidence
    assert f.rank == 1 and ev["cause"] == "uneven_steps" and ev["steps_by_rank"] == {"0": 40, "1": 52}
    assert ev["extra_steps_us"] == pytest.approx(82_635.68, abs=0.001)
    assert ev["usual_step_us"] == pytest.approx(7_845.8115, abs=0.001)
    assert ev["saving_us"] == pytest.approx(35_560.811, abs=0.002)
    assert ev["run_us"] == pytest.approx(397_241.132, abs=0.001)
    assert f.worth.fraction == pytest.approx(35_560.811 / 397_241.132, abs=1e-6) and f.severity == "warning"


def test_whatif_prices_replicating_fsdp2_as_the_report_does(tmp_path):
    """``kinetoscope whatif --fix exposed_comm`` on the same capture: each rank's fix together is the report's fix
    alone (FSDP's own time less the rank's waits for the other). Was: together 36.70 ms a step on rank 0 (the waits
    kept), alone 31.64 ms."""
    job = ROOT / "sample_traces" / "heldout48" / "fsdp2_gru_charlm_2rank"
    out = subprocess.run([sys.executable, "-m", "kinetoscope", "whatif", str(job), "--fix", "exposed_comm", "--format",
                          "json"], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    rep = build_report(load_trace(ROOT / "sample_traces" / "heldout48" / "fsdp2_gru_charlm_2rank"))
    alone = {f.rank: f.estimate.saving_us_per_step for f in rep.findings if f.id == "exposed_comm"}
    together = {r["rank"]: r["together"]["saving_us_per_step"] for r in doc["ranks"]}
    assert together == pytest.approx(alone, abs=0.01)
