"""Cross-check device idle time against HTA's temporal breakdown on real traces.

Prints a Markdown table: HTA's idle, ours under HTA's definition (same events,
same window) and ours under Kinetoscope's definition (window = first to last
ProfilerStep, last step included; per device).
Run: python scripts/compare_hta.py [PATH ...]   (default: every trace in ../shared/traces)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kinetoscope.analyze.hta_adapter import HtaUnavailable, hta_style_idle, hta_temporal_breakdown
from kinetoscope.analyze.loader import find_jobs, load_job
from kinetoscope.analyze.report import build_report
from kinetoscope.errors import KinetoscopeError

ROOT = Path(__file__).resolve().parents[1]


def default_paths() -> list[Path]:
    shared = ROOT.parent / "shared" / "traces"
    paths = sorted(p for p in shared.rglob("*.json*") if "trace_filter" not in str(p))
    return paths + [shared / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter"]


def main(paths: list[Path]) -> None:
    print("| trace | rank | HTA idle us / window us (%) | ours, HTA definition (%) | ours: device idle / window (%) | HTA s | ours s |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        for job in find_jobs(path):
            t0 = time.perf_counter()
            try:
                trace = load_job(job)
                report = build_report(trace)
            except KinetoscopeError as exc:
                print(f"| {path.name} | - | - | - | error: {exc} | - | - |")
                continue
            ours_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            try:
                hta = hta_temporal_breakdown(list(job.files))
                hta_err = None
            except HtaUnavailable as exc:
                hta, hta_err = {}, str(exc)[:80]
            hta_s = time.perf_counter() - t0
            for r, entry in zip(trace.ranks, report.ranks):
                gpu = entry["gpu"]
                ours = "no GPU work" if not gpu else "; ".join(
                    f"{d['idle_us']:.0f} / {entry['window_us']:.0f} ({100 * d['idle_fraction']:.2f}%)" for d in gpu["devices"])
                mine = hta_style_idle(r)
                h = hta.get(r.rank)
                hta_cell = hta_err or (f"{h.idle_us:.0f} / {h.window_us:.0f} ({100 * h.idle_fraction:.2f}%)" if h else "no row")
                mine_cell = f"{mine.idle_us:.0f} / {mine.window_us:.0f} ({100 * mine.idle_fraction:.2f}%)" if mine.window_us else "-"
                print(f"| {path.name} | {r.rank} | {hta_cell} | {mine_cell} | {ours} | {hta_s:.2f} | {ours_s:.2f} |")


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]] or default_paths())
