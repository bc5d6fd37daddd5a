"""Event-dense traces (a launch-bound loop, benchmarks/dense_trace.py) analysed as a user times it: the whole
``kinetoscope analyze`` process on the plain JSON and on its gzip, beside the physical limits measured in the same
run (reading the file; zlib alone decompressing the .gz), with peak RSS, the start-up (imports) and the time of
every analyzer. With ``--hta``, HolisticTraceAnalysis 0.5.0's whole process too (``TraceAnalysis`` load + temporal
breakdown + idle-time breakdown, imports included, as for us), on the same plain JSON.

    python benchmarks/dense_speed.py [--hta [--hta-python PYTHON]] [--runs N] [MB ...]      (default: 50 200 357)

Each whole process of ours runs N times (default 3) and the median is shown; beside them, the floors measured in
the same run: the stack's start-up (interpreter, numpy, pandas), the scan process (the interpreter, numpy and the
compiled scanner on the file), reading
the file, zlib alone on the .gz. A last table sets each process's CPU seconds (user + system, every thread) beside
the CPU time a goal's wall time leaves on this machine's cores: no process ends sooner than its CPU work spread over
every core.

HTA 0.5.0 under pandas 3 fails on traces of more than ~32k events of a kind (an int16 cast); ``--hta-python``
runs it with another interpreter, e.g. a venv holding ``HolisticTraceAnalysis==0.5.0 "pandas<3"``.
"""

from __future__ import annotations

import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dense_trace import write_dense_trace  # noqa: E402
from large_traces import HTA, TOOL_ENV, whole, whole_runs  # noqa: E402  (the same HTA calls as the real-trace replicas get)

MB_PER_STEP = 95.13 / 227  # dense_trace.py, 200 kernels per step

INSIDE = """
import sys, time
t0 = time.perf_counter()
from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.render.text import render_text
t1 = time.perf_counter()
trace = load_trace(sys.argv[1])
t2 = time.perf_counter()
report = build_report(trace)
t3 = time.perf_counter()
render_text(report)
t4 = time.perf_counter()
parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(report.timings_s.items(), key=lambda kv: -kv[1]) if v >= 0.005)
print(f"imports {t1 - t0:.2f} s, load {t2 - t1:.2f} s, analyses {t3 - t2:.2f} s ({parts}), text {t4 - t3:.2f} s")
"""


#: the floor under any whole process of ours: the interpreter, numpy and pandas imported as the command imports them
STACK = ("from kinetoscope.cli.process import import_pandas_without_pyarrow\n"
         "import_pandas_without_pyarrow()\n"
         "import numpy, pandas\n")
#: the scan process: the interpreter, numpy and the compiled scanner on the file (both threads); no tables, no pandas
SCAN = ("import sys\nfrom pathlib import Path\nfrom kinetoscope.analyze.ingest.scan import scan_file\n"
        "scan_file(Path(sys.argv[1]))\n")
#: the CPU seconds of scan_file alone, inside a process that has imported what it needs first (numpy, msgspec):
#: the scan process above also pays for starting the interpreter and those imports
SCAN_CPU = ("import sys, time\nimport numpy, msgspec\nfrom pathlib import Path\nfrom kinetoscope.analyze import raw\n"
            "from kinetoscope.analyze.ingest.scan import scan_file\n"
            "t = time.process_time()\nscan_file(Path(sys.argv[1]))\nprint(time.process_time() - t)\n")


def read_s(path: Path) -> float:
    t = time.perf_counter()
    with open(path, "rb") as fh:
        while fh.read(8 << 20):
            pass
    return time.perf_counter() - t


def zlib_s(path: Path) -> float:
    t = time.perf_counter()
    d = zlib.decompressobj(31)
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            d.decompress(chunk)
    return time.perf_counter() - t


