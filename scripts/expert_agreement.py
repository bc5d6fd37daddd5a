"""Precision and recall of the report against the expert readings in tests/expert/*.toml.

A claim is a warning or critical finding (id, rank). Precision: the tool's claims the expert also makes;
recall: the expert's claims the tool makes. Prints the Markdown of docs/expert-readings.md.
Run: python scripts/expert_agreement.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from expertlib import compare, read_expert  # noqa: E402

from kinetoscope.analyze.loader import find_jobs, load_job  # noqa: E402
from kinetoscope.analyze.report import build_report  # noqa: E402


def _claims(items: dict[tuple[str, int], str]) -> str:
    shown = [f"{i} ({s}, r{r})" for (i, r), s in sorted(items.items()) if s in ("critical", "warning")]
    return ", ".join(shown) or "-"


def main() -> None:
    rows = []
    tp = fp = missed = over = 0
    for path in sorted((ROOT / "tests" / "expert").glob("*.toml")):
        reading = read_expert(path)
        trace = reading.path(ROOT)
        if trace is None:
            rows.append(f"| {path.stem} | (trace not here) | | | |")
            continue
        (job,) = find_jobs(trace)
        report = build_report(load_job(job))
        a = compare(reading, report.findings)
        tool = {}
        for f in report.findings:
            tool[(f.id, f.rank or 0)] = f.severity
        tp += len(a.true_positives)
        fp += len(a.false_positives)
        missed += len(a.missed)
        over += len(a.overclaimed)
        notes = []
        if a.false_positives:
            notes.append("false: " + ", ".join(f"{i} r{r}" for i, r, _ in a.false_positives))
        if a.missed:
            notes.append("missed: " + ", ".join(f"{i} r{r}" for i, r, _ in a.missed))
        if a.overclaimed:
            notes.append("too strong: " + ", ".join(f"{i} r{r} {s} vs {e}" for i, r, s, e in a.overclaimed))
        if a.underclaimed:
            notes.append("weaker: " + ", ".join(f"{i} r{r} {s} vs {e}" for i, r, s, e in a.underclaimed))
        rows.append(f"| {path.stem} | {_claims(reading.expected)} | {_claims(tool)} | {'; '.join(notes) or 'agree'} |")
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + missed) if tp + missed else 1.0
    print(f"Claims (warning or critical findings) over {len(rows)} readings: the tool makes {tp + fp}, the experts "
          f"{tp + missed}; {tp} agree. **Precision {precision:.2f}** ({fp} claims an expert would not make), "
          f"**recall {recall:.2f}** ({missed} expert claims missed), {over} at a higher severity than the expert's.")
    print()
    print("| reading | expert's claims | tool's claims | agreement |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
