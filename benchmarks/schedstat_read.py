"""What the capture's scheduler statistics cost per step: ``ThreadSchedStat.read()`` (``time.thread_time_ns()``, a
``pread`` of /proc/thread-self/schedstat and its parse) and ``involuntary_switches()`` (``getrusage``), each done
twice per step (at the step's end and at the next one's start).

Usage: python benchmarks/schedstat_read.py [N]   (N reads per measurement, default 20000; 5 measurements)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from kinetoscope.capture.sched import ThreadSchedStat, involuntary_switches


def per_call_ns(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    stat = ThreadSchedStat()
    if stat.why_not:
        print(f"not recorded here: {stat.why_not}")
        return
    reads = [per_call_ns(stat.read, n) for _ in range(5)]
    switches = [per_call_ns(involuntary_switches, n) for _ in range(5)]
    per_step = 2 * (statistics.median(reads) + statistics.median(switches))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {n} calls x 5")
    print(f"ThreadSchedStat.read(): median {statistics.median(reads) / 1000:.2f} us (min {min(reads) / 1000:.2f})")
    print(f"involuntary_switches(): median {statistics.median(switches) / 1000:.2f} us "
          f"(min {min(switches) / 1000:.2f})")
    print(f"per step (two of each): {per_step / 1000:.1f} us")


if __name__ == "__main__":
    main()
