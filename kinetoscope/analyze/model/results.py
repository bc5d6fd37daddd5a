"""Each analyzer's typed result: the records it returns, one JSON object each (``docs/report.md`` says what they mean).

A rank analyzer's result record (``StepsResult``, ``LoaderResult``, ...) has one field per key it adds to the rank's
report entry; a job analyzer's record is the object the job entry holds under its key. Field order is the order the
report writes the keys in; a field left ``UNSET`` is a key written only in some cases. Times are in us, sizes in
bytes, fractions in [0, 1] of what the neighbouring ``*_of`` field names.

The records live in the model (not beside their analyzers) so that the report, the renderers and the app read them
without importing an analyzer.
"""

from __future__ import annotations

from typing import Any

from kinetoscope.analyze.model.record import UNSET, Record, UnsetType

# --- steps: the window and the profiler steps ------------------------------------------------------------------


class Window(Record, frozen=True):
    """The analysis window every fraction of a rank refers to."""

    start_us: float | None
    end_us: float | None
    #: how it was chosen ("profiler_steps", "inferred_steps", "whole_trace", ...)
    basis: str
    description: str


class Steps(Record, frozen=True):
    #: complete steps (a step cut short is counted apart, in ``partial``)
    count: int
    mean_us: float | None
    min_us: float | None
    max_us: float | None
    first: int | None
    last: int | None
    #: steps cut short by the run's end (a crash, a stop), left out of the others
    partial: int


class StepsResult(Record, frozen=True):
    window_us: float | None
    window: Window
    steps: Steps


# --- phases: the step's anatomy --------------------------------------------------------------------------------


class PhaseTime(Record, frozen=True):
    #: host time in the phase, and its share of the window
    time_us: float | None
    fraction: float | None
    #: GPU work launched from the phase, and its share of the window; None without GPU activity
    gpu_time_us: float | None
    gpu_fraction: float | None


class PhasesResult(Record, frozen=True):
    #: by phase name (``model.phases.PHASES``)
    phases: dict[str, PhaseTime]
    #: each step: ``{"step": n, <phase>: us, ...}``
    phases_per_step_us: list[dict[str, Any]]


# --- loader ----------------------------------------------------------------------------------------------------


class LoaderRun(Record, frozen=True):
    """Data wait over every step of the run, from the capture's host clocks."""

    steps: int
    wall_us: float | None
    data_wait_us: float | None
    data_wait_fraction: float | None
    data_wait_of: str
    validation_us: float | None
    validation_fraction: float | None
    eval_data_wait_us: float | None
    fraction_of: str
    mean_step_us: float | None
    #: the waits of every batch but the first after each worker start (those wait for the workers to come up:
    #: worker start-up, judged by worker_respawn), what a loader fix acts on; None where not recorded
    recurring_wait_us: float | None = None
    recurring_wait_fraction: float | None = None
    recurring_wait_of: str | None = None


class Loader(Record, frozen=True):
    time_us: float | None
    fraction: float | None
    fraction_of: str
    calls: int
    gpu_idle_cost_us: float | None
    gpu_idle_cost_fraction: float | None
    iterator: list[str]
    thread: Any
    other_threads_us: float | None
    other_threads_calls: int
    eval_loader_wait_us: float | None
    max_step_us: float | None
    run: LoaderRun | None
    #: how the evaluation waits were told apart: "capture marks", "inferred" (waits in steps running no backward
    #: pass and no optimizer step among steps that do), None where none were
    eval_loader_wait_basis: str | None = None


class LoaderResult(Record, frozen=True):
    loader: Loader


# --- gpu -------------------------------------------------------------------------------------------------------


class GpuDevice(Record, frozen=True):
    device: Any
    busy_us: float | None
    #: None where the trace misses the GPU's activity (idle not judged)
    idle_us: float | None
    idle_fraction: float | None
    idle_by_cause_us: dict[str, float | None] | None
    largest_gaps: list[dict[str, Any]]
    unused_in_window: bool


class GpuStream(Record, frozen=True):
    """One stream's row (``analyzers.gpu._stream_table``)."""

    device: Any
    stream: Any
    kernels: int
    copies: int
    memsets: int
    busy_us: float
    idle_us: float
    idle_fraction: float
    largest_gap_us: float


class CapturedLaunch(Record, frozen=True):
    """One launch a captured graph holds, as the capture recorded it (the kernel itself never ran there, so no GPU
    event names it or times it; ``op`` is the host op that made the call, ``None``: none recorded)."""

    call: str
    op: str | None
    #: the kernel it launches and its grid as written, where the call's args name them (roctracer's do)
    kernel: str | None
    grid: str | None


