"""Issue 14: no confident wrong answer. One trace per trap, built so the right answer is known by
construction; each test failed on the code before the fix (noted per test) and pins the exact numbers."""

from __future__ import annotations

import pytest
from conftest import load_built
from tracebuilder import NCCL, TraceBuilder, straggler_job

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report, fraction_violations

MiB = 1 << 20
GiB = 1 << 30


def report_of(tmp_path, b, name="t.json"):
    return build_report(load_built(tmp_path, b, name))


def found(rep, id_):
    return [f for f in rep.findings if f.id == id_]


# --- 1. copy time is a union per device ------------------------------------------------------
def test_concurrent_copies_on_two_streams_count_once(tmp_path):
    """Was: 200 us of copy time in a 100 us span, 10 GB/s (half the real rate)."""
    b = TraceBuilder().step(1, 0, 1000)
    b.memcpy(0, 100, host="Pinned", stream=7, nbytes=1_000_000, call="cudaMemcpyAsync", call_at=-10)
    b.memcpy(0, 100, host="Pinned", stream=8, nbytes=1_000_000, call="cudaMemcpyAsync", call_at=-8)
    b.kernel(50, 100, stream=9)  # overlaps both copies for 50 us
    h2d = report_of(tmp_path, b).ranks[0]["h2d"]
    assert h2d["time_us"] == 100 and h2d["fraction"] == pytest.approx(0.1)
    assert h2d["bandwidth_gb_per_s"] == pytest.approx(20.0)  # 2 MB in 100 us
    assert h2d["overlap_fraction"] == pytest.approx(0.5)
    assert h2d["host_memory_us"] == {"pageable": 0, "pinned": 100, "unknown_but_blocking": 0, "unknown": 0}


def test_copy_overlap_is_with_kernels_on_another_stream_only(tmp_path):
    b = TraceBuilder().step(1, 0, 1000)
    b.memcpy(0, 200, host="Pinned", stream=7, call="cudaMemcpyAsync", call_at=-10)
    b.memcpy(100, 200, host="Pinned", stream=8, call="cudaMemcpyAsync", call_at=-8)
    b.kernel(0, 300, stream=7)  # same stream as the first copy: overlaps only the second (100..300)
    h2d = report_of(tmp_path, b).ranks[0]["h2d"]
    assert h2d["time_us"] == 300
    assert h2d["overlap_fraction"] == pytest.approx(200 / 300)


# --- 2. collectives matched by what the trace says, not by position ------------------------


def two_rank_job(folder, *, skew_us=200.0, rank1_misses_first=True, steps=4, step_us=1000.0):
    """Rank 0 arrives at every all-reduce at +600 us, rank 1 at +700 us (so rank 0 waits 100 us each time);
    both finish at +900 us. Rank 1's clock reads ``skew_us`` ahead; its capture starts one step late."""
    for rank, arrive in ((0, 600.0), (1, 700.0)):
        b = TraceBuilder(rank=rank, world_size=2)
        offset = skew_us if rank == 1 else 0.0
        first = 1 if (rank == 1 and rank1_misses_first) else 0
        for s in range(first, steps):
            t = s * step_us + offset
            b.step(s, t, step_us).kernel(t + 10, 500, name="gemm")
            b.kernel(t + arrive, 900 - arrive, stream=20, name=NCCL)
        b.write(folder / f"rank-{rank}.json")


def test_a_collective_missing_from_one_rank_does_not_shift_the_others(tmp_path):
    """Was: rank 1's first all-reduce paired with rank 0's first, a 'skew' of a whole step (-800 us),
    and rank 0 named as the one waited for."""
    two_rank_job(tmp_path / "job")
    coll = build_report(load_trace(tmp_path / "job")).job["collectives"]
    ranks = {r["rank"]: r for r in coll["ranks"]}
    assert ranks[1]["clock_skew_us"] == 200 and ranks[0]["clock_skew_us"] == 0
    assert coll["matched"] == 3 and ranks[0]["unmatched"] == 1 and ranks[1]["unmatched"] == 0
    assert coll["most_waited_for_rank"] == 1 and ranks[1]["waited_for_count"] == 3
    assert ranks[0]["wait_us"] == 300 and ranks[1]["wait_us"] == 0


def test_a_skew_larger_than_a_step_is_a_mismatch_not_a_skew(tmp_path):
    """Periodic all-reduces and no metadata: an offset of a whole step is not a clock skew."""
    two_rank_job(tmp_path / "job", skew_us=5000.0, rank1_misses_first=False)
    coll = build_report(load_trace(tmp_path / "job")).job["collectives"]
    ranks = {r["rank"]: r for r in coll["ranks"]}
    assert coll["matched"] == 0 and ranks[1]["unmatched"] == 4
    assert coll["groups"][0]["misaligned_ranks"] == [1]


def comm_kernel(b, t, dur, *, pg, ranks, seq=None, nelems=1024, stream=20, op="allreduce"):
    args = {"device": 0, "stream": stream, "correlation": 0, "Collective name": op, "Process Group Name": pg,
            "Process Group Ranks": ranks, "In msg nelems": nelems, "Out msg nelems": nelems, "Group size": 2,
            "dtype": "Float"}
    if seq is not None:
        args["Seq"] = seq
    b.raw({"ph": "X", "cat": "kernel", "name": NCCL, "pid": 0, "tid": stream, "ts": t, "dur": dur, "args": args})


