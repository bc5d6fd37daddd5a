"""The capture contract: what a capture writes beside its traces, and what analysis reads back. One module for both
sides, so a renamed field is one change; light (msgspec and the standard library: a training job imports it).

A capture directory holds, per rank ``r``: ``rank-<r>.step-<a>-<b>.pt.trace.json.gz`` (one per profiled window),
``rank-<r>.manifest.json`` (``Manifest``: who ran, how, which windows, the host's and the DataLoader's facts, the
loop marks' totals) and ``rank-<r>.steps.json`` (``StepTimes``: every step's timings, profiled or not).

Readers decode only the part they need (``ManifestWindows``, ``ManifestFacts``): a manifest whose one part is odd
(an older version, a field of another type) still gives the others.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

#: 2: the loop marks (``loop`` and the per-step lists of ``StepTimes``)
MANIFEST_VERSION = 2


def manifest_name(rank: int) -> str:
    return f"rank-{rank}.manifest.json"


def step_times_name(rank: int) -> str:
    return f"rank-{rank}.steps.json"


class Window(msgspec.Struct, kw_only=True):
    """One profiled window's trace; ``cut_short`` where the process ended inside it (its last step never ended)."""

    trace: str
    first_step: int | None = None
    last_step: int
    cut_short: bool = False
    #: what ended the process inside the window: "SIGTERM", an exception's name; None: the run ended
    ended_by: str | None = None


class Manifest(msgspec.Struct, kw_only=True):
    """``rank-<r>.manifest.json``, as the capture writes it (fields in the order written)."""

    manifest_version: int = MANIFEST_VERSION
    rank: int
    #: the host's facts: cpus (the process's), cpus_on_host, cores_effective (measured), torch_threads, ranks_on_host
    #: (the launcher's count of the job's ranks on this host; null: not said), thread_schedstat ("recorded" or null)
    #: and thread_schedstat_not_recorded (why not) (version 1 wrote the host's name here)
    host: Any = None
    pid: int
    argv: list[str]
    #: python, torch, cuda, hip, cuda_available, kinetoscope
    versions: dict[str, Any]
    world_size: Any = None
    local_rank: Any = None
    rank_source: Any = None
    schedule: dict[str, Any]
    options: dict[str, Any]
    steps_run: int
    traces: list[str]
    windows: list[Window] = []
    ended_by: str | None = None
    step_times: str | None = None
    #: the training DataLoader's configuration
    dataloader: Any = None
    #: the loop marks' run totals: ``marks`` (their contract version), ``recorded`` (the kinds recorded), ...
    loop: Any = None

    def to_json(self) -> bytes:
        """The file's bytes: indented JSON, as captures have always written it."""
        return json.dumps(msgspec.to_builtins(self, enc_hook=str), indent=2, default=str).encode()


class StepTimes(msgspec.Struct, kw_only=True):
    """``rank-<r>.steps.json``: every step's timings (ns), one entry per step of the run."""

    rank: Any = None
    unit: Any = "ns"
    step_wall_ns: list[int]
    data_wait_ns: list[int]
    #: CPU times; captures before they were recorded lack them
    step_cpu_ns: list[int] = []
    data_wait_cpu_ns: list[int] = []
    workers_cpu_ns: list[int | None] = []
    #: the training thread's own CPU time inside each step's data waits (taking batches over: unpickling, collating,
    #: copying out of shared memory), apart from the process's (which counts a pin-memory thread's too); captures
    #: before it lack the key
    data_wait_thread_cpu_ns: list[int] | None | msgspec.UnsetType = msgspec.UNSET
    #: the training thread's scheduler statistics per step (Linux ``/proc/thread-self/schedstat``): its time on a
    #: CPU, and its time runnable on a run queue with no CPU; the process's involuntary context switches per step
    #: (every thread). null: not recorded (not Linux, no scheduler statistics); an entry is null where that step's
    #: read failed. Captures before them lack the keys (UNSET: read as not recorded, and written back without them)
    oncpu_ns: list[int | None] | None | msgspec.UnsetType = msgspec.UNSET
    runqueue_wait_ns: list[int | None] | None | msgspec.UnsetType = msgspec.UNSET
    involuntary_switches: list[int | None] | None | msgspec.UnsetType = msgspec.UNSET
    profiled: list[bool] = []
    #: per step, the nanoseconds of its wall in which the capture itself was busy writing a trace (the export on the
    #: training thread, its gzip on the writer's thread: a union); captures before it lack the key
    capture_busy_ns: list[int | None] | None | msgspec.UnsetType = msgspec.UNSET
    # the loop marks' per-step lists (manifest_version 2); null: not recorded
    train_data_wait_ns: list[int] | None = None
    eval_data_wait_ns: list[int] | None = None
    validation_ns: list[int] | None = None
    compile_ns: list[int] | None = None
    checkpoint_ns: list[int] | None = None
    backward_calls: list[int] | None = None
    optimizer_steps: list[int] | None = None

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)


class ManifestWindows(msgspec.Struct):
    """What the loader reads of a manifest to tell a window cut short."""

    windows: list[Window] = []


class ManifestFacts(msgspec.Struct):
    """What the loader reads of a manifest for the analyses: the host's numbers, the DataLoader, the loop marks."""

    host: dict[str, Any] | None = None  # cpus, cores_effective (measured), torch_threads, ranks_on_host: numbers kept
    dataloader: dict[str, Any] | None = None  # scalars, and the hand-over probe's object: checked by the reader
    loop: Any = None  # the loop marks' run totals (manifest_version 2): checked by the reader
    world_size: Any = None  # the job's ranks, as the launcher said: checked by the reader
    steps_run: Any = None  # the steps the capture timed (``steps.json``'s length): checked by the reader
    ended_by: Any = None  # what ended the process early (an exception's name, a signal); null: the run ended
