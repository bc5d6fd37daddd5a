"""Kinetoscope and HTA side by side on large, realistic traces (a benchmark, not a test).

Builds traces of growing size by replicating a real trace's events K times, each copy shifted in
time past the previous one (correlation and external ids offset so links stay unique), then runs, in
separate processes so peak memory is measured cleanly:
  kinetoscope  load + every analysis (build_report)
  HTA 0.5.0    TraceAnalysis load + get_temporal_breakdown + get_idle_time_breakdown
Run: python benchmarks/large_traces.py [SOURCE] [K ...]   (default: OWLv2 H100 trace, K = 1 2 4)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "traces" / "TraceLens/tests/traces/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"

KINETOSCOPE = """
import resource, sys, time
from kinetoscope.analyze.loader import load_trace
from kinetoscope.analyze.report import build_report
t = time.perf_counter()
build_report(load_trace(sys.argv[1]))
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

HTA = """
import contextlib, io, logging, resource, sys, time
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
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def replicate(source: Path, k: int, out: Path) -> int:
    import gzip

    raw = source.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    copies = []
    for i in range(k):
        for e in events:
            if e.get("ph") == "M" and i:
                continue
            c = dict(e)
            if isinstance(c.get("ts"), (int, float)):
                c["ts"] = c["ts"] + i * span
            if c.get("ph") in ("s", "f") and isinstance(c.get("id"), int):
                c["id"] = c["id"] + i * 10_000_000
            if isinstance(c.get("args"), dict):
                a = dict(c["args"])
                for key in ("correlation", "External id", "external id"):
                    if isinstance(a.get(key), int):
                        a[key] = a[key] + i * 10_000_000
                c["args"] = a
            copies.append(c)
    doc["traceEvents"] = copies
    doc.setdefault("distributedInfo", {"rank": 0, "world_size": 1})
    data = json.dumps(doc).encode()
    out.write_bytes(data)
    return len(data)


def run(code: str, arg: str) -> tuple[float, int]:
    proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-500:])
    seconds, rss = proc.stdout.split()[-2:]
    return float(seconds), int(rss)


def main(source: Path, ks: list[int]) -> None:
    print(f"machine: {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; source {source.name}")
    print("| JSON MB | kinetoscope s | MB/s | peak RSS / JSON | HTA s | MB/s | peak RSS / JSON | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for k in ks:
        with tempfile.TemporaryDirectory() as tmp:
            job = Path(tmp) / "job"
            job.mkdir()
            trace = job / "rank-0.json"
            size = replicate(source, k, trace)
            ks_s, ks_rss = run(KINETOSCOPE, str(trace))
            try:
                hta_s, hta_rss = run(HTA, str(job))
                hta = f"{hta_s:.1f} | {size / 1e6 / hta_s:.0f} | {hta_rss / size:.1f}x | {hta_s / ks_s:.1f}x"
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                hta = f"failed ({str(exc)[:40]}) | | |"
            print(f"| {size / 1e6:.0f} | {ks_s:.1f} | {size / 1e6 / ks_s:.0f} | {ks_rss / size:.1f}x | {hta} |")
        time.sleep(0.1)


if __name__ == "__main__":
    args = sys.argv[1:]
    src = Path(args.pop(0)) if args and not args[0].isdigit() else DEFAULT
    main(src, [int(a) for a in args] or [1, 2, 4])
