"""What a hang needs, armed while the job runs: torch's flight recorder, and a watchdog that writes each rank's
``rank-<r>.hang.json`` (``kinetoscope.hangdump``) when the job stops moving.

The watchdog is one daemon thread. It writes the dump when no step has ended for the hang timeout (default: the
larger of ``HANG_FLOOR_S`` and ``STEP_MULTIPLE`` times the median of the last steps; before the first step ends, at
least ``HANG_FLOOR_S``: start-up is slow on a loaded host), on SIGUSR1 (on demand), on
SIGTERM (a launcher stopping the job) and when an exception ends the training thread; it never stops the job
(on SIGTERM the process then ends as the signal would have). The training thread pays nothing between steps: the
watchdog reads the step clock the profiler keeps anyway.

A rank stuck in a collective holds its main thread in C++, where no Python signal handler runs: the watchdog hears
the signals through ``signal.set_wakeup_fd`` (a byte per signal, written by the C handler), when no one else uses it.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kinetoscope.capture._safety import warn_once
from kinetoscope.hangdump import (
    MAX_FRAMES,
    MAX_STEP_TIMES,
    MAX_TEXT,
    MAX_THREADS,
    Frame,
    HangDump,
    RaisedException,
    ThreadStack,
    hang_dump_name,
)

#: torch's flight recorder capacity (entries per process); read when the first process group is made
FR_ENV = "TORCH_FR_BUFFER_SIZE"
FR_ENV_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"
DEFAULT_FR_ENTRIES = 2000
#: the default timeout: never below a few minutes (a checkpoint, an evaluation), nor below many median steps
HANG_FLOOR_S = 300.0
STEP_MULTIPLE = 20
#: how long a SIGTERM'd rank waits for its main thread to run its own SIGTERM handler before it ends as the
#: signal would have (a main thread held in C++ by a collective never will)
SIGTERM_GRACE_S = 5.0

#: (steps ended or None, perf_counter_ns of the last step's end or None, the last steps' wall times in ns)
Progress = Callable[[], "tuple[int | None, int | None, list[int]]"]


def arm_flight_recorder(entries: int) -> int | None:
    """Size torch's flight recorder (``entries``; 0: off), unless the user chose its size; gives the size in force
    (None: off or unknown). torch 2.13 keeps 2,000 entries when nothing is set, and reads the size when it records,
    so this holds even after ``init_process_group`` (checked with gloo)."""
    for name in (FR_ENV, FR_ENV_OLD):
        chosen = os.environ.get(name)
        if chosen is not None:
            return int(chosen) if chosen.strip().isdigit() and int(chosen) > 0 else None
    os.environ[FR_ENV] = str(max(entries, 0))
    return entries if entries > 0 else None


def default_timeout_s(step_wall_ns: list[int]) -> float:
    """The larger of ``HANG_FLOOR_S`` and ``STEP_MULTIPLE`` median steps."""
    if not step_wall_ns:
        return HANG_FLOOR_S
    return max(HANG_FLOOR_S, STEP_MULTIPLE * statistics.median(step_wall_ns) / 1e9)


class HangWatch:
    """The watchdog of one process. ``timeout_s``: None for the default rule, 0 for no timeout (signals and
    exceptions still write a dump). ``on_sigterm_owned``: whether the process's SIGTERM handler is capture's own
    (then, a main thread that does not run it within ``SIGTERM_GRACE_S``, the watchdog ends the process as
    SIGTERM would have); ``terminating``: tells whether that handler has started."""

    def __init__(self, out_dir: str | os.PathLike[str], progress: Progress, *, timeout_s: float | None = None,
                 fr_entries: int | None = None, terminating: Callable[[], bool] | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.progress = progress
        self.timeout_s = timeout_s
        self.fr_entries = fr_entries
        self._terminating = terminating
        self.training_ident = threading.get_ident()
        self._started_ns = time.perf_counter_ns()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rsock: socket.socket | None = None
        self._wsock: socket.socket | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._handlers: dict[int, Any] = {}
        self._dumped_at_step: int | None = -1  # the stall already written (its step count): once per stall
        self.sigterm_dumped = threading.Event()
        self._terminating_here = False
        #: (steps ended,) when the watchdog wrote the stall in progress
        self._stall_written: tuple[int | None] | None = None
        self._seen_steps = False
        self._written = False
        self._exception_written = False
        self.owns_sigterm = False
        self._sigterm_handler: Any = None
        #: the threads inside ``dump`` now (before they take the lock): a signal handler that interrupted its own
        #: thread's dump must not wait on that lock
        self._dumping: set[int] = set()
        #: the threads holding SIGTERM back (inside ``dump``, or an excepthook's dump and traceback), how deep: a
        #: SIGTERM handler that interrupted them must not end the process before they are done
        self._holding: dict[int, int] = {}
        self._sigterm_deferred = False

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._listen_to_signals()
        self._thread = threading.Thread(target=self._run, name="kinetoscope-hangwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._wsock is not None:
            try:
                self._wsock.send(b"\0")
            except OSError:
                pass
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self._previous_handlers.items():
                try:
                    if signal.getsignal(sig) is self._handlers.get(sig):
                        signal.signal(sig, handler)
                except (ValueError, OSError):
                    pass
            if self._wsock is not None:
                try:
                    current = signal.set_wakeup_fd(-1)
                    if current != self._wsock.fileno():  # someone else's since: theirs stays
                        signal.set_wakeup_fd(current)
                except (ValueError, OSError):
                    pass

    def _listen_to_signals(self) -> None:
        """SIGUSR1 (ours where the script has none) and SIGTERM (ours where it is SIG_DFL) write a dump."""
        try:
            self._rsock, self._wsock = socket.socketpair()
            self._wsock.setblocking(False)
            previous = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
            if previous != -1:  # someone's (asyncio's): theirs stays, we hear signals only when Python runs
                signal.set_wakeup_fd(previous)
                self._wsock.close()
                self._rsock.close()
                self._rsock = self._wsock = None
        except (ValueError, OSError):
            self._rsock = self._wsock = None
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            def on_usr1(signum: int, frame: Any) -> None:
                if self._rsock is None:  # no wakeup byte: the main thread runs Python, and writes it itself
                    self.dump("SIGUSR1")

            self._handlers[signal.SIGUSR1] = on_usr1
            self._previous_handlers[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, on_usr1)

    def own_sigterm(self, handler: Any) -> None:
        """``handler``, the process's SIGTERM handler, is capture's (it calls ``on_sigterm`` first)."""
        self.owns_sigterm = True
        self._sigterm_handler = handler

    def take_sigterm(self) -> None:
        """Where SIGTERM has its default action (a ``Profiler`` in a script without a handler): a handler that
        writes the dump, then ends the process as the signal would have (exit status 143)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_term(signum: int, frame: Any) -> None:
            if self.defer_sigterm() or self._terminating_here:  # held back; or sent twice: once is enough
                return
            self._terminating_here = True
            self.on_sigterm()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        self._terminating = lambda: self._terminating_here
        self._handlers[signal.SIGTERM] = on_term
        self._previous_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_term)
        self.own_sigterm(on_term)

    def defer_sigterm(self) -> bool:
        """First in capture's SIGTERM handlers: True where the handler interrupted its own thread's dump, or an
        excepthook's dump and traceback (the launcher stops the job while the rank writes why it left). The handler
        then returns at once; once they are done, capture's handler runs again and ends the process."""
        if self._holding.get(threading.get_ident()):
            self._sigterm_deferred = True
            return True
        return False

    def on_uncaught(self, exc: BaseException, then: Callable[[], None]) -> None:
        """An excepthook's part: the rank's dump for the exception that ends it (the other ranks will wait for this
        one: say why it left), then ``then`` (the hook before capture's, which prints the traceback), a launcher's
        SIGTERM (a peer gone) held back over both."""
        with self.holding_sigterm():
            self.dump("exception", exc=exc)
            then()

    @contextmanager
    def holding_sigterm(self) -> Iterator[None]:
        """SIGTERM held back in this thread while the block runs (a dump, an excepthook's dump and the traceback it
        prints), then handled: by capture's own handler, called directly (a script's handler that chains to
        capture's has run once already, and must not run twice)."""
        me = threading.get_ident()
        self._holding[me] = self._holding.get(me, 0) + 1
        try:
            yield
        finally:
            depth = self._holding.pop(me) - 1
            if depth:
                self._holding[me] = depth
            elif self._sigterm_deferred and me == threading.main_thread().ident:
                self._sigterm_deferred = False
                handler = self._sigterm_handler
                if callable(handler):
                    handler(signal.SIGTERM, None)
                else:
                    os.kill(os.getpid(), signal.SIGTERM)

    def on_sigterm(self) -> None:
        """Capture's SIGTERM handler, in the main thread: the dump written (by the watchdog, which heard the
        signal first, or here) before the process goes on to end."""
        if self._rsock is not None and self._thread is not None and self._thread.is_alive():
            if self.sigterm_dumped.wait(SIGTERM_GRACE_S):
                return
        self.dump("SIGTERM")

    # --- the watchdog --------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            tick = 1.0 if self.timeout_s is None or self.timeout_s == 0 else min(1.0, max(self.timeout_s / 8, 0.05))
            try:
                if self._rsock is not None:
                    ready, _, _ = select.select([self._rsock], [], [], tick)
                    if ready:
                        for signum in self._rsock.recv(64):
                            self._on_signal(signum)
                else:
                    self._stop.wait(tick)
                if self._stop.is_set():
                    return
                self._check_progress()
            except Exception as exc:  # noqa: BLE001 - the watchdog never harms training
                warn_once("hang watchdog", f"hang watchdog failed ({type(exc).__name__}: {exc}); training continues")
                return

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGUSR1:
            self.dump("SIGUSR1")
        elif signum == signal.SIGTERM and self.owns_sigterm:
            if signal.getsignal(signal.SIGTERM) is not self._sigterm_handler:
                return  # the program put its own handler in since (torchrun's launcher does): its SIGTERM, not ours
            self.dump("SIGTERM")
            self.sigterm_dumped.set()
            deadline = time.monotonic() + SIGTERM_GRACE_S
            while time.monotonic() < deadline:
                if self._terminating is not None and self._terminating():
                    return  # the main thread runs capture's handler: it ends the process
                time.sleep(0.05)
            _end_as_sigterm()  # the main thread is held (in a collective)

    def _check_progress(self) -> None:
        steps, last_ns, walls = self.progress()
        if steps is None and self._seen_steps:
            return  # the profiler has gone (the run is finishing): no step clock, no stall to tell
        self._seen_steps = self._seen_steps or steps is not None
        timeout = self.timeout_s if self.timeout_s is not None else default_timeout_s(walls)
        if not timeout:
            return
        if steps is None:  # start-up (imports, the first batches, compilation): never a stall before HANG_FLOOR_S
            timeout = max(timeout, HANG_FLOOR_S)
        since = (time.perf_counter_ns() - (last_ns if last_ns is not None else self._started_ns)) / 1e9
        if since < timeout:
            self._dumped_at_step = -1
            self._stall_written = None
            return
        if self._dumped_at_step == steps:
            return  # this stall is written
        self._dumped_at_step = steps
        self.dump("watchdog", timeout_s=timeout)

    # --- the dump ------------------------------------------------------------------------------------------
    def dump(self, reason: str, *, exc: BaseException | None = None, timeout_s: float | None = None) -> Path | None:
        """Write ``rank-<r>.hang.json`` (write and rename); never raises. Only in a process that trains: one that
        made a process group or ended a step (a launcher such as torchrun does neither)."""
        me = threading.get_ident()
        if me in self._dumping:
            return None  # a signal handler interrupted this thread's own dump: that one is being written
        with self.holding_sigterm():
            self._dumping.add(me)
            try:
                return self._dump(reason, exc, timeout_s)
            finally:
                self._dumping.discard(me)

    def _dump(self, reason: str, exc: BaseException | None, timeout_s: float | None) -> Path | None:
        # under the lock from the check to the flags: a SIGTERM dump waiting on an exception's dump in progress
        # finds it written, and leaves it (checked outside, it replaced the cause with the teardown)
        with self._lock:
            steps = self.progress()[0]
            if steps is None and not _in_process_group():
                return None
            if reason != "SIGUSR1" and (self._stall_written == (steps,) or self._exception_written
                                        or (steps is None and self._seen_steps and self._written)):
                # what a SIGTERM or an error finds after the watchdog wrote the stall, after the training thread
                # raised, or while the run finishes (no step clock any more), is the job coming apart (a peer gone
                # completes the others' collectives with an error): the dump already written stays
                return self.out_dir / hang_dump_name(_rank())
            self._seen_steps = self._seen_steps or steps is not None
            try:
                path = self._write(self._build(reason, exc, timeout_s))
            except Exception as error:  # noqa: BLE001
                warn_once("hang dump",
                          f"could not write a hang dump ({type(error).__name__}: {error}); training continues")
                return None
            self._written = True
            self._exception_written = self._exception_written or reason == "exception"
            if reason == "watchdog":
                self._stall_written = (steps,)
            return path

    def _build(self, reason: str, exc: BaseException | None, timeout_s: float | None) -> HangDump:
        from kinetoscope.capture.dist import rank_info

        info = rank_info()
        steps, last_ns, walls = self.progress()
        since = (time.perf_counter_ns() - (last_ns if last_ns is not None else self._started_ns)) / 1e9
        walls = list(walls[-MAX_STEP_TIMES:])
        fr, note = _flight_recorder()
        threads = _thread_stacks(self.training_ident)
        return HangDump(
            rank=info.rank, world_size=info.world_size, local_rank=info.local_rank, pid=os.getpid(), reason=reason,
            written_unix_ns=time.time_ns(),
            timeout_s=timeout_s if timeout_s is not None else (self.timeout_s or None),
            steps_ended=steps, seconds_since_progress=round(since, 3), recent_step_wall_ns=walls,
            median_step_ns=int(statistics.median(walls)) if walls else None,
            threads=threads[:MAX_THREADS], threads_omitted=max(0, len(threads) - MAX_THREADS),
            exception=_raised(exc) if exc is not None else None,
            flight_recorder=fr, flight_recorder_note=note, flight_recorder_entries=self.fr_entries,
        )

    def _write(self, dump: HangDump) -> Path:
        from kinetoscope.capture.output import redacted
        from kinetoscope.fsutil import atomic_write

        data = dump.to_json()
        try:
            data = redacted(data)
        except Exception:  # noqa: BLE001 - no redaction: no text that could hold a secret leaves the process
            for t in dump.threads:
                for f in t.frames:
                    f.code = None
            if dump.exception is not None:
                dump.exception.message = "(left out: the redaction could not run)"
                for f in dump.exception.frames:
                    f.code = None
            data = dump.to_json()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / hang_dump_name(dump.rank)
        atomic_write(path, data)
        return path