class CapturedGraphReplays(Record, frozen=True):
    """A captured graph that replays with unrecorded kernels were matched to (``analyze.model.graphs``)."""

    #: "this trace", or the capture trace's file name
    source: str
    capture: int
    batch_size: int | None
    launches: int
    #: the first ``GRAPH_LAUNCHES_LISTED`` launches, in capture order
    launch_list: list[CapturedLaunch]
    replays: int
    #: of which the GPU timeline is judged (their span is bounded: see ``graph_replay_span_us``)
    replays_judged: int
    #: how the replays were matched to it ("only_capture", "identical_captures", "batch_size")
    matched_by: list[str]
    confidence: str | None
    #: replays in the trace whose recorded kernels are this graph's (by name and count, where the capture names its
    #: kernels), and the median GPU busy time of one of them (union of its work): what the unrecorded ones likely
    #: cost the GPU inside their span; ``None``: no such replay
    recorded_replays_alike: int
    recorded_replay_busy_us: float | None


class MissingActivity(Record, frozen=True):
    graph_launches: int
    graph_launches_unrecorded: int
    #: unrecorded replays judged from a capture: their graph is known and their span bounded; the rest stay unknown
    graph_launches_from_capture: int
    #: time (union over devices) from those replays' launches to the next recorded work on their stream or the next
    #: device-wide sync, whichever is first: the GPU ran the captured graph there (an upper bound on its time), so it
    #: is neither idle nor unknown; ``None`` when no replay was judged
    graph_replay_span_us: float | None
    #: the captured graphs that unrecorded replays were matched to
    captured_graphs: list[CapturedGraphReplays]
    #: unrecorded replays not judged from a capture (no capture matched, or the span not bounded), by reason
    graph_launches_not_judged: dict[str, int]
    stream_capture_us: float | None
    queued_behind_unrecorded_work_us: float | None
    cut_from_trace_us: float | None
    unknown_us: float | None
    unknown_fraction: float | None
    unknown_fraction_of: str


class Gpu(Record, frozen=True):
    idle_fraction: float | None
    fraction_of: str
    any_device_idle_us: float | None
    activity_complete: bool
    missing_activity: MissingActivity
    startup_us: float | None
    startup_fraction: float | None
    startup_fraction_of: str
    judgement: Any
    devices: list[GpuDevice]
    streams: list[GpuStream]


class GpuResult(Record, frozen=True):
    #: None: no GPU activity in the trace
    gpu: Gpu | None


# --- copies ----------------------------------------------------------------------------------------------------


class CopyHostMemory(Record, frozen=True):
    pageable: float | None
    pinned: float | None
    unknown_but_blocking: float | None
    unknown: float | None


class CopyDevice(Record, frozen=True):
    device: Any
    time_us: float | None
    fraction: float | None
    overlap_fraction: float | None
    bytes: int


class Copies(Record, frozen=True):
    """One direction's copies (H2D or D2H)."""

    count: int
    time_us: float | None
    time_of: str
    fraction: float | None
    fraction_of: str
    bytes: int
    bandwidth_gb_per_s: float | None
    overlap_fraction: float | None
    overlap_fraction_of: str
    pageable_fraction: float | None
    pageable_fraction_of: str
    host_memory_us: CopyHostMemory
    pageable_count: int
    pinned_count: int
    unknown_count: int
    synchronous_count: int
    blocking_count: int
    devices: list[CopyDevice]


class CopiesResult(Record, frozen=True):
    h2d: Copies | None
    d2h: Copies | None


# --- telemetry -------------------------------------------------------------------------------------------------


class Series(Record, frozen=True):
    mean: float
    min: float
    max: float
    samples: int


class TelemetryResult(Record, frozen=True):
    #: by track, then series; None: the trace has no counters
    telemetry: dict[str, dict[str, Series]] | None


# --- comm ------------------------------------------------------------------------------------------------------


class OpTime(Record, frozen=True):
    count: int
    time_us: float | None


class Comm(Record, frozen=True, kw_only=True):
    collectives: int
    time_us: float | None
    fraction: float | None
    fraction_of: str
    #: None where not judged (the trace misses part of the GPU's activity, or no compute was traced)
    overlap_fraction: float | None
    overlap_fraction_of: str
    exposed_us: float | None
    exposed_by_op_us: dict[str, float | None] | None
    #: collective time the trace cannot see the GPU around (collective kernels only)
    unknown_us: float | None | UnsetType = UNSET
    by_op: dict[str, OpTime]
    #: "gpu" (collective kernels), or "host (...)" with why
    where: str


