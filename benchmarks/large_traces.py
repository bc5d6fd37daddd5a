"""Kinetoscope and HTA side by side on large, realistic traces (a benchmark, not a test).

Builds traces of growing size by replicating a real trace's events K times, each copy shifted in
time past the previous one (correlation, external and flow ids offset so links stay unique;
timestamps rounded to the nanosecond as Kineto writes them), in one of two layouts:
  indented  one key per line, two-space indent: the layout of the real traces we hold (55.6 MB of
            JSON for the 132k-event H100 OWLv2 trace)
  compact   no whitespace at all (36 MB for the same events): the hardest case per byte
then runs, each in its own process so peak memory is measured cleanly (VmHWM of the process,
which includes the ~100 MB of imported libraries), timed whole as a user times them:
  kinetoscope  ``kinetoscope analyze TRACE`` (load + every analysis + the text report)
  HTA 0.5.0    TraceAnalysis load + get_temporal_breakdown + get_idle_time_breakdown
and, inside each process with imports excluded, kinetoscope's load_trace + build_report against the same HTA calls.

Run: python benchmarks/large_traces.py [--source TRACE] [--layout indented|compact] [--no-hta]
                                       [--gzip] [K ...]        (default K = 1 2 4 8)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replicas import load_events, shifted_copy

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = (ROOT.parent / "shared" / "traces" / "TraceLens/tests/traces/h100"
           / "google_owlv2-large-patch14-ensemble__1016001.json.gz")

#: peak RSS of this process image: VmHWM resets at exec (ru_maxrss would carry the forking parent's)
PEAK = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024"

KINETOSCOPE = f"""
import sys, time
from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report
t0 = time.perf_counter()
build_report(load_trace(sys.argv[1]))
print(time.perf_counter() - t0, {PEAK})
"""

KINETOSCOPE_LOAD = f"""
import sys, time
from kinetoscope.analyze.ingest.loader import load_trace
t0 = time.perf_counter()
load_trace(sys.argv[1])
print(time.perf_counter() - t0, {PEAK})
"""

HTA = f"""
import contextlib, io, logging, sys, time
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    a = TraceAnalysis(trace_dir=sys.argv[1])
    a.get_temporal_breakdown(visualize=False)
    try:
        a.get_idle_time_breakdown(visualize=False)
    except Exception:
        pass
print(time.perf_counter() - t, {PEAK})
"""

GUNZIP = """
import sys, time, zlib
t = time.perf_counter()
d = zlib.decompressobj(31)
with open(sys.argv[1], 'rb') as fh:
    while chunk := fh.read(8 << 20):
        d.decompress(chunk)
print(time.perf_counter() - t, 0)
"""


def replicate(source: Path, k: int, out: Path, layout: str) -> int:
    doc, events, span = load_events(source)
    doc["traceEvents"] = [c for i in range(k) for c in shifted_copy(events, i, span)]
    data = (json.dumps(doc, indent=2) if layout == "indented" else json.dumps(doc, separators=(",", ":"))).encode()
    out.write_bytes(data)
    return len(data)


def run(code: str, arg: str) -> tuple[float, int]:
    """(seconds the code timed inside, imports excluded; peak RSS) of ``code`` in its own process."""
    return run_whole(code, arg)[1:]


def run_whole(code: str, arg: str, python: str = sys.executable) -> tuple[float, float, int]:
    """(the whole process's wall seconds as a user times it, imports and interpreter included; the seconds the
    code timed inside; peak RSS)."""
    started = time.perf_counter()
    proc = subprocess.run([python, "-c", code, arg], capture_output=True, text=True, timeout=3600, env=TOOL_ENV)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-500:])
    seconds, rss = proc.stdout.split()[-2:]
    return wall, float(seconds), int(rss)


#: every timed process gets the environment `kinetoscope analyze` sets for itself (no spinning BLAS threads):
#: HTA, the floors, and our command (where it changes nothing)
TOOL_ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}

WRAP = ("import subprocess, sys, time, resource\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
        "w = time.perf_counter() - t\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(w, u.ru_maxrss * 1024, p.returncode, u.ru_utime + u.ru_stime)\n")


def whole_runs(cmd: list[str], runs: int) -> tuple[float, int, list[float], float]:
    """``whole`` run ``runs`` times in a row: (the median wall seconds, the largest peak RSS, every run's seconds,
    the CPU seconds of the run whose wall time is the median). With an even count the median is the lower of the
    two middle runs: one run's own wall and CPU. On a small shared machine one run moves by 15-25%; the median of
    three is what a table should show."""
    seen = sorted(whole_cpu(cmd) for _ in range(max(1, runs)))
    middle = seen[(len(seen) - 1) // 2]  # a run's own wall and CPU, so that their ratio means something
    return middle[0], max(r for _, r, _ in seen), [w for w, _, _ in seen], middle[2]


def whole(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS) of the command's whole process, as a user times it (exit 3, a --fail-on gate, is
    a success here)."""
    return whole_cpu(cmd)[:2]


