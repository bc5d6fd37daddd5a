"""What finishing a trace costs the training process: the training thread's stall and the extra memory,
for a raw export of a given size (default 1 GB), the old way and the new.

Old (before issue 16): the export is read, decoded into Python objects, the telemetry counters appended,
re-encoded and gzipped in memory, all on the training thread. New: the counters are spliced into the JSON
text and the file is gzipped in 8 MiB chunks on a writer thread; the training thread only hands it over.
Each way runs in its own process; peak RSS is that process's VmHWM minus its RSS before finishing.
Run: python benchmarks/capture_finish.py [--size-mb 1024]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

COMMON = """
import gzip, json, os, sys, threading, time
from pathlib import Path
def status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key)) / 1024
raw, final = Path(sys.argv[1]), Path(sys.argv[2])
counters = [{"ph": "C", "name": "GPU 0 telemetry", "pid": "GPU 0", "tid": 0, "ts": 1000.0 * k,
             "args": {"gpu_util_pct": 80.0, "power_w": 250.0}} for k in range(2000)]
before = status("VmRSS")
"""

OLD = COMMON + """
import msgspec
started = time.perf_counter()
data = raw.read_bytes()
doc = msgspec.json.decode(data)
doc.setdefault("traceEvents", []).extend(counters)
data = msgspec.json.encode(doc)
final.write_bytes(gzip.compress(data, compresslevel=3))
stall = time.perf_counter() - started
print(json.dumps({"stall_s": stall, "total_s": stall, "extra_mb": status("VmHWM") - before}))
"""

NEW = COMMON + """
from kinetoscope.capture.output import TraceWriter
writer = TraceWriter()
started = time.perf_counter()
writer.submit(raw, final, extra_events=counters, distributed_info=None)
stall = time.perf_counter() - started
writer.close()
total = time.perf_counter() - started
print(json.dumps({"stall_s": stall, "total_s": total, "extra_mb": status("VmHWM") - before}))
"""


def make_raw(path: Path, size: int) -> None:
    """A Kineto-shaped export: metadata, then traceEvents of kernels, runtime calls and ops, then trailing keys."""
    with open(path, "w") as fh:
        fh.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "GPU"}],\n  "traceEvents": [\n')
        i = 0
        written = 0
        while written < size:
            t = i * 10.0
            block = (f'  {{"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>", '
                     f'"pid": 0, "tid": 7, "ts": {t:.3f}, "dur": 4.512, "args": {{"device": 0, "stream": 7, '
                     f'"correlation": {i}, "grid": [120, 1, 1], "block": [128, 1, 1]}}}},\n'
                     f'  {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
                     f'"ts": {t - 5:.3f}, "dur": 3.101, "args": {{"correlation": {i}, "cbid": 211}}}},\n')
            fh.write(block)
            written += len(block)
            i += 1
        fh.write('  {"ph": "X", "cat": "cpu_op", "name": "last", "pid": 1, "tid": 1, "ts": 0, "dur": 1}\n  ],\n'
                 '  "traceName": "bench", "baseTimeNanoseconds": 1700000000000000000\n}\n')


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--only", choices=("old", "new"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kinetoscope-finish-") as tmp:
        raw = Path(tmp) / "raw.json"
        print("| way | raw export | training thread stall s | total s | extra memory MB |")
        print("|---|---|---|---|---|")
        for way, code in (("old", OLD), ("new", NEW)):
            if args.only and way != args.only:
                continue
            make_raw(raw, args.size_mb * 2**20)
            size = raw.stat().st_size
            final = str(Path(tmp) / "final.json.gz")
            out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(raw), final],
                                 capture_output=True, text=True, timeout=3600)
            if out.returncode:
                print(f"| {way} | {size / 2**20:,.0f} MiB | failed: {out.stderr.strip().splitlines()[-1][:80]} | | |")
                continue
            r = json.loads(out.stdout)
            print(f"| {way} | {size / 2**20:,.0f} MiB | {r['stall_s']:.3f} | {r['total_s']:.1f} "
                  f"| {r['extra_mb']:,.0f} |")


if __name__ == "__main__":
    main()
