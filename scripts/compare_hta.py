"""Cross-check device busy and idle time against HTA's temporal breakdown, with our production analyzer.

For every trace (default: every trace in ../shared/traces), HTA's ``get_temporal_breakdown`` beside
Kinetoscope's own ``gpu`` analyzer run on the same rank *as HTA sees it* (``hta_adapter.hta_view``:
HTA's event selection, rounding and window), and beside our report under our own definition. Prints
the Markdown table of docs/hta.md, with the reason for every difference.
Run: python scripts/compare_hta.py [PATH ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from kinetoscope.analyze.analyzers.gpu import analyze_gpu
from kinetoscope.analyze.crosscheck.hta import (
    HtaUnavailable,
    hta_extra_busy_events,
    hta_rounding_loss_us,
    hta_temporal_breakdown,
    hta_view,
)
from kinetoscope.analyze.ingest.loader import find_jobs, load_job
from kinetoscope.analyze.model.config import DEFAULT_CONFIG
from kinetoscope.analyze.model.timeline import window
from kinetoscope.analyze.report.builder import build_report
from kinetoscope.errors import KinetoscopeError

ROOT = Path(__file__).resolve().parents[1]


def default_paths() -> list[Path]:
    shared = ROOT.parent / "shared" / "traces"
    paths = sorted(p for p in shared.rglob("*.json*") if "trace_filter" not in str(p))
    return paths + [shared / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter"]


def rows(path: Path) -> list[dict[str, object]]:
    """One row per rank: HTA's numbers, ours on HTA's view, ours on our terms, and why they differ."""
    out: list[dict[str, object]] = []
    for job in find_jobs(path):
        try:
            trace = load_job(job)
            report = build_report(trace)
        except KinetoscopeError as exc:
            out.append({"trace": path.name, "rank": None, "why": f"not loadable: {exc}"})
            continue
        try:
            hta = hta_temporal_breakdown(list(job.files))
            hta_error = None
        except HtaUnavailable as exc:
            hta, hta_error = {}, str(exc).split(": ", 1)[-1][:90]
        for r, entry in zip(trace.ranks, report.ranks, strict=True):
            file = next((f for f in job.files if f.name in r.meta.source), job.files[0])
            extra = hta_extra_busy_events(file)
            view = hta_view(r)
            gpu = analyze_gpu(view, DEFAULT_CONFIG).fragment()["gpu"]
            ours_busy = sum(d["busy_us"] for d in gpu["devices"]) if gpu else None
            ours_idle = gpu["devices"][0]["idle_us"] if gpu and len(gpu["devices"]) == 1 else None
            h = hta.get(r.rank)
            row: dict[str, object] = {
                "trace": path.name, "rank": r.rank,
                "hta_idle_us": h.idle_us if h else None, "hta_window_us": h.window_us if h else None,
                "hta_busy_us": (h.window_us - h.idle_us) if h else None,
                "ours_busy_us": ours_busy, "ours_idle_us": ours_idle,
                "ours_window_us": window(view).dur_ns / 1000.0 if gpu else None,
                "ours_own_idle_fraction": (entry.get("gpu") or {}).get("idle_fraction"),
                "extra_events": extra,
                "rounding_loss_us": hta_rounding_loss_us(r),
            }
            row["why"] = _why(row, hta_error, entry, r)
            out.append(row)
    return out


def _why(row: dict[str, object], hta_error: str | None, entry: dict[str, object], rank) -> str:
    if hta_error:
        return f"HTA fails: {hta_error}"
    if row["hta_busy_us"] is None:
        return "HTA gives no row for this rank"
    if row["ours_busy_us"] is None:
        return "no GPU work in HTA's selection"
    diff = float(row["hta_busy_us"]) - float(row["ours_busy_us"])  # type: ignore[arg-type]
    reasons = []
    loss = float(row["rounding_loss_us"])  # type: ignore[arg-type]
    if abs(diff) < 1.0:
        reasons.append("same busy time and window")
    if loss:
        reasons.append("HTA's rounding turns events shorter than a microsecond into negative durations, "
                       f"which its merge subtracts: -{loss:,.0f} us")
    if row["extra_events"] and abs(diff + loss) >= 1.0:
        listed = ", ".join(f"{n} {c}" for c, n in sorted(row["extra_events"].items()))  # type: ignore[union-attr]
        reasons.append(f"HTA counts events with a stream argument as GPU busy ({listed}): +{diff + loss:,.0f} us")
    elif abs(diff) >= 1.0 and abs(diff + loss) >= 1.0:
        reasons.append(f"unexplained difference of {diff + loss:,.0f} us")
    if row["ours_idle_us"] is None and entry.get("gpu"):
        reasons.append("we do not judge idle: the trace misses GPU activity")
    basis = (entry.get("window") or {}).get("basis")
    if basis == "profiler_steps" and len(rank.steps) >= 2:
        reasons.append("our own window keeps the last step and spans the steps, not the GPU work")
    elif basis == "inferred_steps":
        reasons.append("our own window: iterations inferred from DataLoader waits, cold first one left out")
    return "; ".join(reasons)


def _cell(v: object, pct_of: object = None) -> str:
    if v is None:
        return "-"
    text = f"{float(v):,.0f}"  # type: ignore[arg-type]
    if pct_of:
        text += f" ({100 * float(v) / float(pct_of):.1f}%)"  # type: ignore[arg-type]
    return text


def main(paths: list[Path]) -> None:
    print("| trace | rank | HTA busy / window us (idle %) | ours on HTA's view: busy us (idle %) "
          "| ours, own window: idle | why they differ |")
    print("|---|---|---|---|---|---|")
    for path in paths:
        for row in rows(path):
            if row.get("rank") is None:
                print(f"| {row['trace']} | - | - | - | - | {row['why']} |")
                continue
            hta = ("-" if row["hta_busy_us"] is None else
                   f"{_cell(row['hta_busy_us'])} / {_cell(row['hta_window_us'])} "
                   f"({100 * float(row['hta_idle_us']) / float(row['hta_window_us']):.1f}%)"
                   if row["hta_window_us"] else "0")
            ours = "-" if row["ours_busy_us"] is None else (
                f"{_cell(row['ours_busy_us'])} ("
                + (f"{100 * float(row['ours_idle_us']) / float(row['ours_window_us']):.1f}%"
                   if row["ours_idle_us"] is not None and row["ours_window_us"] else "not judged") + ")")
            own = row["ours_own_idle_fraction"]
            own_cell = "not judged" if own is None else f"{100 * float(own):.1f}%"
            print(f"| {row['trace']} | {row['rank']} | {hta} | {ours} | {own_cell} | {row['why']} |")


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]] or default_paths())