def whole_cpu(cmd: list[str]) -> tuple[float, int, float]:
    """``whole``, and the CPU seconds (user + system, every thread) the process spent."""
    out = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True, check=True,
                         env=TOOL_ENV).stdout.split()
    if out[2] not in ("0", "3"):
        raise RuntimeError(f"{cmd} exited {out[2]}")
    return float(out[0]), int(out[1]), float(out[3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT)
    ap.add_argument("--layout", choices=("indented", "compact"), default="indented")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-python", default=sys.executable,
                    help="the interpreter to run HTA with (HTA 0.5.0 fails under pandas 3 on large traces: a venv "
                         "with pandas<3)")
    ap.add_argument("--gzip", action="store_true", help="also time the .json.gz of each trace against plain gunzip")
    ap.add_argument("--runs", type=int, default=3, help="whole `kinetoscope analyze` processes per trace; the "
                    "median is shown (HTA runs once)")
    ap.add_argument("k", type=int, nargs="*", default=[1, 2, 4, 8])
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores; source {args.source.name}; layout {args.layout}; kinetoscope: median of "
          f"{args.runs} whole processes")
    print("Whole processes as a user times them (interpreter, imports, load, analyses, exit); the last three "
          "columns: the seconds each timed inside its process, imports excluded.")
    print("| JSON MB | kinetoscope analyze s | MB/s | peak RSS / JSON | HTA s | MB/s | peak RSS / JSON | speed-up "
          "| inside: kinetoscope s | HTA s | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    gz_rows = []
    for k in args.k:
        with tempfile.TemporaryDirectory() as tmp:
            job = Path(tmp) / "job"
            job.mkdir()
            trace = job / "rank-0.json"
            size = replicate(args.source, k, trace, args.layout)
            ks_s, _ = run(KINETOSCOPE, str(trace))
            ks_whole, ks_rss, _, _ = whole_runs([sys.executable, "-m", "kinetoscope", "analyze", str(trace)], args.runs)
            hta = f"not run | | | | {ks_s:.2f} | |"  # the HTA columns, then ours inside, then HTA's
            if not args.no_hta:
                try:
                    hta_whole, hta_s, hta_rss = run_whole(HTA, str(job), args.hta_python)
                    hta = (f"{hta_whole:.1f} | {size / 1e6 / hta_whole:.0f} | {hta_rss / size:.1f}x | "
                           f"**{hta_whole / ks_whole:.1f}x** | {ks_s:.2f} | {hta_s:.1f} | {hta_s / ks_s:.1f}x")
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    hta = f"failed ({str(exc)[:40]}) | | | | {ks_s:.2f} | |"
            print(f"| {size / 1e6:.0f} | {ks_whole:.2f} | **{size / 1e6 / ks_whole:.0f}** | {ks_rss / size:.2f}x "
                  f"| {hta} |",
                  flush=True)
            if args.gzip:
                gz = Path(tmp) / "rank-0.json.gz"
                with open(trace, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                    while chunk := src.read(8 << 20):
                        dst.write(chunk)
                trace.unlink()
                gunzip_s, _ = run(GUNZIP, str(gz))
                load_s, _ = run(KINETOSCOPE_LOAD, str(gz))
                gz_s, gz_rss = run(KINETOSCOPE, str(gz))
                gz_rows.append((size, gz.stat().st_size, gunzip_s, load_s, gz_s, gz_rss))
        time.sleep(0.1)
    if gz_rows:
        print("\n| JSON MB | .gz MB | gunzip alone s (MB/s of JSON) | load from .gz s (MB/s) | load vs gunzip | "
              "load + analyses s (MB/s) | peak RSS / JSON |")
        print("|---|---|---|---|---|---|---|")
        for size, gz_size, gunzip_s, load_s, gz_s, gz_rss in gz_rows:
            print(f"| {size / 1e6:.0f} | {gz_size / 1e6:.1f} | {gunzip_s:.2f} ({size / 1e6 / gunzip_s:.0f}) | "
                  f"{load_s:.2f} ({size / 1e6 / load_s:.0f}) | {gunzip_s / load_s:.0%} | "
                  f"{gz_s:.2f} ({size / 1e6 / gz_s:.0f}) | {gz_rss / size:.2f}x |")


if __name__ == "__main__":
    main()
