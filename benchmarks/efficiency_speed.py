"""What keeping shapes and counting FLOPs costs: load, the efficiency analyzer, and the whole report, on one trace.

    python benchmarks/efficiency_speed.py [TRACE] [--runs N]

Default trace: the largest shared trace with shapes (the 63 MB xdit FLUX.1 capture on MI300X). Each stage's
median and minimum over ``--runs`` runs, in-process, after one warm-up run. Run it in two checkouts (before and after
a change) to compare; BENCHMARKS.md has the numbers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = next((p for p in (ROOT.parent / "shared" / "traces", ROOT.parent.parent / "shared" / "traces")
               if p.is_dir()), ROOT.parent / "shared" / "traces")
DEFAULT = SHARED / "TraceLens/tests/traces/inference/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from kinetoscope.analyze.ingest.jobs import find_jobs
    from kinetoscope.analyze.ingest.loader import load_job
    from kinetoscope.analyze.report.builder import build_report

    try:
        from kinetoscope.analyze.analyzers.efficiency import compute
    except ImportError:  # a checkout before the efficiency analyzer
        compute = None
    (job,) = find_jobs(args.trace)
    times: dict[str, list[float]] = {"load": [], "efficiency": [], "report": []}
    for run in range(args.runs + 1):
        t = time.perf_counter()
        trace = load_job(job)
        loaded = time.perf_counter() - t
        if compute is not None:
            t = time.perf_counter()
            compute(trace.ranks[0])
            eff = time.perf_counter() - t
            trace.ranks[0].drop_views()
        t = time.perf_counter()
        build_report(trace)
        rep = time.perf_counter() - t
        if run:  # the first run warms imports and caches
            times["load"].append(loaded)
            times["report"].append(rep)
            if compute is not None:
                times["efficiency"].append(eff)
    shapes = len(getattr(trace.ranks[0], "shapes", ()))
    print(f"{args.trace.name}: {len(trace.ranks[0].events):,} events, {shapes:,} ops with shapes, {args.runs} runs")
    for stage, values in times.items():
        if values:
            print(f"  {stage:<10} median {statistics.median(values):.3f} s  min {min(values):.3f} s")


if __name__ == "__main__":
    main()
