"""The training thread's scheduler statistics: how long it ran, and how long it was runnable with no CPU.

Linux keeps, per thread, ``/proc/<pid>/task/<tid>/schedstat``: the time on a CPU (ns), the time spent runnable on
a run queue waiting for one (ns), and the number of timeslices run. The file is opened once, on the training
thread (``/proc/thread-self``: the descriptor stays bound to that thread, whichever thread reads it later), and read
with ``pread`` at each step boundary (about 3 us a read from Python, measured: BENCHMARKS.md).

The kernel brings a *running* thread's on-CPU count up to date only at a scheduler tick or switch, so a thread
reading its own file sees it up to a tick (1-10 ms) old; ``time.thread_time_ns()`` updates it first (the clock
reads it through the scheduler), so the two numbers are the thread's own as of the read. The run-queue wait is
added when the thread gets a CPU: for the running thread it is exact.

Where the file cannot be read (not Linux, a kernel without scheduler statistics, which shows ``0 0 0``), nothing
is recorded and the reason is kept (``why_not``): the step lists are null, never 0.
"""

from __future__ import annotations

import os
import time

SCHEDSTAT = "/proc/thread-self/schedstat"


class ThreadSchedStat:
    """The opening thread's (on-CPU ns, run-queue wait ns), read on demand."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        self.fd: int | None = None
        #: why nothing is recorded (None: it is)
        self.why_not: str | None = None
        try:
            self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except (OSError, AttributeError) as exc:
            self.why_not = f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc}): not Linux, or no /proc"
            return
        first = self.read()
        if first is None or first == (0, 0):
            self.close()
            self.why_not = f"{path} holds no scheduler statistics (the kernel keeps none: it reads 0 0 0)"

    def read(self) -> tuple[int, int] | None:
        """(on-CPU ns, run-queue wait ns) of the thread so far; None where it cannot be read."""
        fd = self.fd
        if fd is None:
            return None
        time.thread_time_ns()  # brings the kernel's on-CPU count up to date when the thread reads its own file
        try:
            fields = os.pread(fd, 128, 0).split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def involuntary_switches() -> int | None:
    """The process's involuntary context switches so far (every thread; ``getrusage``); None where unknown."""
    try:
        import resource
    except ImportError:  # not Unix
        return None
    try:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)
    except (OSError, ValueError):
        return None
