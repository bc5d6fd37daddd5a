"""Reopening a parsed trace from the columnar cache versus parsing it (a benchmark, not a test).

Run: python benchmarks/cache_reopen.py [TRACE ...]   (default: the 55.6 MB OWLv2 and 35 MB V100 traces)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from kinetoscope.analyze.ingest.loader import load_trace, read_bytes

ROOT = Path(__file__).resolve().parents[1]


def main(paths: list[Path]) -> None:
    print("| trace | JSON MB | parse s | reopen from cache s | reopen GB/s of JSON |")
    print("|---|---|---|---|---|")
    for path in paths:
        size = len(read_bytes(path)) / 1e9
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            load_trace(path, cache=Path(tmp))
            parse = time.perf_counter() - t0
            best = min(_timed(lambda p=path, c=Path(tmp): load_trace(p, cache=c)) for _ in range(3))
        print(f"| {path.name} | {size * 1000:.1f} | {parse:.2f} | {best:.3f} | {size / best:.2f} |")


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    shared = ROOT.parent / "shared" / "traces"
    default = [shared / "TraceLens/tests/traces/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz",
               ROOT / "sample_traces/real/v100_resnet50_2021.json.gz"]
    main([Path(p) for p in sys.argv[1:]] or [p for p in default if p.exists()])