class CommResult(Record, frozen=True):
    comm: Comm | None


# --- memory ----------------------------------------------------------------------------------------------------


class MemoryDevice(Record, frozen=True):
    device: str
    basis: str
    events: int
    peak_allocated_bytes: int
    peak_us: float | None
    peak_step: int
    peak_op: Any
    peak_reserved_bytes: int | None
    growth_bytes_per_step: float | None
    growth_method: str
    late_growth_bytes_per_step: float | None
    growth_r2: float | None
    rising_step_share: float | None
    growth_tau: float | None
    growth_trend_z: float | None
    steady_growth: bool
    reserved_growth_bytes_per_step: float | None
    steady_reserved_growth: bool
    fragmentation_bytes_max: int | None
    steps_fitted: int
    #: CPU only: blocks allocated again in the window at an address the trace still held live, and the bytes of the
    #: blocks so freed unseen: their frees ran on a thread the profiler does not record (the CPU allocator's total
    #: the trace reports never comes down for them); None: a GPU device, or no addresses
    unrecorded_frees: int | None = None
    unrecorded_free_bytes: int | None = None
    #: CPU only: blocks of those blocks' thread and size allocated in the window with no free recorded by the trace's
    #: end, and their bytes (most likely freed unseen too); None as above
    unrecorded_like_live_blocks: int | None = None
    unrecorded_like_live_bytes: int | None = None


class Memory(Record, frozen=True):
    growth_bytes_per_step: float | None
    peak_allocated_bytes: int
    #: "gpu" (the GPU devices' figures) or "cpu"
    scope: str
    devices: list[MemoryDevice]


class MemoryResult(Record, frozen=True):
    memory: Memory | None


# --- coverage --------------------------------------------------------------------------------------------------


class Coverage(Record, frozen=True):
    #: events of categories no analysis reads, by category; None: none
    unread_events: dict[str, int] | None
    accelerators_unread: list[str] | None


class CoverageResult(Record, frozen=True):
    coverage: Coverage


# --- hygiene ---------------------------------------------------------------------------------------------------


class Hygiene(Record, frozen=True):
    #: training steps judged (a step cut short, or the profiler's empty stub, left out)
    steps: int
    backward_steps: int
    optimizer_steps: int
    zero_grad_steps: int
    #: the finding ids this analyzer checks
    checks: list[str]


class HygieneResult(Record, frozen=True):
    #: None: no steps to judge the loop by
    hygiene: Hygiene | None


# --- allocator -------------------------------------------------------------------------------------------------


class Allocator(Record, frozen=True):
    calls: int
    time_us: float | None
    fraction: float | None
    fraction_of: str
    steps_with_calls: int
    steps: int
    by_name: dict[str, OpTime]


class AllocatorResult(Record, frozen=True):
    allocator: Allocator | None


# --- host ------------------------------------------------------------------------------------------------------


class HostMeasured(Record, frozen=True, kw_only=True):
    """The training thread's run-queue wait, as the kernel counted it (captures with scheduler statistics)."""

    measured: bool = True
    steps: int
    runqueue_wait_us_per_step: float | None
    runqueue_wait_fraction_of_steps: float
    runqueue_wait_fraction_of_steps_of: str
    oncpu_us_per_step: float | None
    cpus: Any
    torch_threads: Any
    num_workers: int | None
    #: the job's ranks on this host, as the launcher said (None: not said; 1 for a job of one process)
    ranks_on_host: int | None = None
    #: the threads the job sizes on this host: its ranks' torch threads and DataLoader workers (None: one not
    #: recorded), and whether they fit its CPUs (then what competes is threads the job does not size)
    job_threads_on_host: int | None = None
    job_threads_fit_cpus: bool | None = None


class HostInferred(Record, frozen=True, kw_only=True):
    """The process's CPU time against the time its training thread had work (no scheduler statistics)."""

    measured: bool = False
    steps: int
    cores_while_busy: float
    cores_while_busy_of: str
    cores_while_in_operators: float
    busy_us_per_step: float | None
    in_operators_us_per_step: float | None
    cpu_us_per_step: float | None
    cpus: Any
    torch_threads: Any
    num_workers: int | None
    #: the job's ranks on this host, as the launcher said (None: not said; 1 for a job of one process)
    ranks_on_host: int | None = None
    #: the threads the job sizes on this host: its ranks' torch threads and DataLoader workers (None: one not
    #: recorded), and whether they fit its CPUs (then what competes is threads the job does not size)
    job_threads_on_host: int | None = None
    job_threads_fit_cpus: bool | None = None


