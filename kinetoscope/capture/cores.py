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
#: threads the probe starts at most (a 192-CPU host: 64 threads tell as much)
MAX_THREADS = 64
_BLOCK = bytes(range(256)) * 1024  # 256 KiB: hashlib gives the GIL up for the whole block


def _hash_for(seconds: float, start: threading.Barrier | None, counts: list[int], i: int) -> None:
    if start is not None:
        start.wait()
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        hashlib.sha256(_BLOCK).digest()
        n += 1
    counts[i] = n


def _together(threads: int, seconds: float) -> int:
    counts = [0] * threads
    start = threading.Barrier(threads)
    workers = [threading.Thread(target=_hash_for, args=(seconds, start, counts, i), daemon=True)
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts)


def effective_cores(cpus: int | None, seconds: float = PHASE_S) -> float | None:
    """All threads' hashing throughput over one thread's, with one thread per CPU (at most MAX_THREADS); the best of
    two rounds of each (a neighbour's burst only lowers a round). None for one CPU or an unknown count."""
    if not cpus or cpus < 2:
        return None
    threads = min(cpus, MAX_THREADS)
    one, many = 0, 0
    for _ in range(2):
        counts = [0]
        _hash_for(seconds, None, counts, 0)
        one = max(one, counts[0])
        many = max(many, _together(threads, seconds))
    if one == 0:
        return None
    return round(min(float(threads), many / one), 2)
