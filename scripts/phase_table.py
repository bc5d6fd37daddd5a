"""Print the step-anatomy table (host fraction of the window per phase, GPU share in brackets) for traces.

Run: python scripts/phase_table.py [PATH ...]   (default: every GPU trace in ../shared/traces)
"""

from __future__ import annotations

import sys
from pathlib import Path

from kinetoscope.analyze.ingest.loader import find_jobs, load_job
from kinetoscope.analyze.model.phases import PHASES
from kinetoscope.analyze.report.builder import build_report

ROOT = Path(__file__).resolve().parents[1]


def main(paths: list[Path]) -> None:
    print("| trace | rank | steps | " + " | ".join(PHASES) + " |")
    print("|---|---|---|" + "---|" * len(PHASES))
    for path in paths:
        for job in find_jobs(path):
            report = build_report(load_job(job))
            for r in report.ranks:
                cells = []
                for p in PHASES:
                    v = r["phases"][p]
                    gpu = f" ({v['gpu_fraction']:.0%})" if v["gpu_fraction"] else ""
                    cells.append(f"{v['fraction']:.1%}{gpu}" if v["fraction"] or gpu else "–")
                print(f"| {path.name} | {r['rank']} | {r['steps']['count']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    shared = ROOT.parent / "shared" / "traces"
    default = sorted(p for p in shared.rglob("*.json*") if "trace_filter" not in str(p))
    default.append(shared / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter")
    main([Path(p) for p in sys.argv[1:]] or default)
