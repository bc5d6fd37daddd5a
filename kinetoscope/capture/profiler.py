"""Wrap a training loop in torch.profiler with scheduled windows, safely.

Two ways in::

    from kinetoscope.capture import profile_loop
    for x, y in profile_loop(loader, out_dir="traces"):
        ...                                   # one iteration = one step

    from kinetoscope.capture import Profiler
    with Profiler(out_dir="traces") as prof:
        for x, y in loader:
            ...
            prof.step()

Between profiled windows every step's wall time and the time spent waiting
for the data iterator are recorded with host clocks (no profiler), so a
report can say how loader-bound the *whole* run was. While it runs, the loop
recorder (``loop.py``) writes down what the loop does - DataLoader waits per
loader and their roles, eval stretches, backward calls, optimizer steps,
compilations, checkpoint saves - into the manifest's ``loop`` object, per-step
lists of ``steps.json``, and marks spliced into each window's trace.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from kinetoscope.capture import hooks
from kinetoscope.capture._safety import log, never_raises, warn_once
from kinetoscope.capture.cores import effective_cores
from kinetoscope.capture.dist import RankInfo, rank_info, ranks_on_host
from kinetoscope.capture.handover import not_measured, probe_handover
from kinetoscope.capture.hangwatch import DEFAULT_FR_ENTRIES, HangWatch, arm_flight_recorder
from kinetoscope.capture.hooks import is_data_loader_iterator
from kinetoscope.capture.hostmem import memory_facts
from kinetoscope.capture.loop import MARKS_VERSION, STEP_LISTS, STEP_SOURCE_WHY, LoopRecorder, WindowMarks
from kinetoscope.capture.output import (
    BusyClock,
    TraceWriter,
    base_time_ns,
    tidy_output_dir,
    trace_name,
    versions,
    warm_redaction,
    write_manifest,
    write_step_times,
)
from kinetoscope.capture.sched import ThreadSchedStat, involuntary_switches
from kinetoscope.capture.telemetry import TelemetrySampler
from kinetoscope.manifest import Manifest, StepTimes, Window, step_times_name

T = TypeVar("T")


@dataclass(frozen=True)
class Schedule:
    """torch.profiler's schedule. Default: steps 3-5 profiled (skip 1, wait 1, warm up 1, record 3)."""

    skip_first: int = 1
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"schedule {name} must be an integer >= 0, got {value!r}")
        if self.active < 1:
            raise ValueError("schedule active must be >= 1")

    @property
    def period(self) -> int:
        return self.wait + self.warmup + self.active

    def is_active(self, step: int) -> bool:
        if step < self.skip_first:
            return False
        cycle, k = divmod(step - self.skip_first, self.period)
        if self.repeat and cycle >= self.repeat:
            return False
        return k >= self.wait + self.warmup

    def window_of(self, step: int) -> tuple[int, int]:
        """The (first, last) active steps of the window containing ``step``."""
        cycle = (step - self.skip_first) // self.period
        first = self.skip_first + cycle * self.period + self.wait + self.warmup
        return first, first + self.active - 1