class HostResult(Record, frozen=True):
    #: None: the capture recorded no CPU time (nor run-queue wait) per step
    host: HostMeasured | HostInferred | None


# --- outliers --------------------------------------------------------------------------------------------------


class Outliers(Record, frozen=True, kw_only=True):
    """Steps unlike the others; only ``run`` where the window has too few steps to tell."""

    median_step_us: float | None | UnsetType = UNSET
    steps: int | UnsetType = UNSET
    outlier_steps: int | UnsetType = UNSET
    ratio: float | UnsetType = UNSET
    #: validation and checkpoints over the whole run, by kind; None where the capture did not record them
    run: dict[str, dict[str, Any]] | None
    #: where there are outliers: their time beyond the median step, and what they hold
    excess_us: float | None | UnsetType = UNSET
    holds: list[str] | UnsetType = UNSET


class OutliersResult(Record, frozen=True):
    outliers: Outliers | None


# --- efficiency: matrix work against the device's peak -------------------------------------------------------------


class KernelEfficiency(Record, frozen=True):
    """One kernel name's work in the window (the kernels of counted ops)."""

    name: str
    kind: str  # "matrix" | "memory"
    calls: int
    time_us: float
    flops: float | None
    bytes: float | None
    achieved_tflops: float | None
    peak_tflops: float | None
    #: the peak-table dtype ``peak_tflops`` is of (fp32 inputs: tf32 where the device has it)
    peak_dtype: str | None
    achieved_gbps: float | None
    peak_gbps: float | None
    #: achieved TFLOP/s over peak (matrix kernels); above 1 is an attribution bug (an invariant violation)
    of_peak_fraction: float | None
    #: achieved GB/s over peak bandwidth (memory kernels): an estimate, as the bytes are (cache hits and broadcast
    #: inputs move fewer bytes than the shapes say), so it may pass 1
    bandwidth_of_peak: float | None


class OperatorEfficiency(Record, frozen=True):
    """One operator name's work in the window."""

    name: str
    kind: str
    calls: int
    #: calls whose shapes did not tell their work (``why`` says why for the first)
    calls_unknown: int
    why_unknown: str | None
    input_type: str | None
    flops: float | None
    bytes: float | None
    #: the GPU time of the kernels its calls launched
    kernel_time_us: float
    achieved_tflops: float | None
    peak_tflops: float | None
    peak_dtype: str | None
    achieved_gbps: float | None
    peak_gbps: float | None
    #: FLOPs per byte; None where either is unknown
    arithmetic_intensity: float | None
    #: "compute" or "memory" bound against the device's ridge point (peak FLOP/s over peak bytes/s); None: unknown
    roofline: str | None
    of_peak_fraction: float | None
    bandwidth_of_peak: float | None
    #: matrix ops: kernel time less what it would take at peak, time x (1 - of peak); None otherwise
    lost_us: float | None


class Efficiency(Record, frozen=True):
    """A rank's ``efficiency`` entry (docs/report.md)."""

    device: str | None
    #: where the peaks come from; None: the device is not in the table (``device`` says what the trace names)
    peak_source: str | None
    #: the peak MFU is measured against, and its dtype (that of most of the matrix FLOPs)
    peak_tflops: float | None
    peak_dtype: str | None
    #: matrix-op FLOPs (FlopCounterMode's count) per mean complete step; None without steps or without shapes
    flops_per_step: float | None
    steps: int
    mean_step_us: float | None
    #: model FLOPs utilisation: flops_per_step / (mean step x peak); None where either is unknown
    mfu: float | None
    #: matrix-op FLOPs in the window, and the counted matrix ops whose shapes did not tell theirs
    matrix_flops: float | None
    matrix_ops: int
    matrix_ops_unknown: int
    shapes_recorded: bool
    #: matrix kernels' time in the window, the share of it whose ops' FLOPs and peak are known (judged), and the
    #: judged kernels' time-weighted share of peak
    matrix_kernel_time_us: float
    judged_kernel_time_fraction: float | None
    matrix_of_peak_fraction: float | None
    window: str
    kernels: list[KernelEfficiency]
    operators: list[OperatorEfficiency]


class EfficiencyResult(Record, frozen=True):
    efficiency: Efficiency