def test_tensor_and_data_parallel_groups_matched_by_sequence_number_and_skews_solved(tmp_path):
    """4 ranks, TP groups {0,1} {2,3} (sequence numbers), DP groups {0,2} {1,3} (no sequence numbers, sizes
    differ per call). Planted clock offsets; each rank's capture holds a different subset of the TP calls."""
    skew = {0: 0.0, 1: 100.0, 2: -250.0, 3: 400.0}
    tp = {0: "1", 1: "1", 2: "2", 3: "2"}
    tp_ranks = {0: "[0, 1]", 1: "[0, 1]", 2: "[2, 3]", 3: "[2, 3]"}
    dp = {0: "3", 2: "3", 1: "4", 3: "4"}
    dp_ranks = {0: "[0, 2]", 2: "[0, 2]", 1: "[1, 3]", 3: "[1, 3]"}
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4)
        o = skew[r]
        for s in range(3):
            t = s * 2000 + o
            b.step(s, t, 2000)
            # TP: three calls a step, seq 3s..3s+2; ranks 1 and 3 miss the very first one (capture started late)
            for k in range(3):
                seq = 3 * s + k
                if s == 0 and k == 0 and r in (1, 3):
                    continue
                comm_kernel(b, t + 100 + 300 * k, 200, pg=tp[r], ranks=tp_ranks[r], seq=seq, stream=21)
            # DP: one call a step, its size changing per step, completing at +1900 on every rank
            comm_kernel(b, t + 1400 + (50 if r in (2, 3) else 0), 500 - (50 if r in (2, 3) else 0), pg=dp[r],
                        ranks=dp_ranks[r], nelems=1000 + s, stream=22)
        b.write(tmp_path / "job" / f"rank-{r}.json")
    coll = build_report(load_trace(tmp_path / "job")).job["collectives"]
    ranks = {r["rank"]: r for r in coll["ranks"]}
    assert {r: ranks[r]["clock_skew_us"] for r in range(4)} == skew
    methods = {g["group"]: g["method"] for g in coll["groups"]}
    assert methods == {"1 [0, 1]": "sequence_numbers", "2 [2, 3]": "sequence_numbers",
                       "3 [0, 2]": "alignment", "4 [1, 3]": "alignment"}
    # TP: 8 calls common to both members of each group; DP: 3 per group
    matched = {g["group"]: g["matched"] for g in coll["groups"]}
    assert matched == {"1 [0, 1]": 8, "2 [2, 3]": 8, "3 [0, 2]": 3, "4 [1, 3]": 3}
    assert ranks[0]["unmatched"] == 1 and ranks[1]["unmatched"] == 0
    # in DP, ranks 2 and 3 arrive 50 us after 0 and 1: they are the ones waited for, 3 times each
    assert ranks[2]["waited_for_count"] == 3 and ranks[3]["waited_for_count"] == 3
    assert ranks[0]["wait_us"] == 150 and ranks[1]["wait_us"] == 150


def test_the_straggler_is_named_with_its_cause_from_aligned_arrivals(tmp_path):
    straggler_job(tmp_path / "job")
    rep = build_report(load_trace(tmp_path / "job"))
    (f,) = found(rep, "straggler")
    assert f.rank == 2 and f.evidence["cause"] == "input"
    assert f.evidence["last_to_arrive_share"] == 1.0
    # each of the 3 others waits 300 us per step for it
    assert f.evidence["others_wait_us_per_step"] == 300
    assert "data" in f.recommendation


def test_even_ranks_have_no_straggler(tmp_path):
    straggler_job(tmp_path / "job", late_us=0.0)
    assert not found(build_report(load_trace(tmp_path / "job")), "straggler")


@pytest.mark.slow
@pytest.mark.cluster
def test_batch_names_the_same_straggler_as_analyze(tmp_path):
    pytest.importorskip("dask")
    from kinetoscope.batch.run import run_batch
    from kinetoscope.batch.store import read_table

    straggler_job(tmp_path / "traces" / "job")
    run_batch([tmp_path / "traces"], tmp_path / "store", workers=1)
    findings = read_table(tmp_path / "store", "findings")
    strag = findings[findings["id"] == "straggler"]
    assert list(strag["rank"]) == [2]
    # judged by the one policy, as analyze judges it (was: stored as info, the finding's default, whatever its worth)
    (analyzed,) = found(build_report(load_trace(tmp_path / "traces" / "job")), "straggler")
    assert list(strag["severity"]) == [analyzed.severity] and analyzed.severity != "info"
    ranks = read_table(tmp_path / "store", "job_ranks").set_index("rank")
    assert bool(ranks.loc[2, "straggler"]) and ranks.loc[2, "straggler_cause"] == "input"
    # every other rank waited for rank 2; rank 2 never waited
    assert list(ranks["waited_for_rank"].sort_index().astype("Int64").astype(object).fillna(-1)) == [2, 2, -1, 2]
    (job,) = read_table(tmp_path / "store", "jobs").to_dict("records")
    assert (job["ranks"], job["matched"], job["unmatched"]) == (4, 5, 0)
    assert (job["straggler_rank"], job["straggler_cause"], job["most_waited_for_rank"]) == (2, "input", 2)
    assert job["straggler_wait_us_per_step"] == 300 and job["max_abs_clock_skew_us"] == 0
    assert list(ranks["waited_for_count"].sort_index()) == [0, 0, 5, 0]