def main(sizes: list[float], hta: bool = False, hta_python: str = sys.executable, runs: int = 3) -> None:
    stack, _, _, stack_cpu = whole_runs([sys.executable, "-c", STACK], runs)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    print(f"Whole processes, medians of {runs} (HTA: one run). The stack's own start-up (interpreter, numpy and "
          f"pandas as the command imports them), a floor under every row: {stack:.2f} s\n")
    print("| JSON | events | whole process, plain | MB/s | peak RSS / JSON | scan process | read file | .gz "
          "| whole process, .gz | zlib alone | .gz / zlib |"
          + (" HTA whole process | HTA peak RSS / JSON | HTA / us |" if hta else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if hta else ""))
    details, cpu_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in sizes:
            steps = max(1, round(mb / MB_PER_STEP))
            plain = Path(tmp) / f"dense-{steps}.json"
            size = write_dense_trace(plain, steps)
            gz = Path(tmp) / f"dense-{steps}.json.gz"
            with open(plain, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                while chunk := src.read(8 << 20):
                    dst.write(chunk)
            events = steps * (1 + 200 * 7)
            read_s(plain)  # warm the page cache as a user's second run would find it
            r = read_s(plain)
            w, rss, _, cpu = whole_runs([sys.executable, "-m", "kinetoscope", "analyze", str(plain)], runs)
            scan_s, _, _, scan_cpu = whole_runs([sys.executable, "-c", SCAN, str(plain)], runs)
            scanner_cpu = statistics.median(
                float(subprocess.run([sys.executable, "-c", SCAN_CPU, str(plain)], capture_output=True, text=True,
                                     check=True, env=TOOL_ENV).stdout) for _ in range(runs))
            z = statistics.median(zlib_s(gz) for _ in range(runs))
            wg, _, _, gz_cpu = whole_runs([sys.executable, "-m", "kinetoscope", "analyze", str(gz)], runs)
            cpu_rows.append((size, w, cpu, scan_cpu, scanner_cpu, wg, gz_cpu, z))
            versus = ""
            if hta:  # HTA reads a directory of traces: the plain file alone in one
                alone = Path(tmp) / f"hta-{steps}"
                alone.mkdir()
                (alone / plain.name).hardlink_to(plain)
                try:
                    hw, hrss = whole([hta_python, "-c", HTA, str(alone)])
                    versus = f" {hw:.1f} s | {hrss / size:.2f}x | **{hw / w:.1f}x** |"
                except (RuntimeError, subprocess.CalledProcessError) as exc:
                    versus = f" failed ({str(exc)[:40]}) | | |"
                (alone / plain.name).unlink()
            print(f"| {size / 1e6:,.0f} MB | {events / 1e6:.2f}M | {w:.2f} s | {size / 1e6 / w:,.0f} "
                  f"| {rss / size:.2f}x "
                  f"| {scan_s:.2f} s | {r:.2f} s | {gz.stat().st_size / 1e6:,.1f} MB | {wg:.2f} s | {z:.2f} s "
                  f"| {wg / z:.1f}x |{versus}",
                  flush=True)
            inside = subprocess.run([sys.executable, "-c", INSIDE, str(plain)], capture_output=True, text=True,
                                    check=True).stdout.strip()
            details.append(f"{size / 1e6:,.0f} MB: {inside}")
            plain.unlink()
            gz.unlink()
    print()
    for line in details:
        print(line)
    # What the goals ask of the CPUs: a process cannot end sooner than its CPU work spread over every core. The
    # goals' wall times, times the cores, are the CPU seconds they leave for the whole process.
    print(f"\nCPU seconds (user + system, every thread; each the CPU of the median-wall run of {runs}) against what "
          f"the goals leave on {cpus} cores. The stack's start-up alone: {stack_cpu:.2f} CPU s. The scan process: "
          "the interpreter, numpy and the scan; scan_file alone: the same scan after those imports.\n")
    print("| JSON | plain: wall | CPU | cores busy | goal 300 MB/s: wall | CPU it leaves | .gz: wall | CPU "
          "| goal 1.5x zlib: wall | CPU it leaves | scan process: CPU | scan_file alone: CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, w, cpu, scan_cpu, scanner_cpu, wg, gz_cpu, z in cpu_rows:
        goal, goal_gz = size / 300e6, 1.5 * z
        plain_goal = f"{goal:.2f} s | {goal * cpus:.2f} s" if size >= 200e6 else "(from 200 MB) | "
        print(f"| {size / 1e6:,.0f} MB | {w:.2f} s | {cpu:.2f} s | {cpu / w:.2f} | {plain_goal} "
              f"| {wg:.2f} s | {gz_cpu:.2f} s | {goal_gz:.2f} s | {goal_gz * cpus:.2f} s | {scan_cpu:.2f} s "
              f"| {scanner_cpu:.2f} s |")


if __name__ == "__main__":
    argv = sys.argv[1:]
    python = sys.executable
    if "--hta-python" in argv:
        i = argv.index("--hta-python")
        python = argv[i + 1]
        del argv[i:i + 2]
    runs = 3
    if "--runs" in argv:
        i = argv.index("--runs")
        runs = int(argv[i + 1])
        del argv[i:i + 2]
    sizes = [float(a) for a in argv if a != "--hta"]
    main(sizes or [50.0, 200.0, 357.0], hta="--hta" in argv, hta_python=python, runs=runs)
