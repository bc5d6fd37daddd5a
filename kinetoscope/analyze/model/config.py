"""Thresholds, each with the reason for its value. Pass a changed copy, never mutate."""

from __future__ import annotations

from dataclasses import dataclass, fields

from kinetoscope.errors import ConfigError


@dataclass(frozen=True)
class AnalysisConfig:
    #: The severity policy (``policy.judge``): a time cost worth less than 3% of the run is information - within
    #: the run-to-run noise of most training jobs (steps of real jobs vary 1-5% between identical runs) and
    #: rarely worth a change of code ...
    severity_warning_min_worth: float = 0.03
    #: ... and one worth a quarter of the run or more is the job's main bottleneck: critical.
    severity_critical_min_worth: float = 0.25
    #: An estimate that is an upper bound (DataLoader workers assumed to cost the training nothing, on a host whose
    #: cores the trace does not record) counts for half of itself: on the public V100 ResNet-50 pairs such an
    #: estimate was 1.7x the measured gain (34% predicted, 20% measured: the workers slowed the host's own work by
    #: 25-30% through shared memory bandwidth; BENCHMARKS.md, what-if pairs).
    upper_bound_credit: float = 0.5
    # The thresholds below decide whether a finding is raised at all (worth mentioning); how severe it is follows
    # what fixing it is worth (the severity policy above).
    #: The retired TensorBoard profiler plugin flagged the DataLoader above 5% of step time.
    loader_min_fraction: float = 0.05
    #: A device idle less than this share of the window is busy enough that no fix of its idle is worth a change
    #: (the TensorBoard plugin's 5% bar for the DataLoader, applied to the GPU).
    gpu_idle_min_fraction: float = 0.05
    #: Gaps shorter than this are launch latency, not stalls (a kernel launch costs ~5-10 us).
    min_gap_us: float = 50.0
    #: How many of the largest gaps to list per device.
    top_gaps: int = 10
    #: Sync calls costing the GPU 5% of the window are worth removing (Nsight's expert rules flag any sync API).
    sync_idle_fraction: float = 0.05
    #: A sync drains the launch queue: the idle right after it returns counts as its cost, up to this long.
    #: Longer gaps are the host's own work (data, Python), which would have drained a realistic queue too.
    sync_refill_max_us: float = 1000.0
    #: Pageable H2D copies are staged through a bounce buffer and block the host (Nsight flags them all);
    #: below 1% of the window the fix is not worth the pinned memory.
    pageable_min_fraction: float = 0.01
    #: Copies hidden behind compute for less than half their time are on the critical path ...
    overlap_min_fraction: float = 0.50
    #: ... when they add up to at least 5% of the window.
    copy_min_fraction: float = 0.05
    #: Collectives not overlapped with compute for this share of the window are worth looking at (the same bar as
    #: the DataLoader's and the GPU's idle).
    exposed_comm_min_fraction: float = 0.05
    #: FSDP's sharding is a fix the trace can price away (replicate: DDP) only where the job's whole state fits each
    #: rank unsharded with room: the peak memory the trace records, times the job's ranks, at most this share of the
    #: rank's share of the host's memory (activations and the allocator's slack take the rest; a quarter leaves the
    #: state room to grow 4x before replication would not fit).
    replicate_max_memory_share: float = 0.25
    #: A pipeline stage waiting for its neighbours this share of its mean step is worth looking at (the bar of the
    #: other waits). GPipe and 1F1B leave (p - 1) / (m + p - 1) of the schedule idle: 4 stages need 57 microbatches
    #: to bring it under 5%.
    pipeline_bubble_min_fraction: float = 0.05
    #: Device mallocs and frees through the runtime holding the host this share of the window (the caching
    #: allocator makes them rare after warm-up) are worth looking at.
    allocator_min_fraction: float = 0.05
    #: A process given less than three quarters of a core while its training thread has work (not waiting for data,
    #: the device or other ranks) is competing for the host's CPUs: a runnable thread gets a whole core on a host with
    #: room, so a quarter of its time went to others ...
    host_min_core_share: float = 0.75
    #: ... when the busy time it ran without a core adds up to this share of the window.
    host_min_lost_fraction: float = 0.05
    #: Where the capture measured the training thread's run-queue wait (time runnable with no CPU), a wait of this
    #: share of the window's steps is raised: the severity policy's warning bar, because the wait is the time lost
    #: itself, measured, not an inference that needs a margin (a thread alone on an idle core waits ~0; on the
    #: 2-core machine loaded by other sessions, 20-50% of its steps: BENCHMARKS.md).
    host_runqueue_min_fraction: float = 0.03
    #: A step this many times the window's median step is not like the others (a validation pass, a checkpoint,
    #: a compilation): said, with what it holds ...
    outlier_step_ratio: float = 3.0
    #: ... among at least this many steps (with fewer, the median is no baseline).
    outlier_min_steps: int = 4
    #: Validation or checkpoints taking this share of the run (the capture's step timings) are said, with how often
    #: and how long.
    periodic_min_fraction: float = 0.05
    #: Kernels shorter than this cost about as much to launch as to run.
    short_kernel_us: float = 20.0
    #: A kernel starting less than this after its launch call returned found the GPU's queue empty
    #: (launch latency is a few us on NVIDIA, ~10 us on AMD; a queued kernel waits for the work ahead of it).
    launch_queue_empty_us: float = 15.0
    #: Launch-bound: at least this share of kernels finds the queue empty ...
    launch_queue_empty_share: float = 0.50
    #: ... and host-side launching (traced or not) explains at least this share of device idle time ...
    launch_idle_share: float = 0.50
    #: ... over at least this many kernels (a handful of launches says nothing about a loop). Its cost counts
    #: the gaps before such kernels up to this many launch intervals long (longer: the host's own work).
    launch_bound_min_kernels: int = 50
    launch_gap_max_intervals: float = 5.0
    #: GPU activity unknown (unrecorded graph replays, stream capture) for more than this share of the
    #: window: idle time is not reported at all rather than reported wrong.
    missing_activity_max_fraction: float = 0.05
    #: Start-up (CUDA context creation, lazy module loading: runtime calls >= 1 ms on an idle GPU) over this
    #: share of the window: the window is not steady state, and GPU-timeline findings are only information.
    startup_max_fraction: float = 0.20
    #: Fewer GPU operations than this in the window say nothing about a training loop's GPU use.
    gpu_min_ops: int = 20
    #: Growth below 1 MiB/step is allocator noise in practice.
    memory_growth_min_bytes_per_step: float = 1024 * 1024
    #: A leak keeps growing: the robust slope over the later half of the steps is at least this share of
    #: the whole (a warm-up that levels off - +100 MiB, +50 MiB, flat - fails it) ...
    memory_growth_min_persistence: float = 0.5
    #: ... and it rises too consistently to be noise: the Mann-Kendall trend test's z >= 2.33 (p < 0.01,
    #: one-sided). A leak landing every other step, in chunks or under noise passes; 5 step ends pass only if
    #: each one is higher than the last.
    memory_growth_min_trend_z: float = 2.33
    #: A leak is judged against the device's memory over a long run: growth that would take a tenth of the device
    #: over 100,000 steps (a few days of training) is a leak however small per step, and one that leaves the device
    #: room for more than 100,000 steps is information, not a warning.
    memory_leak_horizon_steps: int = 100_000
    memory_leak_device_share: float = 0.1
    #: Fewer step ends than this cannot tell a leak from warm-up (3 points fit any curve's start).
    memory_min_steps: int = 5
    #: Out of memory projected within this many steps turns a growth warning critical ...
    memory_critical_steps_to_oom: int = 10_000
    #: ... when the projection rests on at least this many steps.
    memory_critical_min_steps: int = 10
    #: CPU memory growth cannot be told from frees the profiler did not record (blocks allocated again at an address
    #: the trace still held live, freed on gloo's or a pin-memory thread) where those come to this share of it or
    #: more: DDP's fp16 buckets freed on gloo's threads, 0.92 MiB a step shown against 1.27 MiB of growth (info);
    #: one 4 KiB block beside a 16 MiB-a-step leak stays the leak.
    memory_unrecorded_free_share: float = 0.5
    #: Reserved memory growing while allocated grows less than this share of it is the allocator's own growth.
    reserved_growth_max_allocated_share: float = 0.25
    #: Straggler: the others' wait for the last-arriving rank exceeds 10% of the mean step ...
    straggler_min_spread_fraction: float = 0.10
    #: ... and that rank is the last to arrive in at least half of the matched collectives (a straggler is
    #: consistently late; lateness that moves from rank to rank is noise).
    straggler_min_last_share: float = 0.5
    #: ... and, to be claimed, it is the last at least this many times as often as each other rank of its group on
    #: average (and in half the collectives, the floor above: of 3 ranks or more that floor is the bar), whatever
    #: seems to explain it: in a 2-rank group, in two of three collectives. A rank last in 60% of
    #: 80 collectives on a loaded 2-CPU host, slower in compute by 13% on the same work, is lateness that moves
    #: between ranks (two readers: no straggler); one last in 15 of 19, or 15 of 20, is the straggler, explained or
    #: not (readers: warning; an unexplained one is worth its whole wait as an upper bound). Was 80% where no part of
    #: its step explained it, and no bar where one did.
    straggler_claim_min_odds: float = 2.0
    #: ... and, whatever explains it, it is last more often than chance among its group's ranks would make it: the
    #: chance of arriving last that often in that many collectives, were every rank as likely to, is under this (a
    #: 2-rank job whose rank 0 was last in 19 of 30 collectives, late before an epoch's end and early after it, is
    #: 10% likely by chance: lateness that moves, not a straggler; 7 of 8 is 3.5%, 18 of 20 0.02%). The usual 5%:
    #: 1% left a real straggler of a short window (7 of 8 collectives, two readers: warning) unclaimed.
    straggler_chance_max: float = 0.05
    #: Straggler by data: a rank whose run holds at least this many more steps than another's (uneven shards under
    #: DDP's Join: a 2-rank job with 40 and 52 batches ran rank 1's last 12 alone, 20% of its run; two readers and
    #: their consensus: a warning); one step more (a last partial batch) is left to the collectives' reading.
    uneven_steps_min_extra: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0:
                raise ConfigError(f"config {f.name} must be >= 0, got {value}")
            if f.name in _FRACTIONS and value > 1:
                raise ConfigError(f"config {f.name} is a fraction and must be <= 1, got {value}")


_FRACTIONS = frozenset(
    {
        "severity_warning_min_worth",
        "severity_critical_min_worth",
        "upper_bound_credit",
        "loader_min_fraction",
        "gpu_idle_min_fraction",
        "sync_idle_fraction",
        "launch_queue_empty_share",
        "missing_activity_max_fraction",
        "startup_max_fraction",
        "pageable_min_fraction",
        "overlap_min_fraction",
        "copy_min_fraction",
        "exposed_comm_min_fraction",
        "replicate_max_memory_share",
        "pipeline_bubble_min_fraction",
        "memory_leak_device_share",
        "allocator_min_fraction",
        "host_min_core_share",
        "host_min_lost_fraction",
        "host_runqueue_min_fraction",
        "periodic_min_fraction",
        "launch_idle_share",
        "memory_growth_min_persistence",
        "reserved_growth_max_allocated_share",
        "memory_unrecorded_free_share",
        "straggler_min_spread_fraction",
        "straggler_min_last_share",
        "straggler_chance_max",
    }
)


DEFAULT_CONFIG = AnalysisConfig()