# --- 3. memory growth needs enough steps, and persistence ---------------------------------
def memory_trace(allocated_mib, reserved_mib=None, total=80 * GiB):
    b = TraceBuilder(device_properties=[{"id": 0, "name": "GPU", "totalGlobalMem": total}])
    for i, a in enumerate(allocated_mib):
        b.step(i, i * 1000, 1000)
        r = reserved_mib[i] if reserved_mib is not None else a + 32
        b.memory(i * 1000 + 500, 0, allocated=a * MiB, reserved=r * MiB)
    return b


def test_a_three_step_warm_up_is_not_a_leak(tmp_path):
    """Was: critical, '1076 steps to OOM', from +100 MiB then +50 MiB."""
    rep = report_of(tmp_path, memory_trace([1000, 1100, 1150]))
    assert not found(rep, "memory_growth")
    (f,) = found(rep, "memory_inconclusive")
    assert f.severity == "info" and f.evidence["steps_fitted"] == 3 and "3 step ends" in f.title


def test_a_warm_up_that_levels_off_over_many_steps_is_not_a_leak(tmp_path):
    rep = report_of(tmp_path, memory_trace([1000, 1100, 1150] + [1150] * 7))
    assert not found(rep, "memory_growth") and not found(rep, "memory_inconclusive")


def test_a_steady_leak_over_twelve_steps_is_critical_and_says_so(tmp_path):
    rep = report_of(tmp_path, memory_trace([1024 + 64 * i for i in range(12)]))
    (f,) = found(rep, "memory_growth")
    # 80 GiB less the 1760 MiB reserved at the peak (1728 + 32), at 64 MiB a step
    assert f.severity == "critical" and f.evidence["steps_to_out_of_memory"] == (80 * 1024 - 1760) // 64
    assert f.evidence["growth_bytes_per_step"] == 64 * MiB and "12 steps" in f.title


def test_a_leak_seen_over_six_steps_is_only_a_warning(tmp_path):
    rep = report_of(tmp_path, memory_trace([1024 + 64 * i for i in range(6)]))
    (f,) = found(rep, "memory_growth")
    assert f.severity == "warning" and "6 steps" in f.title


def test_one_spike_does_not_bend_the_robust_slope(tmp_path):
    values = [1024 + 8 * i for i in range(10)]
    values[5] += 4096  # one step holds a 4 GiB temporary at its end
    rep = report_of(tmp_path, memory_trace(values))
    dev = rep.ranks[0]["memory"]["devices"][0]
    assert dev["growth_bytes_per_step"] == 8 * MiB


def test_reserved_growing_while_allocated_stays_flat_is_fragmentation(tmp_path):
    """Was: nothing at all for 200 MiB/step of reserve growth."""
    rep = report_of(tmp_path, memory_trace([2048] * 8, reserved_mib=[2100 + 200 * i for i in range(8)]))
    assert not found(rep, "memory_growth")
    (f,) = found(rep, "reserved_memory_growth")
    assert f.severity == "warning" and f.evidence["reserved_growth_bytes_per_step"] == 200 * MiB
    assert "expandable_segments" in f.recommendation and "8 steps" in f.title


# --- 4. only the training loop's waits are data wait -----------------------------------------
def test_a_prefetch_thread_calling_next_is_not_the_loop_waiting(tmp_path):
    """Was: 'data loading 80%' from a prefetcher thread's next() while the training thread never waited."""
    b = TraceBuilder()
    for i in range(5):
        t = i * 1000
        b.step(i, t, 1000).kernel(t, 900, launch_at=t + 1)
        b.op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t, 800, cat="user_annotation", tid=200)
    rep = report_of(tmp_path, b)
    loader = rep.ranks[0]["loader"]
    assert loader["time_us"] == 0 and loader["calls"] == 0
    assert loader["other_threads_us"] == 4000 and loader["other_threads_calls"] == 5
    assert not found(rep, "loader_stall")
    assert rep.ranks[0]["gpu"]["devices"][0]["idle_by_cause_us"]["data_wait"] == 0


# --- 5. unknown host memory is null, not 0% pageable ------------------------------------------
def test_rocm_copies_that_name_neither_pinned_nor_pageable_are_unknown(tmp_path):
    b = TraceBuilder().step(1, 0, 1000)
    for t in (0, 500):
        b.raw({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Host -> Device)", "pid": 0, "tid": 7, "ts": t,
               "dur": 100, "args": {"device": 0, "stream": 7, "correlation": 900 + t, "bytes": 1 << 20}})
        b.runtime("hipMemcpyAsync", t - 20, 10, 900 + t)  # returns before the copy starts: async, memory unknown
    rep = report_of(tmp_path, b)
    h2d = rep.ranks[0]["h2d"]
    assert h2d["pageable_fraction"] is None and h2d["unknown_count"] == 2
    assert h2d["host_memory_us"]["unknown"] == 200
    assert not found(rep, "h2d_pageable")


def test_a_copy_call_holding_the_host_for_the_whole_copy_behaves_as_pageable(tmp_path):
    b = TraceBuilder().step(1, 0, 1000)
    b.raw({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Host -> Device)", "pid": 0, "tid": 7, "ts": 100,
           "dur": 100, "args": {"device": 0, "stream": 7, "correlation": 77, "bytes": 1 << 20}})
    b.runtime("hipMemcpyWithStream", 90, 120, 77)  # 90..210 covers the copy 100..200
    rep = report_of(tmp_path, b)
    h2d = rep.ranks[0]["h2d"]
    assert h2d["pageable_fraction"] == 1.0 and h2d["blocking_count"] == 1
    (f,) = found(rep, "h2d_pageable")
    assert f.evidence["inferred_from_blocking_calls"] and f.evidence["pageable_time_us"] == 100


