"""Thresholds, each with the reason for its value. Pass a changed copy, never mutate."""

from __future__ import annotations

from dataclasses import dataclass, fields

from kinetoscope.errors import ConfigError


@dataclass(frozen=True)
class AnalysisConfig:
    #: The retired TensorBoard profiler plugin flagged the DataLoader above 5% of step time.
    loader_fraction_warning: float = 0.05
    #: A quarter of the window waiting for data is the job's main bottleneck.
    loader_fraction_critical: float = 0.25
    #: A device idle a fifth of the window leaves large, recoverable throughput (HTA shows the same split).
    gpu_idle_warning: float = 0.20
    #: Idle for half the window: the GPU is the minority of the step.
    gpu_idle_critical: float = 0.50
    #: Gaps shorter than this are launch latency, not stalls (a kernel launch costs ~5-10 us).
    min_gap_us: float = 50.0
    #: How many of the largest gaps to list per device.
    top_gaps: int = 10
    #: Sync calls costing 5% of the window are worth removing (Nsight's expert rules flag any sync API).
    sync_idle_fraction: float = 0.05
    #: Pageable H2D copies are staged through a bounce buffer and block the host (Nsight flags them all);
    #: below 1% of the window the fix is not worth the pinned memory.
    pageable_min_fraction: float = 0.01
    #: Copies hidden behind compute for less than half their time are on the critical path ...
    overlap_min_fraction: float = 0.50
    #: ... when they add up to at least 5% of the window.
    copy_min_fraction: float = 0.05
    #: Kernels shorter than this cost about as much to launch as to run.
    short_kernel_us: float = 20.0
    #: Launch-bound: at least this share of kernels is short ...
    short_kernel_share: float = 0.50
    #: ... and host-side launching explains at least this share of device idle time.
    launch_idle_share: float = 0.50
    #: Growth below 1 MiB/step is allocator noise in practice.
    memory_growth_min_bytes_per_step: float = 1024 * 1024
    #: A steady leak: the linear fit explains >= 90% of the variance ...
    memory_growth_min_r2: float = 0.90
    #: ... and at least 75% of step-to-step changes are increases.
    memory_growth_min_rising_share: float = 0.75
    #: At least this many step ends to fit a slope at all.
    memory_min_steps: int = 3
    #: Out of memory projected within this many steps turns a growth warning critical.
    memory_critical_steps_to_oom: int = 10_000
    #: Straggler: the spread of collective time across ranks exceeds 10% of the mean step.
    straggler_min_spread_fraction: float = 0.10

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0:
                raise ConfigError(f"config {f.name} must be >= 0, got {value}")
            if f.name in _FRACTIONS and value > 1:
                raise ConfigError(f"config {f.name} is a fraction and must be <= 1, got {value}")


_FRACTIONS = frozenset({
    "loader_fraction_warning", "loader_fraction_critical", "gpu_idle_warning", "gpu_idle_critical",
    "sync_idle_fraction", "pageable_min_fraction", "overlap_min_fraction", "copy_min_fraction",
    "short_kernel_share", "launch_idle_share", "memory_growth_min_r2", "memory_growth_min_rising_share",
    "straggler_min_spread_fraction",
})


DEFAULT_CONFIG = AnalysisConfig()
