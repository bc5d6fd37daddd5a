"""How much work the host's CPUs do together, measured: a what-if that moves work onto other cores (DataLoader
workers) needs it. Cores that share a physical core, a cache or a hypervisor's quota do less together than their
count says (a 2-vCPU cloud VM measured here: ~1.75 cores' worth with both busy), and nothing in a trace says so.

The probe: hashing (which runs without the GIL) on one thread, then on one thread per CPU at once, each for a few
tens of milliseconds, twice, at the end of a capture when the training has stopped. Its answer is the throughput of
all threads together over one thread's: the effective number of cores for compute-bound work. It does not see
contention for memory bandwidth (a decode streaming images), which can slow co-running work further.
"""

from __future__ import annotations

import hashlib
import threading
import time

#: seconds each phase of the probe hashes for (two rounds of one thread, then all threads: ~0.2 s in all)
PHASE_S = 0.04
#: threads the probe starts at most; on a larger host their per-thread efficiency is taken for every CPU
MAX_THREADS = 64
_BLOCK = bytes(range(256)) * 1024  # 256 KiB: hashlib gives the GIL up for the whole block
#: a probe thread waits this long at most for the others to start (then the round is abandoned)
START_TIMEOUT_S = 5.0


def _hash_until(end: list[float], start: threading.Barrier | None, counts: list[int], i: int) -> None:
    """Count the blocks hashed before ``end[0]`` (set when every thread has started): a thread that only gets a
    CPU late counts only what it finished inside the shared window, so busy CPUs are never counted twice."""
    if start is not None:
        try:
            start.wait()
        except threading.BrokenBarrierError:  # another thread did not start: this round is abandoned
            return
    n = 0
    while True:
        hashlib.sha256(_BLOCK).digest()
        if time.perf_counter() > end[0]:
            break
        n += 1
    counts[i] = n


def _alone(seconds: float) -> int:
    counts = [0]
    _hash_until([time.perf_counter() + seconds], None, counts, 0)
    return counts[0]


def _together(threads: int, seconds: float) -> int:
    counts = [0] * threads
    end = [0.0]

    def open_window() -> None:  # run by one thread as the last one arrives: one window for all
        end[0] = time.perf_counter() + seconds

    start = threading.Barrier(threads, action=open_window, timeout=START_TIMEOUT_S)
    workers = [threading.Thread(target=_hash_until, args=(end, start, counts, i), daemon=True,
                                name="kinetoscope-cores-probe") for i in range(threads)]
    started = []
    try:
        for w in workers:
            w.start()
            started.append(w)
    except BaseException:
        start.abort()  # the started ones stop waiting
        raise
    finally:
        for w in started:
            w.join()
    return sum(counts)


def effective_cores(cpus: int | None, seconds: float = PHASE_S) -> float | None:
    """How many cores' work the ``cpus`` CPUs do when all are busy: all threads' hashing throughput over one
    thread's, with one thread per CPU (at most MAX_THREADS, whose per-thread efficiency then stands for every
    CPU); the best of two rounds of each (a neighbour's burst only lowers a round). None for one CPU or an unknown
    count."""
    if not cpus or cpus < 2:
        return None
    threads = min(cpus, MAX_THREADS)
    one, many = 0, 0
    for _ in range(2):
        one = max(one, _alone(seconds))
        many = max(many, _together(threads, seconds))
    if one == 0:
        return None
    return round(min(float(cpus), many / one * cpus / threads), 2)