# --- compiled: torch.compile's regions, Triton kernels, recompiled frames ------------------------------------------


class CompiledRegion(Record, frozen=True):
    """One compiled region (``frame/compile_id``, or ``backward``) in the window."""

    region: str
    #: None where the region's name does not tell them (the backward)
    frame: int | None
    compile_id: int | None
    entries: int
    host_us: float | None
    #: None without GPU activity in the trace
    gpu_us: float | None
    kernels: int


class TritonKernel(Record, frozen=True):
    """One Triton kernel name Inductor generated, in the window."""

    name: str
    #: "pointwise", "reduction", "persistent reduction", "template", "foreach" (``model.compiled.TRITON_KINDS``)
    kind: str
    #: the ops fused into it, as its name says
    fused: str
    count: int
    time_us: float | None
    #: the compiled regions its kernels ran in
    regions: list[str]


class Compiled(Record, frozen=True):
    regions: list[CompiledRegion]
    regions_entered_per_step: float | None
    host_compiled_us: float | None
    host_compiled_fraction: float | None
    gpu_compiled_us: float | None
    gpu_eager_us: float | None
    gpu_compiled_fraction: float | None
    fraction_of: str
    triton_kernels: list[TritonKernel]
    triton_kernels_left_out: int
    #: frames compiled more than once: their compile ids, by frame
    recompiled_frames: dict[str, list[int]]


class CompiledResult(Record, frozen=True):
    #: None: no compiled region in the trace
    compiled: Compiled | None


# --- comm_roles: communication by what it serves (``whatif.commroles``, written after the replay) ------------------


class CommRole(Record, frozen=True):
    """One role's collectives in the window (``model.commroles.ROLES``)."""

    role: str
    collectives: int
    #: their operations; "unknown" for a collective whose operation nothing in the trace tells (a kernel whose name
    #: says none, without a ``Collective name`` and without a launch on record: launched before the recording began)
    ops: list[str]
    #: how many of them are such
    ops_unknown: int
    time_us: float | None
    #: the part no compute ran beside, and its share of the window; None where it cannot be told
    exposed_us: float | None
    exposed_fraction: float | None
    #: the replayed mean step less the same with the role's collective kernels taking no time; None: not replayed
    worth_us_per_step: float | None


class FsdpGathers(Record, frozen=True):
    """FSDP's all-gathers: how many were in flight at once, and how many queued behind the previous one."""

    allgathers: int
    issue_recorded: int
    max_in_flight: int | None
    queued_behind_previous: int
    queued_us: float | None


class BubbleStep(Record, frozen=True):
    """One complete step of a pipeline stage: its bubble, a union of intervals in the step's span."""

    step: int
    #: the step's span (its profiler step, host clock)
    step_us: float
    #: the time the stage waited for a neighbour (``PipelineStage.measure``); None where it cannot be told
    bubble_us: float | None
    #: of ``step_us``
    bubble_fraction: float | None
    #: the bubble's intervals, us from the step's start, in order (the first ``BUBBLE_INTERVALS_MAX``)
    intervals_us: list[list[float]]
    intervals_left_out: int


class PipelineStage(Record, frozen=True):
    """A rank as a pipeline stage (its send/recv to neighbours): who it exchanges with and its bubbles per step."""

    #: "gpu" (send/recv kernels against compute kernels) or "host" (the training thread's send/recv and waits)
    where: str
    #: the ranks this one exchanges with (the other member of each two-rank group of its send/recv), ascending
    peers: list[int]
    #: the rank its first activations come from (the peer of the recv that ends first in the step, where it ends
    #: before the first send starts), and the rank it sends them to (the peer of the first send to another rank
    #: than the upstream one); None where there is none (the first and last stage) or the trace cannot say
    upstream_rank: int | None
    downstream_rank: int | None
    #: send/recv in the window
    p2p_ops: int
    #: what the bubble is, in words
    measure: str
    #: what each step's span is
    window: str
    #: what ``bubble_fraction`` is a share of (a step's own ``bubble_fraction``: of that step)
    fraction_of: str
    steps: list[BubbleStep]
    #: the mean over the steps, and its share of the mean step
    bubble_us_per_step: float | None
    bubble_fraction: float | None
    #: the replayed mean step less the same with this stage's send/recv taking no time: what the stage gains if its
    #: neighbours never kept it waiting; None where the replay cannot say (``worth_of`` says why)
    worth_us_per_step: float | None
    worth_of: str
    #: why the bubble cannot be told; None where it can
    bubble_unknown: str | None


