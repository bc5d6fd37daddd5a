"""Cross-check device idle time against HTA's temporal breakdown on real traces.

Prints Markdown tables: HTA's idle, ours under HTA's definition (same events,
same window) and ours under Kinetoscope's definition (window = first to last
ProfilerStep, last step included; per device); then HTA's communication /
computation overlap beside ours for every trace with collectives.
Run: python scripts/compare_hta.py [PATH ...]   (default: every trace in ../shared/traces)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kinetoscope.analyze.hta_adapter import HtaUnavailable, hta_comm_comp_overlap, hta_style_idle, hta_temporal_breakdown
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


def comm_table(paths: list[Path]) -> None:
    """Communication/computation overlap: HTA's get_comm_comp_overlap beside ours, for traces with collectives."""
    print()
    print("| trace | rank | collectives | HTA comm overlapped by compute | ours (fraction of collective time) |")
    print("|---|---|---|---|---|")
    for path in paths:
        for job in find_jobs(path):
            try:
                report = build_report(load_job(job))
            except KinetoscopeError:
                continue
            if not any(r.get("comm") for r in report.ranks):
                continue
            try:
                hta = hta_comm_comp_overlap(list(job.files))
                err = None
            except HtaUnavailable as exc:
                hta, err = {}, str(exc)[:80]
            for r in report.ranks:
                comm = r.get("comm")
                if not comm:
                    continue
                h = hta.get(r["rank"])
                hta_cell = err or (f"{100 * h:.2f}%" if h is not None else "no row")
                print(f"| {path.name} | {r['rank']} | {comm['collectives']} | {hta_cell} | {100 * comm['overlap_fraction']:.2f}% |")


if __name__ == "__main__":
    chosen = [Path(p) for p in sys.argv[1:]] or default_paths()
    main(chosen)
    comm_table(chosen)
