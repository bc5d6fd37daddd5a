"""A training thread made to wait for a CPU by construction: this process and (``competitor``) a spinning process
are pinned to the same single CPU. Each step spins for W ms of the thread's own CPU time. The script reads the
thread's scheduler statistics itself just inside and just outside each step's body, and the competitor's on-CPU
time inside it, and writes them to ``<out>/probe.json`` beside the capture (``profile_loop``, no window profiled: no
other Python thread runs, so the training thread never blocks in a body).

Usage: python runqueue_wait.py OUT alone|competitor [STEPS] [W_MS]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

out, mode = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
work_ns = int(float(sys.argv[4]) * 1e6) if len(sys.argv) > 4 else 30_000_000

cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})  # this thread (the training thread) and every thread it starts
competitor = None
if mode == "competitor":
    competitor = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys\nos.sched_setaffinity(0, {{{cpu}}})\nsys.stdout.write('r')\n"
         "sys.stdout.flush()\nwhile True:\n    pass\n"], stdout=subprocess.PIPE)
    assert competitor.stdout is not None and competitor.stdout.read(1) == b"r"  # pinned, and spinning from here

fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)


def sched() -> tuple[int, int]:
    time.thread_time_ns()  # the running thread's on-CPU count brought up to date (sched.py)
    fields = os.pread(fd, 128, 0).split()
    return int(fields[0]), int(fields[1])


def competitor_oncpu() -> int:
    if competitor is None:
        return 0
    with open(f"/proc/{competitor.pid}/schedstat", "rb") as fh:
        return int(fh.read().split()[0])


from kinetoscope.capture import profile_loop  # noqa: E402
from kinetoscope.capture.profiler import Schedule  # noqa: E402

rows = []
try:
    before_sched = sched()
    before_perf = time.perf_counter_ns()
    for _ in profile_loop(range(steps), out, schedule=Schedule(skip_first=1000), telemetry=False,
                          hang_watch=False):
        # body start: ours, then the competitor's, then the clock
        s0 = sched()
        c0 = competitor_oncpu()
        p0 = time.perf_counter_ns()
        threads = threading.active_count()
        end = time.thread_time_ns() + work_ns
        while time.thread_time_ns() < end:
            pass
        # body end: the clock, then the competitor's, then ours
        p1 = time.perf_counter_ns()
        c1 = competitor_oncpu()
        s1 = sched()
        rows.append({"s0": s0, "s1": s1, "p0": p0, "p1": p1, "c0": c0, "c1": c1, "threads": threads})
    after_sched = sched()
    after_perf = time.perf_counter_ns()
finally:
    if competitor is not None:
        competitor.kill()
        competitor.wait()
with open(os.path.join(out, "probe.json"), "w") as fh:
    json.dump({"work_ns": work_ns, "cpu": cpu, "rows": rows, "before": [before_sched, before_perf],
               "after": [after_sched, after_perf]}, fh)