def _rank() -> int:
    from kinetoscope.capture.dist import rank_info

    return rank_info().rank


def _in_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is not None and bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _end_as_sigterm() -> None:
    """End the process as SIGTERM's default action would (killed by signal 15), from a thread that is not the main
    one (where ``signal.signal`` cannot run): the C library's ``signal`` puts the default action back."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal(int(signal.SIGTERM), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
    finally:
        os._exit(128 + int(signal.SIGTERM))


def _flight_recorder() -> tuple[dict[str, Any] | None, str | None]:
    """torch's flight recorder as JSON (never its pickle), and why not where it cannot be read."""
    import json

    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None, "torch.distributed was never imported"
    try:
        if not dist.is_available() or not dist.is_initialized():
            return None, "no process group"
        from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]

        doc = json.loads(_dump_fr_trace_json(True, False))
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"[:MAX_TEXT]
    if not isinstance(doc, dict):
        return None, "the flight recorder gave no JSON object"
    if not doc.get("entries"):
        return doc, f"no entries: the recorder is off ({FR_ENV} unset or 0 when the process group was made)"
    return doc, None


def _frames(summary: traceback.StackSummary) -> list[Frame]:
    return [Frame(file=f.filename[-MAX_TEXT:], line=f.lineno, function=f.name[:MAX_TEXT],
                  code=(f.line or None) and f.line[:MAX_TEXT]) for f in summary]


def _thread_stacks(training_ident: int) -> list[ThreadStack]:
    """Every thread's stack, innermost frame first, the training thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the watchdog itself
        walked = list(traceback.walk_stack(frame))
        summary = traceback.StackSummary.extract(iter(walked[:MAX_FRAMES]), lookup_lines=True)
        out.append(ThreadStack(ident=ident, name=names.get(ident), training=ident == training_ident,
                               frames=_frames(summary), frames_omitted=max(0, len(walked) - MAX_FRAMES)))
    out.sort(key=lambda t: (not t.training, t.ident))
    return out


def _raised(exc: BaseException) -> RaisedException:
    tb = list(traceback.walk_tb(exc.__traceback__))[::-1]  # innermost first
    summary = traceback.StackSummary.extract(iter(tb[:MAX_FRAMES]), lookup_lines=True)
    return RaisedException(type=type(exc).__name__, message=str(exc)[:MAX_TEXT], frames=_frames(summary))
