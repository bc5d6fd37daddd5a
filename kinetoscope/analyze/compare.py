"""Compare two reports: what got faster or slower, which findings appeared or disappeared."""

from __future__ import annotations

from typing import Any

import numpy as np
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
    # in each report's own order (most severe first), never a set's: the same runs give the same table
    rows = [{"status": "appeared", "id": k[0], "rank": k[1], "title": f.title} for k, f in new.items() if k not in old]
    rows += [{"status": "gone", "id": k[0], "rank": k[1], "title": f.title} for k, f in old.items() if k not in new]
    rows += [{"status": "still there", "id": k[0], "rank": k[1], "title": f.title} for k, f in new.items() if k in old]
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


def step_samples(trace: Trace) -> tuple[np.ndarray, str]:
    """Per-step wall times (us) to compare runs on, and where they come from: every step the capture timed
    (``steps.json``), less the first (cold start) and the profiled ones (the profiler slows them); else the
    ProfilerStep spans of the trace (the window only)."""
    timed = [r.run_steps for r in trace.ranks if r.run_steps is not None and len(r.run_steps)]
    if timed:
        rs = timed[0]
        keep = (rs["step"] > 0).to_numpy() & ~rs["profiled"].to_numpy()
        if keep.sum() >= 3:
            return rs["wall_ns"].to_numpy()[keep] / 1000.0, f"{int(keep.sum())} unprofiled steps timed by the capture"
    steps = trace.ranks[0].steps
    if "partial" in steps:
        steps = steps[~steps["partial"].to_numpy()]
    return steps["dur_ns"].to_numpy() / 1000.0, f"{len(steps)} profiled steps (ProfilerStep spans)"


def step_change(before: Trace, after: Trace, *, resamples: int = 4000, seed: int = 0) -> dict[str, Any]:
    """How the typical step changed between two runs (see ``median_change``), from every step each timed."""
    a, source_a = step_samples(before)
    b, source_b = step_samples(after)
    out = median_change(a, b, resamples=resamples, seed=seed)
    out.update(before_source=source_a, after_source=source_b)
    return out


def median_change(a: np.ndarray, b: np.ndarray, *, resamples: int = 4000, seed: int = 0) -> dict[str, Any]:
    """The change of the median step time (after / before - 1) with a 95% confidence interval, and each run's
    noise (interquartile range over median).

    The median, not the mean: one stall (a checkpoint, a page-cache miss, a noisy neighbour) of a few slow
    steps moves the mean of a few dozen steps by tens of percent, the median not at all. The interval comes
    from a moving-block bootstrap (blocks of about sqrt(n) consecutive steps, resampled with replacement):
    step times are autocorrelated (slow steps come in bursts), and resampling single steps as if independent
    would claim far more confidence than the data holds."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    out: dict[str, Any] = {"statistic": "median", "before_steps": int(len(a)), "after_steps": int(len(b)),
                           "change": None, "ci_low": None, "ci_high": None, "before_noise": None, "after_noise": None,
                           "before_median_us": None, "after_median_us": None}
    if len(a) == 0 or len(b) == 0 or np.median(a) <= 0:
        return out
    ma, mb = float(np.median(a)), float(np.median(b))
    out.update(change=mb / ma - 1.0, before_median_us=ma, after_median_us=mb)
    for key, x in (("before_noise", a), ("after_noise", b)):
        if len(x) >= 4:
            q1, q3 = np.quantile(x, [0.25, 0.75])
            out[key] = float((q3 - q1) / np.median(x))
    if len(a) >= 2 and len(b) >= 2:
        rng = np.random.default_rng(seed)
        ratios = _block_medians(b, resamples, rng) / _block_medians(a, resamples, rng) - 1.0
        out["ci_low"], out["ci_high"] = (float(q) for q in np.quantile(ratios, [0.025, 0.975]))
    return out


def _block_medians(x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``resamples`` moving-block bootstrap resamples of ``x``."""
    n = len(x)
    block = max(1, int(round(np.sqrt(n))))
    blocks = -(-n // block)
    resamples = max(200, min(resamples, 20_000_000 // max(n, 1)))  # bounded memory for very long runs
    starts = rng.integers(0, n - block + 1, (resamples, blocks))
    idx = (starts[:, :, None] + np.arange(block)).reshape(resamples, blocks * block)[:, :n]
    return np.median(x[idx], axis=1)


def fix_check(before: Trace, rb: Report, ra: Report) -> pd.DataFrame:
    """For each finding of ``before`` gone in ``after``: the step time its fix was predicted to give (its
    ``estimate``) beside the step time measured after, per rank; and, where several went, all of them
    predicted together (one replay). Measured: each rank's mean window step in ``after``."""
    from kinetoscope.analyze import whatif

    after_step = {e["rank"]: (e.get("steps") or {}).get("mean_us") for e in ra.ranks}
    before_step = {e["rank"]: (e.get("steps") or {}).get("mean_us") for e in rb.ranks}
    gone = finding_changes(rb, ra)
    gone = gone[gone["status"] == "gone"]
    rows = []

    def row(fid: str, rank: Any, est: dict[str, Any] | None) -> None:
        b, a = before_step.get(rank), after_step.get(rank)
        pred = (est or {}).get("step_us_after")
        rows.append({"id": fid, "rank": rank, "before_step_us": b, "predicted_step_us": pred,
                     "measured_step_us": a,
                     "predicted_change": (pred / b - 1) if pred is not None and b else None,
                     "measured_change": (a / b - 1) if a is not None and b else None,
                     "error": (pred / a - 1) if pred is not None and a else None,
                     "method": (est or {}).get("method")})

    for rank, ids in gone.groupby("rank", dropna=False)["id"]:
        found = [f for f in rb.findings if f.rank == rank and f.id in set(ids)]
        for f in found:
            row(f.id, rank, f.estimate)
        costly = [f for f in found if (f.estimate or {}).get("saving_us_per_step")]
        if len(costly) > 1:
            ranks = [r for r in before.ranks if r.rank == rank]
            if ranks:
                row(" + ".join(f.id for f in costly), rank, whatif.combined(ranks[0], costly))
    return pd.DataFrame(rows, columns=["id", "rank", "before_step_us", "predicted_step_us", "measured_step_us",
                                       "predicted_change", "measured_change", "error", "method"])