# --- 6. launch-bound loops, read from the GPU's queue ------------------------------------------
def eager_loop(delay_us):
    """1000 kernels of 8 us, one launch every 20 us (5 us calls), untraced Python in between."""
    b = TraceBuilder().step(1, 0, 20_000)
    for i in range(1000):
        launch = i * 20.0
        b.kernel(launch + 5 + delay_us, 8, launch_at=launch, launch_dur=5)
    return b


def test_an_eager_loop_of_tiny_kernels_is_launch_bound(tmp_path):
    """Was: 60% idle reported as 'other: untraced host work' and no launch_bound."""
    rep = report_of(tmp_path, eager_loop(delay_us=3))
    gpu = rep.ranks[0]["gpu"]["devices"][0]
    assert gpu["idle_fraction"] == pytest.approx(0.6, abs=1e-3)
    (f,) = found(rep, "launch_bound")
    assert f.evidence["queue_empty_share"] == 1.0 and f.evidence["median_kernel_us"] == 8
    assert f.evidence["median_launch_interval_us"] == 20
    # every gap but the last (which ends at the window's end, not at a kernel) waited for a launch: 12 us x 999
    assert f.evidence["gpu_idle_waiting_for_launches_us"] == pytest.approx(12 * 999 + 8, abs=1)


def test_kernels_waiting_in_a_deep_queue_are_not_launch_bound(tmp_path):
    b = TraceBuilder().step(1, 0, 20_000)
    for i in range(1000):  # launched 20 us apart, queued for 5 ms each: the GPU has work waiting
        b.kernel(5000 + i * 15.0, 15, launch_at=i * 15.0, launch_dur=5)
    assert not found(report_of(tmp_path, b), "launch_bound")


# --- 7. CUDA/HIP graphs and stream capture: missing activity, not idle ------------------------
def test_graph_replays_without_recorded_kernels_are_missing_activity_not_idle(tmp_path):
    """Was: GPU idle 99%, critical."""
    b = TraceBuilder()
    for i in range(4):
        t = i * 1000
        b.step(i, t, 1000).kernel(t, 5, launch_at=t + 1)
        b.runtime("cudaGraphLaunch", t + 10, 20, 5000 + i)  # its kernels were not recorded
    rep = report_of(tmp_path, b)
    gpu = rep.ranks[0]["gpu"]
    assert gpu["idle_fraction"] is None and gpu["devices"][0]["idle_us"] is None
    assert gpu["missing_activity"]["graph_launches_unrecorded"] == 4
    assert not found(rep, "gpu_idle")
    (f,) = found(rep, "gpu_activity_missing")
    assert f.severity == "info"


def test_a_stream_capture_phase_is_missing_activity(tmp_path):
    b = TraceBuilder().step(1, 0, 1000).kernel(0, 50, launch_at=-10)
    b.runtime("cudaStreamBeginCapture", 60, 5)
    for i in range(20):
        b.runtime("cudaLaunchKernel", 100 + i * 40, 5, 7000 + i)  # captured: nothing runs
    b.runtime("cudaStreamEndCapture", 950, 10)
    rep = report_of(tmp_path, b)
    assert rep.ranks[0]["gpu"]["missing_activity"]["stream_capture_us"] == 900
    assert not found(rep, "gpu_idle") and found(rep, "gpu_activity_missing")


def test_recorded_graph_kernels_count_for_the_phase_that_launched_them(tmp_path):
    b = TraceBuilder().step(1, 0, 2000)
    b.op("aten::linear", 100, 200)  # forward
    b.runtime("cudaGraphLaunch", 150, 20, 4242)
    for k in range(3):  # the graph's kernels carry the replay's correlation id
        b.raw({"ph": "X", "cat": "kernel", "name": f"graph_k{k}", "pid": 0, "tid": 7, "ts": 400 + 300 * k, "dur": 300,
               "args": {"device": 0, "stream": 7, "correlation": 4242}})
    rep = report_of(tmp_path, b)
    phases = rep.ranks[0]["phases"]
    assert phases["forward"]["gpu_time_us"] == 900
    assert rep.ranks[0]["gpu"]["missing_activity"]["graph_launches_unrecorded"] == 0


def test_a_run_that_used_a_gpu_the_profiler_did_not_record_says_so(tmp_path):
    b = TraceBuilder(device_properties=[{"id": 0, "name": "NVIDIA A100", "totalGlobalMem": 40 * GiB}])
    b.step(1, 0, 1000).op("aten::record_stream", 10, 5).op("nccl:all_to_all", 100, 300, cat="user_annotation")
    rep = report_of(tmp_path, b)
    assert rep.ranks[0]["gpu"] is None
    (f,) = found(rep, "gpu_activity_missing")
    assert f.severity == "info" and "no GPU activity was recorded" in f.title


