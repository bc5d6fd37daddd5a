"""Load and analysis time per trace (a benchmark, not a test).

Prints a Markdown table: file, uncompressed MB, events loaded (complete events, memory events,
flows), load seconds, full report seconds, end-to-end MB/s.
Run: python benchmarks/load_speed.py [PATH ...]   (default: every trace in ../shared/traces)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kinetoscope.analyze.ingest.loader import find_jobs, load_job, read_bytes
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.errors import KinetoscopeError

ROOT = Path(__file__).resolve().parents[1]


def main(paths: list[Path]) -> None:
    print("| trace | MB (JSON) | events read | X / memory / flows | load s | report s | MB/s end to end |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        for job in find_jobs(path):
            size = sum(len(read_bytes(f)) for f in job.files) / 1e6
            t0 = time.perf_counter()
            try:
                trace = load_job(job)
            except KinetoscopeError as exc:
                print(f"| {path.name} | {size:.1f} | error: {exc} | | | | |")
                continue
            t1 = time.perf_counter()
            build_report(trace)
            t2 = time.perf_counter()
            read = sum(r.meta.n_events for r in trace.ranks)
            x = sum(len(r.events) for r in trace.ranks)
            mem = sum(len(r.memory) for r in trace.ranks)
            flows = sum(len(r.flows) for r in trace.ranks)
            print(f"| {path.name} | {size:.1f} | {read} | {x} / {mem} / {flows} | {t1 - t0:.2f} | {t2 - t1:.2f} "
                  f"| {size / (t2 - t0):.0f} |")


if __name__ == "__main__":
    shared = ROOT.parent / "shared" / "traces"
    default = sorted(p for p in shared.rglob("*.json*") if "trace_filter" not in str(p))
    default.append(shared / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter")
    main([Path(p) for p in sys.argv[1:]] or default)
