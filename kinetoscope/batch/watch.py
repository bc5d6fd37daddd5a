"""``kinetoscope batch --watch``: a service that analyses jobs as they land under its sources.

Each round lists the sources (backing off while nothing changes), takes a job as complete when every rank file has
its capture manifest beside it (the capture writes it last, at the run's end) or when its files have not changed for
``settle_s``, and analyses each file version once: a version is the file's URL, size and mtime (an object's ETag),
and what the store already holds is skipped (``--resume`` semantics, so a restart carries on where it stopped).
A file that cannot be read, or whose task died, is tried again after a growing delay, up to ``max_attempts``; then
it gets a failed row saying so. A broken trace is not retried: its failed row is the answer. At most
``max_in_flight`` files are being analysed at once. ``stop`` (the first Ctrl-C or SIGTERM) ends the watch once the
files in flight are written; ``abandon`` (the second) ends it at once: every row already written is whole (each is
one file written atomically), and what was in flight is analysed after the next start.

Each analysed file leaves one small Parquet file per table, so the watch compacts the store (``compact``) once
``compact_every`` files have been written since the last compaction, or once nothing has been written for
``compact_quiet_s`` with some files not yet compacted, and at a clean stop. It never compacts with files in flight:
past ``compact_every`` it starts no new file until those in flight are written, then compacts, then goes on (so the
store never holds more than ``compact_every`` un-compacted files of this watch's, plus its job-level ones). A
compaction that fails is said and tried again after ``compact_quiet_s``: the rows are all there in single files.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kinetoscope.analyze.ingest.jobs import Job, TraceFile, is_capture_window, rank_from_name
from kinetoscope.analyze.ingest.limits import DEFAULT_LIMITS, LoadLimits
from kinetoscope.analyze.model.config import DEFAULT_CONFIG, AnalysisConfig
from kinetoscope.batch.compact import compact
from kinetoscope.batch.discover import discover
from kinetoscope.batch.run import _cross_rank, _hangs
from kinetoscope.batch.store import SCHEMAS, StoreRoot, write_rows
from kinetoscope.batch.task import analyze_file, file_key
from kinetoscope.errors import KinetoscopeError
from kinetoscope.manifest import manifest_name
from kinetoscope.sources import scrub, version_of

#: an error that may pass if tried again (the store, the network, a worker), as opposed to a broken trace
TRANSIENT = ("cannot read", "task failed")


@dataclass(frozen=True)
class WatchPolicy:
    #: a job's files unchanged this long make it complete (when no manifest says so first)
    settle_s: float = 60.0
    #: the first listing interval; doubled after each listing that finds nothing new, up to ``max_poll_s``
    poll_s: float = 5.0
    max_poll_s: float = 300.0
    #: tries of one file version before it is given up (with a failed row saying so)
    max_attempts: int = 3
    #: delay before the first retry; doubled for each further one
    retry_s: float = 30.0
    #: files being analysed at once (submitted and not yet written)
    max_in_flight: int = 4
    #: after a stop, how long the files in flight may take before they are abandoned
    stop_grace_s: float = 300.0
    #: compact the store once this many files have been written since the last compaction (new files wait for it)
    compact_every: int = 256
    #: compact once nothing has been written for this long and some files are not compacted yet; also the wait
    #: before a failed compaction is tried again
    compact_quiet_s: float = 120.0


@dataclass
class WatchSummary:
    listings: int = 0
    analysed: int = 0
    skipped: int = 0
    failed: int = 0
    retried: int = 0
    given_up: int = 0
    abandoned: int = 0
    jobs: int = 0
    compactions: int = 0
    compactions_failed: int = 0
    errors: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"watched {self.listings} listings: {self.jobs} jobs complete, {self.analysed} files analysed "
                f"({self.failed} failed, {self.given_up} given up after retries), {self.skipped} already in the store"
                + (f", {self.abandoned} abandoned in flight (analysed after the next start)" if self.abandoned else "")
                + f"; store compacted {self.compactions} time(s)"
                + (f" ({self.compactions_failed} compaction(s) failed)" if self.compactions_failed else "")]


#: a file version: its URL or path, size, and mtime or ETag
Version = tuple[str, int, str]


@dataclass
class _Task:
    job: Job
    file: TraceFile
    index: int
    version: Version
    attempt: int = 1
    not_before: float = 0.0
    future: Any = None


class Watcher:
    """One watch over ``roots`` into the store ``root``; ``submit(fn, *args)`` returns a future (a Dask client's
    ``submit``, or an executor's). ``on_event(kind, text)``: what happened, for a log."""

    def __init__(self, roots: list[str], root: StoreRoot, submit: Callable[..., Any], *,
                 policy: WatchPolicy = WatchPolicy(), limits: LoadLimits = DEFAULT_LIMITS,
                 config: AnalysisConfig = DEFAULT_CONFIG, on_event: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, workers_alive: Callable[[], bool] | None = None) -> None:
        self.roots, self.root, self.submit = roots, root, submit
        #: whether any worker is left to finish the work in flight (a Ctrl-C at a terminal stops local workers too)
        self.workers_alive = workers_alive
        self.policy, self.limits, self.config = policy, limits, config
        self.on_event = on_event or (lambda kind, text: None)
        self.clock = clock
        self.summary = WatchSummary()
        #: job name -> (its files' versions, when they were first seen so)
        self._seen: dict[str, tuple[tuple[Version, ...], float]] = {}
        #: job name -> the versions last analysed (a job is analysed again only when a file changes)
        self._handled: dict[str, tuple[Version, ...]] = {}
        #: file versions analysed (or given up) by this process
        self._done: set[Version] = set()
        self._queue: deque[_Task] = deque()
        self._in_flight: list[_Task] = []
        #: job name -> (the job, its versions, rows so far, files left)
        self._jobs: dict[str, tuple[Job, tuple[Version, ...], list[dict[str, Any]], int]] = {}
        #: files written since the last compaction, when the last was written (``clock``), and no compaction before
        self._uncompacted = 0
        self._last_write = 0.0
        self._compact_not_before = 0.0

    # -- the loop --
    def run(self, stop: threading.Event, abandon: threading.Event | None = None) -> WatchSummary:
        abandon = abandon or threading.Event()
        interval = self.policy.poll_s
        next_listing = time.monotonic()  # the listings' pace is real time; ``clock`` dates files and retries
        stopped_at: float | None = None
        while not abandon.is_set():
            if stop.is_set():
                if not self._in_flight:
                    break
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at > self.policy.stop_grace_s or not self._alive():
                    self._say("stop", f"abandoning {len(self._in_flight)} file(s) in flight "
                                      "(analysed after the next start)")
                    break
            elif time.monotonic() >= next_listing:
                changed = self.list_once()
                interval = self.policy.poll_s if changed else min(interval * 2, self.policy.max_poll_s)
                next_listing = time.monotonic() + interval
            self._collect(stopping=stop.is_set())
            if not stop.is_set():
                self._compact_if_due()
                if not self._compaction_waits():  # past compact_every: the files in flight land first
                    self._start_ready()
            (abandon if stop.is_set() else stop).wait(0.2)
        if not abandon.is_set() and not self._in_flight and self._uncompacted:
            self._compact()
        for task in self._in_flight:
            if task.future is not None:
                task.future.cancel()
            self.summary.abandoned += 1
        self._in_flight.clear()
        return self.summary

    def _compaction_waits(self) -> bool:
        """Whether a compaction is due by count (``compact_every``): no new file starts until it has run. After a
        failed one, work goes on (the retry waits ``compact_quiet_s``)."""
        return self._uncompacted >= self.policy.compact_every and self.clock() >= self._compact_not_before

    def _compact_if_due(self) -> None:
        """Compact when ``compact_every`` files were written, or nothing for ``compact_quiet_s``; never with files
        in flight (their rows are being written)."""
        if not self._uncompacted or self._in_flight:
            return
        now = self.clock()
        if now < self._compact_not_before:
            return
        if self._uncompacted >= self.policy.compact_every or now - self._last_write >= self.policy.compact_quiet_s:
            self._compact()

    def _compact(self) -> None:
        files = self._uncompacted
        try:
            merged = compact(self.root, SCHEMAS)
        except Exception as exc:  # noqa: BLE001 - not fatal: every row is in its single file, tried again later
            self.summary.compactions_failed += 1
            self._compact_not_before = self.clock() + self.policy.compact_quiet_s
            self._say("compact", f"failed, tried again in {self.policy.compact_quiet_s:g} s: "
                                 f"{type(exc).__name__}: {scrub(str(exc).strip())[:300]}")
            return
        if merged is None:  # another compaction of this store holds its lock: this one waits its turn
            self._compact_not_before = self.clock() + self.policy.compact_quiet_s
            self._say("compact", "skipped: another compaction of the store is running")
            return
        self._uncompacted = 0
        self.summary.compactions += 1
        self._say("compacted", f"{files} file(s) analysed since the last compaction; merged "
                  + (", ".join(f"{table} {n}" for table, n in merged.items()) or "nothing"))

    def _alive(self) -> bool:
        try:
            return self.workers_alive is None or self.workers_alive()
        except Exception:  # noqa: BLE001 - the scheduler itself is gone
            return False

    def list_once(self) -> bool:
        """List the sources; queue each complete job's unanalysed files. Whether anything changed."""
        self.summary.listings += 1
        try:
            jobs = discover(list(self.roots))
        except KinetoscopeError as exc:  # a source not there yet, or unreachable: said, then tried again later
            self._say("list", str(exc))
            return False
        changed = False
        now = self.clock()
        for job in jobs:
            try:
                versions = tuple(_version(f) for f in job.files + job.hang_dumps)
            except OSError:  # a file went away between the listing and now: the next listing sees
                changed = True
                continue
            seen = self._seen.get(job.name)
            fresh = seen is None or seen[0] != versions
            if fresh:
                self._seen[job.name] = (versions, now)
                changed = True
            since = self._seen[job.name][1]
            if self._handled.get(job.name) == versions or job.name in self._jobs:
                continue
            if not (_manifests_say_done(job) or now - since >= self.policy.settle_s):
                if fresh:
                    self._say("waiting", f"{job.name}: {len(job.files)} file(s), no capture manifest yet; complete "
                                         f"when they stop changing for {self.policy.settle_s:g} s")
                continue
            self._handled[job.name] = versions
            todo = [_Task(job, f, i, v) for i, (f, v) in enumerate(zip(job.files, versions, strict=False))
                    if v not in self._done]
            self.summary.jobs += 1
            self._say("job", f"{job.name}: complete, {len(todo)} of {len(job.files)} file(s) to analyse")
            self._jobs[job.name] = (job, versions, [], len(todo))
            self._queue.extend(todo)
            if not todo:
                self._finish_job(job.name)
        return changed

    def _start_ready(self) -> None:
        now = self.clock()
        waiting: deque[_Task] = deque()
        while self._queue and len(self._in_flight) < self.policy.max_in_flight:
            task = self._queue.popleft()
            if task.not_before > now:
                waiting.append(task)
                continue
            # the first try keeps what the store holds (a restart); a retry replaces the failed row
            task.future = self.submit(analyze_file, str(task.file), task.job.name, task.index, str(self.root),
                                      task.attempt == 1, self.limits)
            self._in_flight.append(task)
        self._queue.extendleft(reversed(waiting))

    def _collect(self, stopping: bool) -> None:
        for task in [t for t in self._in_flight if t.future.done()]:
            self._in_flight.remove(task)
            try:
                row = task.future.result()
            except Exception as exc:  # noqa: BLE001 - the task died (its worker was killed, ...)
                if stopping:  # a Ctrl-C reaches the workers too: not the file's fault, tried after the next start
                    self.summary.abandoned += 1
                    continue
                row = {"job": task.job.name, "path": str(task.file), "rank": task.index, "status": "failed",
                       "error": f"task failed: {type(exc).__name__}: {exc}",
                       "key": file_key(str(task.file), f"task-failed:{task.version[1]}:{task.version[2]}")}
            self._settle(task, row)

    def _settle(self, task: _Task, row: dict[str, Any]) -> None:
        error = str(row.get("error") or "")
        transient = row["status"] != "ok" and any(t in error for t in TRANSIENT)
        if transient and task.attempt < self.policy.max_attempts:
            delay = self.policy.retry_s * 2 ** (task.attempt - 1)
            self.summary.retried += 1
            self._say("retry", f"{task.file}: attempt {task.attempt} of {self.policy.max_attempts} failed ({error}); "
                               f"again in {delay:.0f} s")
            self._queue.append(_Task(task.job, task.file, task.index, task.version, task.attempt + 1,
                                     self.clock() + delay))
            return
        if transient:
            row = {**row, "error": f"gave up after {task.attempt} attempts: {error}"}
            write_rows(self.root, "traces", row["key"], [{k: v for k, v in row.items() if k != "skipped"}])
            self.summary.given_up += 1
            self._say("gave up", f"{task.file}: {row['error']}")
        elif row.get("skipped"):
            self.summary.skipped += 1
            self._say("kept", f"{task.file}: already in the store")
        else:
            self.summary.analysed += 1
            self.summary.failed += row["status"] != "ok"
            self._say(row["status"], f"{task.file}" + (f": {error}" if row["status"] != "ok" else ""))
        self._done.add(task.version)
        if not row.get("skipped"):
            self._uncompacted += 1
            self._last_write = self.clock()
        job, versions, rows, left = self._jobs[task.job.name]
        rows.append(row)
        self._jobs[task.job.name] = (job, versions, rows, left - 1)
        if left - 1 == 0:
            self._finish_job(task.job.name)

    def _finish_job(self, name: str) -> None:
        """The job-level results once all its files are in: the reduce over ranks, its hang dumps."""
        job, _, rows, _ = self._jobs.pop(name)
        try:
            _cross_rank(self.root, [job], {job.name: rows}, self.config)
            _hangs(self.root, [job], self.config, self.limits)
        except KinetoscopeError as exc:
            self._say("job", f"{job.name}: job-level results not written: {exc}")

    def _say(self, kind: str, text: str) -> None:
        self.on_event(kind, text)


def _version(file: TraceFile) -> Version:
    size, version = version_of(file)
    return (str(file), size, version)


def _manifests_say_done(job: Job) -> bool:
    """Every rank file is a capture window with its rank's manifest beside it: the capture writes the manifest when
    the run ends, so the job's traces are all there."""
    if not job.files or not all(is_capture_window(f) for f in job.files):
        return False
    for f in job.files:
        rank = rank_from_name(f)
        if rank is None or not f.with_name(manifest_name(rank)).is_file():
            return False
    return True