# --- 8. a sync costs the GPU idle it causes, not the host's wait -------------------------------
def test_a_sync_on_a_busy_gpu_costs_nothing_and_is_not_warned_about(tmp_path):
    """Was: sync_in_loop weighed by the host's 206 ms blocked and ranked above the real problem."""
    b = TraceBuilder()
    for i in range(10):
        t = i * 10_000
        b.step(i, t, 10_000).loader(t, 10, multiprocess=True)
        b.kernel(t + 20, 9970, launch_at=t + 15, launch_dur=5)  # busy until t + 9990
        b.op("aten::item", t + 50, 9945)  # waits for the busy GPU, returns at t + 9995
        b.runtime("cudaStreamSynchronize", t + 60, 9930)
        b.memcpy(t + 12, 2000, host="Pageable", stream=8, call="cudaMemcpyAsync", call_at=t + 11)
    rep = report_of(tmp_path, b)
    assert not found(rep, "sync_point")
    (s,) = found(rep, "sync_in_loop")
    # the GPU idles from t + 9990 to the next step's copy at t + 10012 (22 us), the last step to the window's end
    assert s.severity == "info" and s.evidence["gpu_idle_caused_us"] == 9 * 22 + 10
    # the GPU is busy 99.7% of the window: neither the sync nor the pageable copy beside the kernel is worth a claim
    assert {f.severity for f in rep.findings} == {"info"}


def test_a_sync_that_drains_the_queue_costs_the_refill(tmp_path):
    b = TraceBuilder()
    for i in range(5):
        t = i * 1000
        b.step(i, t, 1000)
        b.kernel(t, 300, launch_at=t - 10, launch_dur=5)
        b.runtime("cudaStreamSynchronize", t + 100, 210)  # the GPU drains at t + 300, the call returns at t + 310
        b.kernel(t + 700, 300, launch_at=t + 690, launch_dur=5)  # the host relaunches 390 us later
    rep = report_of(tmp_path, b)
    dev = rep.ranks[0]["gpu"]["devices"][0]
    # per step: idle 300..700. Without the sync the host would have started what it does after it 210 us sooner
    # (100..310 in the sync), so the kernel at 700 would have come at most 210 us sooner: the sync owns 300..510;
    # the rest of the gap is the host's own work, idle with or without the sync
    assert dev["idle_by_cause_us"]["sync"] == 5 * 210
    (f,) = found(rep, "sync_point")
    assert f.evidence["gpu_idle_caused_us"] == 1050


def test_a_sync_on_an_already_idle_gpu_costs_nothing(tmp_path):
    b = TraceBuilder().step(1, 0, 1000).kernel(0, 100, launch_at=-10)
    b.runtime("cudaDeviceSynchronize", 400, 5)  # the GPU went idle at 100: nothing left to drain
    b.kernel(900, 100, launch_at=890)
    dev = report_of(tmp_path, b).ranks[0]["gpu"]["devices"][0]
    assert dev["idle_by_cause_us"]["sync"] == 0


# --- 9. a slow CPU op is not launch overhead; every sync API counts ----------------------------
def test_a_long_cpu_op_that_launches_nothing_is_host_compute(tmp_path):
    b = TraceBuilder().step(1, 0, 5000).kernel(0, 500, launch_at=-10)
    b.op("my_ext::cpu_augment", 600, 3000)  # 3 ms of CPU work, no launch inside
    b.op("aten::add", 3700, 50).kernel(3760, 1240, launch_at=3710)
    rep = report_of(tmp_path, b)
    causes = rep.ranks[0]["gpu"]["devices"][0]["idle_by_cause_us"]
    assert causes["host_compute"] == 3000 and causes["host_launch"] == 50
    (f,) = found(rep, "gpu_idle")
    assert "host compute" in f.title and "CUDA graphs" not in f.recommendation


@pytest.mark.parametrize("name", ["cudaFree", "cudaEventSynchronize", "cuCtxSynchronize", "cuStreamSynchronize",
                                  "cudaMemcpy", "hipStreamSynchronize"])
def test_every_synchronising_api_is_a_sync(tmp_path, name):
    b = TraceBuilder().step(1, 0, 1000).kernel(0, 300, launch_at=-10)
    b.runtime(name, 100, 210)  # the GPU drains at 300 while the host waits
    b.kernel(500, 500, launch_at=490)
    dev = report_of(tmp_path, b).ranks[0]["gpu"]["devices"][0]
    assert dev["idle_by_cause_us"]["sync"] == 200


# --- 10. a crash --------------------------------------------------------------------------------
def test_copies_whose_launching_calls_are_not_in_the_file(tmp_path):
    """Was: TypeError in the copies analyzer (an analysis error, exit 1)."""
    b = TraceBuilder().step(1, 0, 1000).memcpy(0, 100, host="Pageable").memcpy(200, 100, host="Pinned")
    rep = report_of(tmp_path, b)
    assert rep.failures == ()
    assert rep.ranks[0]["h2d"]["time_us"] == 200 and rep.ranks[0]["h2d"]["synchronous_count"] == 0


# --- invariants that can fail ---------------------------------------------------------------------
def test_fractions_out_of_range_are_reported_not_clamped():
    bad = {"loader": {"fraction": 1.5, "fraction_of": "window"}, "gpu": {"devices": [{"idle_fraction": -0.25}]},
           "steps": {"share_like_count": 3}}
    assert fraction_violations(bad) == ["loader.fraction = 1.5", "gpu.devices[0].idle_fraction = -0.25"]


def test_frac_never_clamps():
    """A fraction outside [0, 1] is a bug to see, not to hide (the old frac clamped every one)."""
    from kinetoscope.analyze.model.units import frac

    assert frac(3, 2) == 1.5 and frac(-1, 4) == -0.25 and frac(1, 0) is None and frac(None, 4) is None


