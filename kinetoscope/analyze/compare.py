"""Compare two reports: what got faster or slower, which findings appeared or disappeared."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kinetoscope.analyze.report import Report, entry_value
from kinetoscope.analyze.trace import Trace

#: (label, path into a rank entry, lower is better; None: a composition, neither better nor worse)
HEADLINES: tuple[tuple[str, tuple[str, ...], bool | None], ...] = (
    ("mean step (us)", ("steps", "mean_us"), True),
    ("window (us)", ("window_us",), True),
    ("data loading, fraction of window", ("loader", "fraction"), True),
    ("GPU idle, fraction of window", ("gpu", "idle_fraction"), True),
    ("H2D time (us)", ("h2d", "time_us"), True),
    ("H2D overlapped, fraction of copy time", ("h2d", "overlap_fraction"), False),
    ("memory growth (bytes/step)", ("memory", "growth_bytes_per_step"), True),
    ("peak allocated (bytes)", ("memory", "peak_allocated_bytes"), True),
    ("forward, fraction of window", ("phases", "forward", "fraction"), None),
    ("backward, fraction of window", ("phases", "backward", "fraction"), None),
    ("optimizer, fraction of window", ("phases", "optimizer", "fraction"), None),
)


def _get(entry: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value = entry_value(entry, *path)
    return float(value) if isinstance(value, (int, float)) else None


def compare_reports(before: Report, after: Report, rank: int | None = None) -> pd.DataFrame:
    """One row per headline metric: before, after, change (after/before - 1) and whether that is better."""
    def entry(report: Report) -> dict[str, Any]:
        for r in report.ranks:
            if rank is None or r["rank"] == rank:
                return r
        return report.ranks[0]

    a, b = entry(before), entry(after)
    rows = []
    for label, path, lower_is_better in HEADLINES:
        x, y = _get(a, path), _get(b, path)
        change = (y / x - 1.0) if x not in (None, 0) and y is not None else None
        better = None if change is None or change == 0 or lower_is_better is None else (change < 0) == lower_is_better
        rows.append({"metric": label, "before": x, "after": y, "change": change, "better": better})
    return pd.DataFrame(rows)


def finding_changes(before: Report, after: Report) -> pd.DataFrame:
    key = lambda f: (f.id, f.rank)  # noqa: E731
    old = {key(f): f for f in before.findings}
    new = {key(f): f for f in after.findings}
    rows = [{"status": "appeared", "id": k[0], "rank": k[1], "title": new[k].title} for k in new.keys() - old.keys()]
    rows += [{"status": "gone", "id": k[0], "rank": k[1], "title": old[k].title} for k in old.keys() - new.keys()]
    rows += [{"status": "still there", "id": k[0], "rank": k[1], "title": new[k].title} for k in new.keys() & old.keys()]
    return pd.DataFrame(rows, columns=["status", "id", "rank", "title"])


def name_changes(before: Trace, after: Trace, kinds: tuple[str, ...], top: int = 10) -> pd.DataFrame:
    """Kernels (or ops) whose time per step changed most: name, before/after us per step, change."""
    def per_step(trace: Trace) -> pd.Series:
        totals = []
        for r in trace.ranks:
            ev = r.events[r.events["kind"].isin(kinds)]
            steps = max(len(r.steps), 1)
            totals.append(ev.groupby("name", observed=True)["dur_ns"].sum() / steps / 1000.0)
        return pd.concat(totals).groupby(level=0).mean() if totals else pd.Series(dtype=float)

    a, b = per_step(before), per_step(after)
    table = pd.DataFrame({"before_us_per_step": a, "after_us_per_step": b}).fillna(0.0)
    table["change_us_per_step"] = table["after_us_per_step"] - table["before_us_per_step"]
    table = table.reindex(table["change_us_per_step"].abs().sort_values(ascending=False).index).head(top)
    return table.rename_axis("name").reset_index()