class CommRoles(Record, frozen=True):
    """A rank's ``comm_roles`` block."""

    #: "gpu" (collective kernels) or "host" (the host's gloo/nccl annotations)
    where: str
    fraction_of: str
    roles: list[CommRole]
    #: why the exposed time cannot be told; None where it can
    exposed_unknown: str | None
    #: what ``worth_us_per_step`` means; None where no role's worth is replayed
    worth_of: str | None
    #: None: no FSDP all-gather
    fsdp: FsdpGathers | None
    #: the rank as a pipeline stage; None: no send/recv
    pipeline: PipelineStage | None = None


# --- critical_path: each step's critical path and slack (``whatif.critpath``, written after the replay) ------------


class PathKind(Record, frozen=True):
    """The path's time in one kind of segment (``whatif.critpath.KINDS``), mean per window step."""

    kind: str
    dur_us: float
    #: of the mean window step
    step_fraction: float


class PathName(Record, frozen=True):
    """The path's time in one kind and name, mean per window step."""

    kind: str
    name: str
    dur_us: float
    step_fraction: float


class PathSegment(Record, frozen=True):
    """One stretch of the median step's path (consecutive segments of one kind and name merged)."""

    kind: str
    name: str
    #: from the step's start
    start_us: float
    dur_us: float
    #: of the median step's duration; None for a step of no duration
    step_fraction: float | None


class MedianStepPath(Record, frozen=True):
    #: the step's index among the window's steps
    index: int
    step_us: float
    segments: list[PathSegment]
    #: segments past ``whatif.critpath.LISTED_SEGMENTS``, and their time
    segments_left_out: int
    left_out_us: float
    #: None: no GPU op (or host point) any step end awaits
    gpu_slack_us: float | None
    host_slack_us: float | None


class CriticalPathSummary(Record, frozen=True):
    """A rank's ``critical_path`` block."""

    steps: int
    fraction_of: str
    mean_step_us: float
    by_kind: list[PathKind]
    names: list[PathName]
    names_left_out: int
    #: the median over steps of each step's slack; None where no step has one
    gpu_slack_us: float | None
    host_slack_us: float | None
    median_step: MedianStepPath


# --- job: collectives across ranks -----------------------------------------------------------------------------


class CollectiveRank(Record, frozen=True):
    rank: int
    clock_skew_us: float | None
    matched: int
    unmatched: int
    point_to_point: int
    wait_us: float | None
    waited_for_count: int
    waited_for_rank: int | None
    #: the part of ``wait_us`` in which the rank computes nothing (its exposed collective time); None where the trace
    #: cannot tell its exposure
    exposed_wait_us: float | None = None
    #: the other ranks' waits, summed, at the collectives this rank arrived last at
    waited_for_us: float | None = None


class CollectiveGroup(Record, frozen=True):
    group: Any
    ranks: Any
    method: str
    matched: int
    unmatched: Any
    misaligned_ranks: Any


class Collectives(Record, frozen=True):
    """The job's ``collectives`` object."""

    matched: int
    unmatched: int
    groups: list[CollectiveGroup]
    reference_rank: int | None
    #: the rank the others waited for the longest (``CollectiveRank.waited_for_us``; where nobody waited any time, the
    #: one last most often)
    most_waited_for_rank: int | None
    ranks: list[CollectiveRank]
    method: str
    #: waiting every rank does inside a step, summed over steps (``Arrivals.shared_wait_ns``): lateness moving between
    #: the ranks within a step, which overlap would hide; None where no two ranks' waits are known
    shared_wait_us: float | None = None
    #: the same of the ranks' ``exposed_wait_us``: exposed time that is lateness moving between ranks within a step
    shared_exposed_wait_us: float | None = None


# --- job: hang -------------------------------------------------------------------------------------------------


class Hang(Record, frozen=True, kw_only=True):
    """The job's ``hang`` object, from the ranks' hang dumps; the divergence's keys only where the dumps show one
    (or a rank that raised or stalled)."""

    dumps: int
    ranks_with_dump: list[int]
    ranks_without_dump: list[int]
    reasons: dict[str, str]
    process_group: Any | UnsetType = UNSET
    seq: int | None | UnsetType = UNSET
    expected_op: str | None | UnsetType = UNSET
    stuck_ranks: list[int] | UnsetType = UNSET
    missing_ranks: list[int] | UnsetType = UNSET
    mismatched_ranks: list[int] | UnsetType = UNSET
    waiting_ranks: list[int] | UnsetType = UNSET