def test_an_analyzer_reporting_a_fraction_out_of_range_is_listed_in_the_report(tmp_path, monkeypatch):
    from kinetoscope.analyze.model.units import frac
    from kinetoscope.analyze.registry import AnalysisResult, Analyzer, analyzers
    from kinetoscope.analyze.report import builder as report_module

    def broken(trace, config):
        return AnalysisResult(key="broken", metrics={"broken": {"fraction": frac(150, 100), "fraction_of": "window"}})

    fake = Analyzer(key="broken", title="broken", scope="rank", fn=broken, doc="")
    monkeypatch.setattr(report_module, "analyzers", lambda: (*analyzers(), fake))
    rep = report_of(tmp_path, TraceBuilder().step(1, 0, 100))
    assert rep.violations == ("rank 0: broken.fraction = 1.5",)
    assert rep.to_dict()["invariant_violations"] == ["rank 0: broken.fraction = 1.5"]


def test_stream_idle_is_measured_from_its_gaps(tmp_path):
    b = TraceBuilder().step(1, 0, 1000).kernel(100, 200, stream=7).kernel(250, 300, stream=7)
    s = report_of(tmp_path, b).ranks[0]["gpu"]["streams"][0]
    assert s["busy_us"] == 450 and s["idle_us"] == 550 and s["largest_gap_us"] == 450


# --- look-alikes found in real traces ----------------------------------------------------------
def test_a_window_dominated_by_start_up_gives_no_warning(tmp_path):
    """A 6.5 ms first-call launch (lazy module loading) in a 9 ms window: GPU idle is real but not a loop's."""
    b = TraceBuilder().step(1, 0, 9000)
    for i in range(30):
        b.kernel(100 + i * 20, 5, launch_at=90 + i * 20, launch_dur=5)
    b.runtime("hipLaunchKernel", 1000, 6500, 31337)
    b.kernel(7600, 10)
    rep = report_of(tmp_path, b)
    (f,) = found(rep, "gpu_idle")
    assert f.severity == "info" and "start-up" in f.title
    assert rep.ranks[0]["gpu"]["startup_us"] == 6500


def test_kernels_queued_behind_unrecorded_work_are_missing_activity(tmp_path):
    """Kernels launched at the window's start only run 8 ms later on a GPU the trace shows idle."""
    b = TraceBuilder().step(1, 0, 10_000)
    for i in range(30):
        b.kernel(8000 + i * 60, 50, launch_at=10 + i * 5, launch_dur=3)
    rep = report_of(tmp_path, b)
    assert rep.ranks[0]["gpu"]["idle_fraction"] is None
    assert not found(rep, "gpu_idle") and found(rep, "gpu_activity_missing")


def test_a_step_never_closed_is_clipped_to_the_recording(tmp_path):
    b = TraceBuilder()
    b.raw({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
           "ts": 0, "dur": 2000})
    b.step(1, 500, 13_000_000)
    b.kernel(600, 2, launch_at=580)
    rep = report_of(tmp_path, b)
    assert rep.ranks[0]["window_us"] == 1500
    assert any("never closed" in w for w in rep.ranks[0]["warnings"])
    (f,) = found(rep, "gpu_idle")
    assert f.severity == "info" and "1 GPU operation" in f.title


def test_events_cut_from_the_trace_are_missing_activity(tmp_path):
    """Runtime correlation ids jump by 1,300 across an 18 ms silence: the events were trimmed."""
    b = TraceBuilder().step(1, 0, 20_000)
    for i in range(25):
        b.runtime("cudaLaunchKernel", 10 + i * 20, 5, 10 + i)
        b.raw({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 16 + i * 20, "dur": 10,
               "args": {"device": 0, "stream": 7, "correlation": 10 + i}})
    b.runtime("cudaLaunchKernel", 19_000, 5, 1400)
    b.raw({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 19_006, "dur": 10,
           "args": {"device": 0, "stream": 7, "correlation": 1400}})
    rep = report_of(tmp_path, b)
    assert rep.ranks[0]["gpu"]["missing_activity"]["cut_from_trace_us"] == pytest.approx(18_505, abs=1)
    assert not found(rep, "gpu_idle")


def test_steps_are_inferred_from_data_loader_waits_and_a_cold_first_iteration_is_left_out(tmp_path):
    b = TraceBuilder()  # no ProfilerStep spans
    starts = [0, 5000, 6000, 7000, 8000, 9000]  # the first iteration is 5x the others: start-up
    for t in starts:
        b.loader(t, 300)
        b.kernel(t + 300, 600, launch_at=t + 300)
    rep = report_of(tmp_path, b)
    r = rep.ranks[0]
    assert r["window"]["basis"] == "inferred_steps" and r["window_us"] == 4000 and r["steps"]["count"] == 4
    assert r["loader"]["time_us"] == 1200