class Profiler:
    """Scheduled torch.profiler capture that writes rank-aware gzipped traces and never breaks training.

    ``loop``: a loop recorder already attached to the hooks (``kinetoscope capture`` keeps one for the whole
    process); without it the Profiler attaches its own on ``start()`` and detaches it on ``stop()``/``discard()``.
    ``step_source``: what ends a step, for the manifest ("profiler_step": the script calls ``step()``).
    ``hang_watch``: start the hang watchdog (``hangwatch``: ``rank-<r>.hang.json`` when no step ends for
    ``hang_timeout_s``, None: the default rule, 0: on signals and exceptions only) and turn torch's flight recorder on
    (``flight_recorder_entries``, 0: off; torch reads it when it records, so after ``init_process_group`` too).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] = "kinetoscope_traces",
        *,
        schedule: Schedule | None = None,
        cuda: bool | None = None,
        record_shapes: bool = False,
        profile_memory: bool = True,
        with_stack: bool = False,
        telemetry: bool = True,
        telemetry_interval_s: float = 0.5,
        loop: LoopRecorder | None = None,
        step_source: str = "profiler_step",
        hang_watch: bool = True,
        hang_timeout_s: float | None = None,
        flight_recorder_entries: int = DEFAULT_FR_ENTRIES,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.schedule = schedule or Schedule()
        self.cuda = cuda
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.telemetry_enabled = telemetry
        self.sampler = TelemetrySampler(interval_s=telemetry_interval_s)
        self.rank: RankInfo = RankInfo(0, 1, 0, "default")
        self.traces: list[Path] = []
        self.step_num = 0
        self._prof: Any = None
        self._writable = False
        self._exiting = False
        self._step_start_ns = 0
        self._step_unix_start: dict[int, int] = {}
        #: host time just after ``prof.step()`` (``start()`` for step 0) started each ProfilerStep span: with
        #: ``_step_unix_start`` it brackets the span's start, which places the marks on the trace's clock
        self._step_unix_entered: dict[int, int] = {}
        self.loop = loop
        self._own_loop = loop is None
        self.step_source = step_source
        #: what chose the step boundary, where ``step_source``'s own sentence does not say it (``kinetoscope
        #: capture``: several optimizers per DataLoader iteration)
        self.step_source_why: str | None = None
        self._closed = False
        self._data_wait_ns = 0
        self._data_wait_cpu_ns = 0
        self._data_wait_thread_cpu_ns = 0
        self._step_cpu_start_ns = 0
        self._step_wall_ns: list[int] = []
        self._step_wait_ns: list[int] = []
        #: process CPU time (every thread) per step, and during its data wait: what a what-if needs to tell
        #: loading that computes (competes for cores) from loading that waits (storage, network)
        self._step_cpu_ns: list[int] = []
        self._step_wait_cpu_ns: list[int] = []
        self._step_wait_thread_cpu_ns: list[int] = []
        self._dataloader: dict[str, Any] | None = None
        #: the DataLoader's worker processes (Linux: their CPU time from /proc/<pid>/schedstat), each one's CPU
        #: time at the last step's end, and the workers' CPU time per step (None where it cannot be read)
        self._worker_pids: tuple[int, ...] = ()
        self._worker_cpu: dict[int, int] = {}
        self._step_workers_cpu_ns: list[int | None] = []
        #: the training thread's scheduler statistics (``sched.py``; opened by ``start()`` on that thread): its time
        #: on a CPU and runnable without one per step, the process's involuntary context switches per step, and
        #: their values at the step's start (None: not read)
        self._sched: ThreadSchedStat | None = None
        self._sched_start: tuple[int, int] | None = None
        self._switches_start: int | None = None
        self._step_oncpu_ns: list[int | None] = []
        self._step_runqueue_ns: list[int | None] = []
        self._step_switches: list[int | None] = []
        self._started_unix_ns = 0
        self._step_abandoned = False
        self._discarding = False
        self._ended_by: str | None = None
        #: each written window: its trace, steps, and whether the process's end cut it short
        self.windows: list[Window] = []
        #: when the capture's own trace writing ran, and how much of each step's wall it overlapped
        self.busy = BusyClock()
        self._step_capture_ns: list[int | None] = []
        self.writer = TraceWriter(self.busy)
        self._hang_options = (hang_timeout_s, flight_recorder_entries) if hang_watch else None
        self.hang_watch: HangWatch | None = None
        #: (our sys.excepthook, the one it replaced) while the watchdog runs
        self._excepthook: tuple[Any, Any] | None = None
        #: keep the exception hook after ``stop()`` (``profile_loop`` left early: an exception may be unwinding)
        self.keep_exception_dump = False

    # --- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> Profiler:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and self.hang_watch is not None and not isinstance(exc, KeyboardInterrupt):
            self.hang_watch.dump("exception", exc=exc)  # the other ranks will wait for this one: say why it left
        self.stop()

    def start(self) -> None:
        self.rank = rank_info()
        self._writable = self._prepare_dir()
        if self._writable:
            self._warm_redaction()  # before the first step's clock starts
        if self._own_loop:
            self._attach_loop()
        self._open_sched()
        self._started_unix_ns = time.time_ns()
        self._step_start_ns = time.perf_counter_ns()
        self._step_cpu_start_ns = time.process_time_ns()
        self._sched_begin()
        self._step_unix_start[0] = self._started_unix_ns
        if self.loop is not None:
            self.loop.begin_steps(self._started_unix_ns)
        if self._writable and self._hang_options is not None:
            self._start_hang_watch(*self._hang_options)
        if self._writable:
            self._start_profiler()
            self._step_unix_entered[0] = time.time_ns()
            if self.telemetry_enabled:
                self._start_telemetry()

    @never_raises("hang watchdog")
    def _start_hang_watch(self, timeout_s: float | None, entries: int) -> None:
        watch = HangWatch(self.out_dir, self._progress, timeout_s=timeout_s, fr_entries=arm_flight_recorder(entries))
        watch.start()
        watch.take_sigterm()
        self.hang_watch = watch
        self._hook_exceptions(watch)

    def _hook_exceptions(self, watch: HangWatch) -> None:
        """An uncaught exception writes the rank's dump while the watchdog runs (the other ranks will wait for this
        one: say why it left). ``with Profiler()`` sees it in ``__exit__`` first. ``profile_loop`` never sees it: the
        loop's body raises outside the generator, and the unwinding closes the generator (stopping the profiler)
        before the exception reaches the hook; so a loop left early keeps the hook (``keep_exception_dump``)."""
        previous = sys.excepthook

        def excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
            if self._excepthook is None or issubclass(exc_type, KeyboardInterrupt):
                previous(exc_type, exc, tb)
            else:
                watch.on_uncaught(exc, lambda: previous(exc_type, exc, tb))

        self._excepthook = (excepthook, previous)
        sys.excepthook = excepthook

    def _progress(self) -> tuple[int | None, int | None, list[int]]:
        """What the watchdog reads: steps ended, the last one's end (the step clock ``step()`` keeps), their times."""
        return self.step_num, self._step_start_ns, self._step_wall_ns[-100:]

    @never_raises("hang watchdog")
    def _stop_hang_watch(self) -> None:
        watch, self.hang_watch = self.hang_watch, None
        if not self.keep_exception_dump:
            hook, self._excepthook = self._excepthook, None
            if hook is not None and sys.excepthook is hook[0]:  # one set after ours stays (it calls ours: harmless)
                sys.excepthook = hook[1]
        if watch is not None:
            watch.stop()

    @never_raises("scheduler statistics")
    def _open_sched(self) -> None:
        self._sched = ThreadSchedStat()

    def _close_sched(self) -> None:
        if self._sched is not None:
            self._sched.close()

    def _sched_begin(self) -> None:
        self._sched_start = self._sched.read() if self._sched is not None else None
        self._switches_start = involuntary_switches()

    def _sched_step(self) -> None:
        """The step's on-CPU and run-queue time of the training thread, and the process's involuntary switches."""
        now = self._sched.read() if self._sched is not None else None
        start = self._sched_start
        ok = now is not None and start is not None
        self._step_oncpu_ns.append(now[0] - start[0] if ok else None)  # type: ignore[index]
        self._step_runqueue_ns.append(now[1] - start[1] if ok else None)  # type: ignore[index]
        switches = involuntary_switches()
        self._step_switches.append(
            switches - self._switches_start if switches is not None and self._switches_start is not None else None)

    def _sched_lists(self) -> dict[str, Any]:
        """steps.json's scheduler lists: null (not an empty list, never 0) where nothing was read."""
        def listed(values: list[int | None]) -> list[int | None] | None:
            return values if any(v is not None for v in values) else None
        return {"oncpu_ns": listed(self._step_oncpu_ns), "runqueue_wait_ns": listed(self._step_runqueue_ns),
                "involuntary_switches": listed(self._step_switches)}

    def _sched_facts(self) -> dict[str, Any]:
        """The manifest's word on the scheduler statistics: recorded, or why not."""
        sched = self._sched
        why = sched.why_not if sched is not None else "the scheduler statistics were not opened (no start())"
        return {"thread_schedstat": "recorded" if why is None else None,
                "thread_schedstat_not_recorded": why}

    @never_raises("redaction")
    def _warm_redaction(self) -> None:
        warm_redaction()

    @never_raises("loop recorder")
    def _attach_loop(self) -> None:
        loop = LoopRecorder()
        loop.attach()
        self.loop = loop

    @never_raises("loop recorder")
    def _detach_loop(self) -> None:
        if self._own_loop and self.loop is not None:
            self.loop.detach()

    @never_raises("output directory")
    def _prepare_dir(self) -> bool:
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            probe = self.out_dir / f".kinetoscope-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            warn_once(
                "output directory",
                f"cannot write to {self.out_dir} ({exc.strerror or exc}); profiling is off, training continues",
            )
            return False
        recovered, removed = tidy_output_dir(self.out_dir)  # what a killed earlier run left (its processes are gone)
        if recovered or removed:
            log.warning("kinetoscope: %s held what a killed run left: %s", self.out_dir,
                        "; ".join(part for part in (
                            f"{len(recovered)} trace(s) kept uncompressed ({', '.join(p.name for p in recovered)})"
                            if recovered else "", f"{removed} unfinished file(s) removed" if removed else "") if part))
        return True

    @never_raises("profiler start")
    def _start_profiler(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        use_cuda = torch.cuda.is_available() if self.cuda is None else self.cuda
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
        s = self.schedule
        prof = profile(
            activities=activities,
            schedule=schedule(skip_first=s.skip_first, wait=s.wait, warmup=s.warmup, active=s.active, repeat=s.repeat),
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        # capture's own: not "the script starting a profiler of its own" (a marker torch's class does not declare)
        prof._kinetoscope_own = True  # type: ignore[attr-defined]
        prof.start()
        self._prof = prof

    @never_raises("telemetry")
    def _start_telemetry(self) -> None:
        self.sampler.start()

    def stop(self, ended_by: str | None = None) -> None:
        """Stop profiling and write the sidecars. ``ended_by``: why the process is ending early (an
        uncaught exception's type, ``SIGTERM``), recorded in the manifest."""
        if self._closed:
            return
        self._ended_by = ended_by
        self._close_step()
        self._closed = True
        self._finish_loop()
        self._exiting = True
        try:
            if self._prof is not None:
                prof, self._prof = self._prof, None
                self._stop_profiler(prof)
            self._stop_telemetry()
            self.writer.close()  # every trace on disk before the manifest names it
            self.traces = [p for p in self.traces if p.exists()]
            if self._writable:
                self._write_sidecars()
        finally:
            self._stop_hang_watch()
            self._detach_loop()
            self._close_sched()

    @never_raises("loop recorder")
    def _finish_loop(self) -> None:
        if self.loop is not None:
            self.loop.finish(time.time_ns(), keep=self._keeps_marks(self.step_num))

    @never_raises("profiler stop")
    def _stop_profiler(self, prof: Any) -> None:
        prof.stop()

    def discard(self, drop_written: bool = False) -> None:
        """Stop without writing anything more (capture stands aside for the script's own profiler). ``drop_written``:
        the windows already written are removed too - their steps were no steps of this run (``kinetoscope
        capture`` learnt later what ends a step), and no manifest will name them."""
        self._discarding = True
        self._closed = True
        try:
            if self._prof is not None:
                prof, self._prof = self._prof, None
                self._stop_profiler(prof)
            self._stop_telemetry()
            if drop_written and self.traces:
                self._drop_written()
        finally:
            if self.loop is not None and not self._own_loop:
                self.loop.drop_marks()
            self._stop_hang_watch()
            self._detach_loop()
            self._close_sched()

    @never_raises("trace removal")
    def _drop_written(self) -> None:
        self.writer.close()  # a window still being gzipped is on disk before it is removed
        for path in self.traces:
            path.unlink(missing_ok=True)
        self.traces.clear()
        self.windows.clear()

    @never_raises("telemetry stop")
    def _stop_telemetry(self) -> None:
        self.sampler.stop()

    # --- per step --------------------------------------------------------------------
    def add_data_wait(self, ns: int, cpu_ns: int = 0, thread_cpu_ns: int = 0) -> None:
        """Time the loop spent waiting for the next batch during this step (and the process's and the training
        thread's CPU time then), for an iterable that is not a DataLoader (the loop recorder times those)."""
        self._data_wait_ns += ns
        self._data_wait_cpu_ns += cpu_ns
        self._data_wait_thread_cpu_ns += thread_cpu_ns

    def note_workers(self, it: Any) -> None:
        """The worker processes of the DataLoader iterator the loop takes batches from (none: num_workers=0)."""
        workers = getattr(it, "_workers", None)
        if not workers:
            return
        try:
            pids = tuple(int(w.pid) for w in workers if getattr(w, "pid", None))
        except Exception:  # noqa: BLE001
            return
        if pids != self._worker_pids:
            self._worker_pids = pids

    def _workers_cpu(self) -> int | None:
        """The workers' CPU time since the last step's end (ns); a worker new since then counts from its start."""
        if not self._worker_pids:
            return None
        total, seen = 0, {}
        for pid in self._worker_pids:
            ns = _schedstat_ns(pid)
            if ns is None:
                continue
            seen[pid] = ns
            total += ns - self._worker_cpu.get(pid, 0)
        self._worker_cpu = seen
        return total if seen else None

    def note_dataloader(self, it: Any) -> None:
        """Remember the first DataLoader's configuration (from its iterator or itself) for the manifest."""
        if self._dataloader is not None:
            return
        try:
            get = lambda *names: next((getattr(it, n) for n in names if hasattr(it, n)), None)  # noqa: E731
            sampler = get("_index_sampler", "batch_sampler")
            config = {"num_workers": get("_num_workers", "num_workers"),
                      "prefetch_factor": get("_prefetch_factor", "prefetch_factor"),
                      "persistent_workers": get("_persistent_workers", "persistent_workers"),
                      "pin_memory": get("_pin_memory", "pin_memory"),
                      "batch_size": getattr(sampler, "batch_size", None) if sampler is not None else get("batch_size")}
            self._dataloader = {
                k: (v if isinstance(v, (int, bool)) or v is None else str(v)) for k, v in config.items()
            }
        except Exception:  # noqa: BLE001 - a loader of an unexpected shape is simply not described
            self._dataloader = {}

    def abandon_step(self) -> None:
        """The loop ended: the step just opened never ran, so it is not recorded."""
        self._step_abandoned = True

    def _keeps_marks(self, step: int) -> bool:
        """Whether a window records ``step`` (its marks go into that window's trace)."""
        return self._prof is not None and self.schedule.is_active(step)

    def _close_step(self, unix_now: int | None = None) -> None:
        if self._closed:
            return
        now = time.perf_counter_ns()
        unix_now = time.time_ns() if unix_now is None else unix_now
        record = (not self._step_abandoned and now > self._step_start_ns
                  and self.step_num > len(self._step_wall_ns) - 1)
        wait_ns, wait_cpu_ns, wait_thread_ns = self._data_wait_ns, self._data_wait_cpu_ns, self._data_wait_thread_cpu_ns
        seen = self._loop_step(unix_now, record)
        if seen is not None:
            wait_ns += seen.data_wait_ns
            wait_cpu_ns += seen.data_wait_cpu_ns
            wait_thread_ns += seen.data_wait_thread_cpu_ns
            if seen.iterator is not None:
                self.note_dataloader(seen.iterator)
                self.note_workers(seen.iterator)
        if record:
            self._step_wall_ns.append(now - self._step_start_ns)
            self._step_wait_ns.append(wait_ns)
            self._step_cpu_ns.append(time.process_time_ns() - self._step_cpu_start_ns)
            self._step_wait_cpu_ns.append(wait_cpu_ns)
            self._step_wait_thread_cpu_ns.append(wait_thread_ns)
            self._step_workers_cpu_ns.append(self._workers_cpu())
            self._step_capture_ns.append(self.busy.overlap_ns(self._step_start_ns, now))
            self._sched_step()

    @never_raises("loop recorder")
    def _loop_step(self, unix_now: int, record: bool) -> Any:
        if self.loop is None:
            return None
        return self.loop.close_step(unix_now, record=record, keep=self._keeps_marks(self.step_num))

    def step(self) -> None:
        """Mark the end of a training step."""
        unix_now = time.time_ns()
        self._close_step(unix_now)
        self.step_num += 1
        self._data_wait_ns = 0
        self._data_wait_cpu_ns = 0
        self._data_wait_thread_cpu_ns = 0
        self._step_cpu_start_ns = time.process_time_ns()
        self._sched_begin()
        self._step_start_ns = time.perf_counter_ns()
        self._step_unix_start[self.step_num] = unix_now
        self._step_unix_start.pop(self.step_num - 4 * self.schedule.period - 2, None)
        self._step_unix_entered.pop(self.step_num - 4 * self.schedule.period - 2, None)
        if self._prof is not None:
            self._profiler_step()
            self._step_unix_entered[self.step_num] = time.time_ns()

    def _profiler_step(self) -> None:
        try:
            self._prof.step()
        except Exception as exc:  # noqa: BLE001
            warn_once(
                "profiler step", f"profiler failed ({type(exc).__name__}: {exc}); profiling is off, training continues"
            )
            prof, self._prof = self._prof, None
            self._stop_profiler(prof)

    # --- output ------------------------------------------------------------------------
    def _on_trace_ready(self, prof: Any) -> None:
        if self._discarding:
            return
        try:
            last = self.step_num if self._exiting else self.step_num - 1
            first, _ = self.schedule.window_of(last)
            first = max(first, 0)
            # one raw file per window: the writer thread may still be gzipping the previous one
            raw = self.out_dir / f".rank-{self.rank.rank}.{os.getpid()}.step-{first}-{last}.raw.json"
            token = self.busy.begin()
            try:
                prof.export_chrome_trace(str(raw))
            finally:
                self.busy.end(token)
            self._warn_if_huge(raw, first, last)
            base = base_time_ns(raw)
            start = self._step_unix_start.get(first, self._started_unix_ns)
            end = time.time_ns()
            counters = self.sampler.counter_events(base, start, end) if base and self.sampler.enabled else []
            marks = self._window_marks(first, last, start, end)
            dist = None
            if self.rank.source == "environment":
                dist = {"rank": self.rank.rank, "world_size": self.rank.world_size, "backend": "unknown",
                        "note": "added by kinetoscope from RANK/WORLD_SIZE"}
            final = self.out_dir / trace_name(self.rank.rank, first, last)
            # gzip and the telemetry merge run on the writer's thread: training goes on meanwhile
            self.writer.submit(raw, final, extra_events=counters, distributed_info=dist, marks=marks)
            self.traces.append(final)
            # a window the process's end cut short: its last step (the one open at the end) is partial
            self.windows.append(Window(trace=final.name, first_step=first, last_step=last, cut_short=self._exiting,
                                       ended_by=self._ended_by if self._exiting else None))
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop training
            warn_once("trace export", f"could not write a trace ({type(exc).__name__}: {exc}); training continues")

    @never_raises("loop marks")
    def _window_marks(self, first: int, last: int, start: int, end: int) -> WindowMarks | None:
        """The window's loop marks, with the host times that place them on the trace's clock."""
        if self.loop is None:
            return None
        marks = self.loop.take_marks(start, end)
        steps = {k: (self._step_unix_start[k], self._step_unix_entered[k]) for k in range(first, last + 1)
                 if k in self._step_unix_start and k in self._step_unix_entered}
        return WindowMarks(tuple(marks), steps, os.getpid()) if marks else None

    #: a raw export larger than this gets a warning with the ways to shrink it
    HUGE_TRACE_BYTES = 1 << 30

    @never_raises("trace size")
    def _warn_if_huge(self, raw: Path, first: int, last: int) -> None:
        size = raw.stat().st_size
        if size > self.HUGE_TRACE_BYTES:
            tips = [t for t, on in (("--no-memory", self.profile_memory), ("no --with-stack", self.with_stack),
                                    ("no --record-shapes", self.record_shapes)) if on]
            warn_once("huge trace", f"the trace of steps {first}-{last} is {size / 2**30:.1f} GB; to shrink it profile "
                      f"fewer steps (--active) or {', '.join(tips) or 'shorter steps'}")

    @never_raises("manifest")
    def _write_sidecars(self) -> None:
        r = self.rank.rank
        steps = len(self._step_wall_ns)
        write_step_times(self.out_dir, r, StepTimes(
            rank=r,
            unit="ns",
            step_wall_ns=self._step_wall_ns,
            data_wait_ns=self._step_wait_ns,
            step_cpu_ns=self._step_cpu_ns,
            data_wait_cpu_ns=self._step_wait_cpu_ns,
            data_wait_thread_cpu_ns=self._step_wait_thread_cpu_ns,
            workers_cpu_ns=self._step_workers_cpu_ns,
            capture_busy_ns=self._step_capture_ns,
            **self._sched_lists(),
            profiled=[self.schedule.is_active(i) for i in range(steps)],
            **self._loop_lists(steps),
        ))
        loop = self._loop_manifest()
        manifest = Manifest(
            rank=r,
            host={**_host_facts(max(self.rank.world_size, rank_info().world_size)),  # a group made since start()
                  **self._sched_facts()},
            pid=os.getpid(),
            argv=list(sys.argv),
            versions=versions(),
            world_size=self.rank.world_size,
            local_rank=self.rank.local_rank,
            rank_source=self.rank.source,
            schedule=asdict(self.schedule),
            options={"record_shapes": self.record_shapes, "profile_memory": self.profile_memory,
                     "with_stack": self.with_stack, "telemetry": self.sampler.enabled},
            steps_run=len(self._step_wall_ns),
            traces=[p.name for p in self.traces],
            windows=[w for w in self.windows if (self.out_dir / w.trace).exists()],
            ended_by=self._ended_by,
            step_times=step_times_name(r),
            dataloader=self._training_loader(),
            loop=loop,
        )
        write_manifest(self.out_dir, manifest)
        # then the cores probe, the manifest rewritten with it (a probe that fails or is interrupted loses nothing):
        # only for a job of one process (a job's ranks end together and would measure each other's probes), and
        # not when the run ends early (a signal, a crash: the process should go at once)
        if self.rank.world_size == 1 and self._ended_by is None:
            self._probe_cores(manifest)
        if self._ended_by is None:
            self._probe_handover(manifest)

    def _loop_lists(self, steps: int) -> dict[str, Any]:
        lists = self._loop_step_lists(steps)
        if lists is None:  # nothing recorded (no loop recorder): every list null, never 0
            lists = {k: None for k in STEP_LISTS}
        return lists

    @never_raises("loop recorder")
    def _loop_step_lists(self, steps: int) -> dict[str, Any] | None:
        return self.loop.step_lists(steps, self._step_wall_ns) if self.loop is not None else None

    def _loop_manifest(self) -> dict[str, Any]:
        loop = self._loop_manifest_of_recorder()
        if loop is None:
            loop = {"marks": MARKS_VERSION, "recorded": [], "step_source": self.step_source,
                    "step_source_why": self.step_source_why or STEP_SOURCE_WHY.get(self.step_source), "loaders": None,
                    "backward_calls": None, "optimizer_steps": None, "optimizers": None, "validation": None,
                    "compile": None, "checkpoint": None, "child_processes": None}
        return loop

    @never_raises("loop recorder")
    def _loop_manifest_of_recorder(self) -> dict[str, Any] | None:
        return self.loop.manifest(self.step_source, self.step_source_why) if self.loop is not None else None

    @never_raises("loop recorder", default=None)
    def _training_loop_config(self) -> dict[str, Any] | None:
        return self.loop.training_loader_config() if self.loop is not None else None

    def _training_loader(self) -> dict[str, Any] | None:
        """The DataLoader configuration the manifest gives: the training loader's (role "train"), else the first
        one the loop took a batch from."""
        return self._training_loop_config() or self._dataloader

    @never_raises("hand-over probe")
    def _probe_handover(self, manifest: Manifest) -> None:
        """What taking the training loader's batch from a worker costs the loop (would cost, where it loaded in this
        process), measured (``handover.probe_handover``), in the manifest's ``dataloader``: with workers, the
        trace's waits hold the hand-over and the workers' lateness together, and only a ready batch tells them
        apart. Every rank probes (a job's ranks take batches from workers at once)."""
        dl = manifest.dataloader
        workers = dl.get("num_workers") if isinstance(dl, dict) else None
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            return
        batch = self.loop.training_loader_batch() if self.loop is not None else None
        if batch is None:
            dl["handover_probe"] = not_measured("no training batch was recorded (no loop recorder, or a batch the "
                                                "capture could not describe: a tensor off the CPU, too many)")
        else:
            with hooks.quiet():
                dl["handover_probe"] = probe_handover(batch)
        write_manifest(self.out_dir, manifest)

    @never_raises("cores probe")
    def _probe_cores(self, manifest: Manifest) -> None:
        cores = effective_cores(manifest.host["cpus"])
        if cores is not None:
            manifest.host["cores_effective"] = cores
            write_manifest(self.out_dir, manifest)


def _schedstat_ns(pid: int) -> int | None:
    """A process's time on a CPU so far (ns, Linux /proc/<pid>/schedstat); None where unavailable or gone."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            return int(fh.read().split(maxsplit=1)[0])
    except (OSError, ValueError, IndexError):
        return None


def _host_facts(world_size: int) -> dict[str, Any]:
    """The CPUs this process may run on, the host's CPUs (more where a launcher pinned the rank to its own), how
    many cores' worth of work they do together (None here: measured after the manifest is first written, see
    ``Profiler._probe_cores``), torch's intra-op threads and how many of the job's ranks share the host (the
    launcher's word; None: not said): what a what-if needs to judge whether DataLoader workers would compete with
    the training for cores; and the memory the process may use (the host's, its cgroup's limit where lower), what CPU
    memory growth is judged against."""
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    threads = None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            threads = int(torch.get_num_threads())
        except Exception:  # noqa: BLE001
            threads = None
    return {"cpus": cpus, "cpus_on_host": os.cpu_count(), "cores_effective": None, "torch_threads": threads,
            "ranks_on_host": ranks_on_host(world_size), **memory_facts()}


def profile_loop(
    iterable: Iterable[T], out_dir: str | os.PathLike[str] = "kinetoscope_traces", **options: Any
) -> Iterator[T]:
    """Yield from ``iterable``, one profiler step per item, timing the wait for each item (a DataLoader's waits
    are timed by the loop recorder, once: never here as well)."""
    options.setdefault("step_source", "dataloader")
    prof = Profiler(out_dir, **options)
    prof.start()
    try:
        it = iter(iterable)
        timed_by_loop = is_data_loader_iterator(it)
        first = True
        while True:
            if not first:
                prof.step()
            t0, c0, q0 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
            try:
                item = next(it)
            except StopIteration:
                prof.abandon_step()
                return
            if not timed_by_loop:
                q1, c1 = time.thread_time_ns(), time.process_time_ns()  # inside the wall clock's interval
                prof.add_data_wait(time.perf_counter_ns() - t0, c1 - c0, q1 - q0)
                if hasattr(iterable, "num_workers"):
                    prof.note_dataloader(iterable)
                    prof.note_workers(it)
            first = False
            yield item
    except GeneratorExit:
        # the loop was left early: a break, or an exception unwinding the caller (it closes this generator before
        # the exception reaches sys.excepthook): the rank's dump is still written if the script ends by it
        prof.keep_exception_dump = True
        raise
    finally:
        prof.stop()
