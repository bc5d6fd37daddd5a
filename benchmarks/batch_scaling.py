"""Batch throughput on 1 vs 2 local workers, and the per-trace overhead (a benchmark, not a test).

Run: python benchmarks/batch_scaling.py [TRACE] [N]
  TRACE (default: the bundled V100 ResNet-50 trace, 35 MB of JSON) is copied N times (default 16).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from kinetoscope.analyze.ingest.loader import load_trace
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.batch import run_batch

ROOT = Path(__file__).resolve().parents[1]


def timed_batch(folder: Path, workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        summary = run_batch([folder], Path(tmp) / "store", workers=workers)
        elapsed = time.perf_counter() - started
        assert summary.ok == summary.files, summary.lines()
    return elapsed


def main(trace: Path, n: int) -> None:
    t0 = time.perf_counter()
    build_report(load_trace(trace))
    single = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "dump"
        folder.mkdir()
        suffix = ".json.gz" if trace.name.endswith(".gz") else ".json"
        for i in range(n):
            shutil.copy(trace, folder / f"copy{i:03d}{suffix}")
        one = timed_batch(folder, 1)
        two = timed_batch(folder, 2)
    print(f"trace {trace.name}: {single:.2f} s to load and analyse in-process")
    print(f"{n} traces, 1 worker : {one:.1f} s ({one / n:.2f} s/trace)")
    print(f"{n} traces, 2 workers: {two:.1f} s ({two / n:.2f} s/trace), speed-up {one / two:.2f}x")
    print(f"per-trace overhead on 1 worker (batch time / n - in-process time, cluster start included): "
          f"{one / n - single:.2f} s")


if __name__ == "__main__":
    trace = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "sample_traces" / "real" / "v100_resnet50_2021.json.gz"
    main(trace, int(sys.argv[2]) if len(sys.argv) > 2 else 16)