# --- an independent review's cases (variants of items 1-9 the first tests did not cover) -----------
def test_a_straggler_among_tensor_and_data_parallel_groups(tmp_path):
    """8 ranks, TP pairs and two DP groups with sequence numbers; rank 5 waits 500 us longer for data every
    step. Counted over all groups, rank 5 would be last in a minority of collectives and be missed."""
    for r in range(8):
        b = TraceBuilder(rank=r, world_size=8)
        tp_name, tp_ranks = f"tp{r // 2}", f"[{r // 2 * 2}, {r // 2 * 2 + 1}]"
        dp_name, dp_ranks = ("dp0", "[0, 2, 4, 6]") if r % 2 == 0 else ("dp1", "[1, 3, 5, 7]")
        for s in range(6):
            t = s * 4000
            load = 100 + (500 if r == 5 else 0)
            b.step(s, t, 4000).loader(t, load, multiprocess=True)
            b.kernel(t + load, 1000, name="gemm", launch_at=t + load, launch_dur=5)
            comm_kernel(b, t + load + 1000, 2000 - load - 1000 + 100, pg=tp_name, ranks=tp_ranks, seq=s, stream=21)
            comm_kernel(b, t + 2200, 800, pg=dp_name, ranks=dp_ranks, seq=s, stream=22)
        b.write(tmp_path / "job" / f"rank-{r}.json")
    rep = build_report(load_trace(tmp_path / "job"))
    (f,) = found(rep, "straggler")
    assert f.rank == 5 and f.evidence["cause"] == "input" and f.evidence["last_to_arrive_share"] == 1.0
    # only its TP partner (rank 4) waits, 500 us a step; per partner and step: 500
    assert f.evidence["others_wait_us_per_step"] == 500


def test_a_collective_missing_mid_sequence_shifts_nothing(tmp_path):
    """Rank 1 arrives 3 us late at each of 12 all-reduces and its trace lacks the 6th: 11 matched, 33 us of
    waiting in all, no straggler (was: every pair after the gap a step off, a 'straggler' warning)."""
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2)
        for s in range(12):
            t = s * 1000
            b.step(s, t, 1000).kernel(t + 10, 500, name="gemm")
            if rank == 1 and s == 5:
                continue
            arrive = 600 + (3 if rank == 1 else 0)
            b.kernel(t + arrive, 900 - arrive, stream=20, name=NCCL)
        b.write(tmp_path / "job" / f"rank-{rank}.json")
    rep = build_report(load_trace(tmp_path / "job"))
    coll = rep.job["collectives"]
    ranks = {r["rank"]: r for r in coll["ranks"]}
    assert coll["matched"] == 11 and ranks[0]["unmatched"] == 1 and ranks[1]["unmatched"] == 0
    assert ranks[0]["wait_us"] == 33 and ranks[1]["clock_skew_us"] == 0
    assert not found(rep, "straggler")


def test_point_to_point_calls_are_never_matched(tmp_path):
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2)
        for s in range(4):
            t = s * 1000 + (300 if rank else 0)  # a send completes before its receive starts
            b.step(s, s * 1000, 1000).kernel(t + 100, 200, stream=20,
                                             name="ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
        b.write(tmp_path / "job" / f"rank-{rank}.json")
    coll = build_report(load_trace(tmp_path / "job")).job["collectives"]
    assert coll["matched"] == 0 and [r["point_to_point"] for r in coll["ranks"]] == [4, 4]


def test_two_unconnected_groups_each_get_their_skews_and_waits(tmp_path):
    """TP pairs {0,1} and {2,3}, nothing linking them: skews within each pair, waits within each pair."""
    offsets = {0: 0.0, 1: 40.0, 2: 0.0, 3: -70.0}
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4)
        for s in range(5):
            t = s * 1000 + offsets[r]
            late = 200 if r == 3 else 0
            b.step(s, t, 1000).kernel(t + 10, 300, name="gemm")
            comm_kernel(b, t + 400 + late, 400 - late, pg=f"tp{r // 2}", ranks=f"[{r // 2 * 2}, {r // 2 * 2 + 1}]",
                        stream=21)
        b.write(tmp_path / "job" / f"rank-{r}.json")
    rep = build_report(load_trace(tmp_path / "job"))
    ranks = {r["rank"]: r for r in rep.job["collectives"]["ranks"]}
    assert [ranks[r]["clock_skew_us"] for r in range(4)] == [0, 40, 0, -70]
    assert ranks[2]["wait_us"] == 1000 and ranks[3]["waited_for_count"] == 5
    (f,) = found(rep, "straggler")
    assert f.rank == 3 and f.evidence["others_wait_us_per_step"] == 200


def test_an_item_on_an_idle_gpu_that_launches_its_own_copy_drains_nothing(tmp_path):
    b = TraceBuilder()
    for i in range(5):
        t = i * 10_000
        b.step(i, t, 10_000).kernel(t + 10, 3000, launch_at=t, launch_dur=5)  # the GPU is idle from t + 3010
        b.op("aten::item", t + 6000, 100)  # .item() long after: its own 2 us copy, then a stream sync
        b.memcpy(t + 6020, 2, direction="DtoH", host="Pageable", call="cudaMemcpyAsync", call_at=t + 6010)
        b.runtime("cudaStreamSynchronize", t + 6016, 80)
    rep = report_of(tmp_path, b)
    assert rep.ranks[0]["gpu"]["devices"][0]["idle_by_cause_us"]["sync"] == 0
    assert not found(rep, "sync_point")


def test_without_steps_a_prefetch_thread_is_not_the_training_loop(tmp_path):
    b = TraceBuilder()  # no ProfilerStep marks; thread 200 is a prefetcher, the loop (100) launches every kernel
    for i in range(8):
        t = i * 1000
        b.op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t, 800, cat="user_annotation", tid=200)
        for k in range(4):
            b.kernel(t + 100 + 200 * k, 150, launch_at=t + 90 + 200 * k)
    loader = report_of(tmp_path, b).ranks[0]["loader"]
    assert loader["time_us"] == 0 and loader["other_threads_calls"] == 8


def test_a_leak_landing_every_other_step_is_a_leak(tmp_path):
    values = [1024 + 128 * (i // 2) for i in range(20)]  # +128 MiB every second step
    (f,) = found(report_of(tmp_path, memory_trace(values)), "memory_growth")
    assert f.severity == "critical" and f.evidence["growth_bytes_per_step"] == 64 * MiB


def test_a_noisy_leak_is_a_leak_and_noise_alone_is_not(tmp_path):
    rng = __import__("numpy").random.default_rng(3)
    noise = rng.uniform(-40, 40, 30)
    leak = [2048 + 16 * i + int(n) for i, n in enumerate(noise)]
    assert found(report_of(tmp_path, memory_trace(leak), "a.json"), "memory_growth")
    flat = [2048 + int(n) for n in noise]
    assert not found(report_of(tmp_path, memory_trace(flat), "b.json"), "memory_growth")


def test_launch_bound_cost_leaves_out_the_hosts_own_long_work(tmp_path):
    b = TraceBuilder()
    for s in range(5):
        t = s * 10_000
        b.step(s, t, 10_000).kernel(t, 4000, launch_at=t - 20)
        for i in range(100):  # 100 kernels of 2 us, one launched every 6 us: 4 us gaps
            b.kernel(t + 4010 + i * 6, 2, launch_at=t + 4005 + i * 6, launch_dur=3)
        # then ~5.4 ms of untraced Python before the next step
    (f,) = found(report_of(tmp_path, b), "launch_bound")
    # per step: 10 us before the first small kernel, then 99 gaps of 4 us; the 5.4 ms of Python is not launching
    assert f.evidence["gpu_idle_waiting_for_launches_us"] == pytest.approx(5 * (10 + 99 * 4), abs=1)


def test_a_device_without_work_in_the_window_is_not_called_idle(tmp_path):
    b = TraceBuilder()
    b.kernel(-500, 10, device=1)  # before the first step
    for s in range(3):
        b.step(s, s * 1000, 1000)
        for k in range(10):
            b.kernel(s * 1000 + k * 100, 90, launch_at=s * 1000 + k * 100 - 5)
    rep = report_of(tmp_path, b)
    devices = {d["device"]: d for d in rep.ranks[0]["gpu"]["devices"]}
    assert devices[1]["unused_in_window"] and devices[1]["idle_fraction"] is None
    assert rep.ranks[0]["gpu"]["idle_fraction"] == pytest.approx(0.1)
    assert not [f for f in rep.findings if f.id == "gpu_idle" and f.evidence["device"] == 1]


def test_copies_on_two_devices_are_measured_per_device(tmp_path):
    b = TraceBuilder().step(1, 0, 1000)
    b.memcpy(0, 100, host="Pageable", stream=7, device=0, call="cudaMemcpyAsync", call_at=-10)
    b.kernel(0, 100, stream=9, device=0)
    b.memcpy(0, 100, host="Pinned", stream=7, device=1, call="cudaMemcpyAsync", call_at=-8)
    h2d = report_of(tmp_path, b).ranks[0]["h2d"]
    assert h2d["time_us"] == 200 and h2d["overlap_fraction"] == 0.5 and h2d["pageable_fraction"] == 0.5
    assert h2d["fraction"] == pytest.approx(0.1)


def test_a_copy_straddling_the_window_counts_its_bytes_over_its_whole_length(tmp_path):
    b = TraceBuilder().step(1, 0, 1000)
    b.memcpy(900, 1000, host="Pinned", nbytes=1_000_000, call="cudaMemcpyAsync", call_at=890)
    h2d = report_of(tmp_path, b).ranks[0]["h2d"]
    assert h2d["time_us"] == 100 and h2d["bandwidth_gb_per_s"] == pytest.approx(1.0)


def test_zero_duration_collectives_are_not_evidence(tmp_path):
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2)
        for s in range(4):
            t = s * 1000
            b.step(s, t, 1000).kernel(t + 10, 500, name="gemm")
            b.kernel(t + 600 + (300 if rank else 0), 0 if rank else 300, stream=20, name=NCCL)
        b.write(tmp_path / "job" / f"rank-{rank}.json")
    rep = build_report(load_trace(tmp_path / "job"))
    # rank 1's all-reduces were recorded with no duration: only rank 0 has collectives left to match
    assert rep.job.get("collectives") is None and not found(rep, "straggler")


def test_a_tiny_copy_inside_its_async_call_says_nothing_about_host_memory(tmp_path):
    b = TraceBuilder().step(1, 0, 1000)
    for t in range(0, 1000, 100):
        b.raw({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Host -> Device)", "pid": 0, "tid": 7,
               "ts": t + 5, "dur": 4, "args": {"device": 0, "stream": 7, "correlation": 500 + t, "bytes": 4096}})
        b.runtime("hipMemcpyAsync", t, 12, 500 + t)
    rep = report_of(tmp_path, b)
    assert rep.ranks[0]["h2d"]["pageable_fraction"] is None and rep.ranks[0]["h2d"]["blocking_count"] == 0
    assert not found(rep, "h2d_pageable")


def test_a_900_us_cpu_op_launching_one_kernel_is_cpu_work(tmp_path):
    b = TraceBuilder().step(1, 0, 3000).kernel(0, 100, launch_at=-10)
    b.op("my_ext::preprocess", 200, 900)
    b.kernel(1110, 1890, launch_at=1090, launch_dur=5)  # launched at its end
    causes = report_of(tmp_path, b).ranks[0]["gpu"]["devices"][0]["idle_by_cause_us"]
    assert causes["host_compute"] == 900
