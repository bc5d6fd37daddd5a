"""A text summary of a batch store (``kinetoscope report STORE``)."""

from __future__ import annotations

import os

import pandas as pd

from kinetoscope.batch.store import StoreRoot, open_store, read_table

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def relative_names(names: list[str]) -> dict[str, str]:
    """Job names (absolute paths where batch found them) relative to the folder they all share: what a platform
    team calls them (``team-a/job-42``), not ``/mnt/traces/2026/12/team-a/job-42``. Names that are not paths, or
    share nothing, stay as they are."""
    paths = [n for n in names if os.path.isabs(n)]
    if len(paths) < 1 or len(paths) != len(names):
        return {n: n for n in names}
    common = os.path.commonpath(paths)
    if len(paths) == 1 or common in paths:  # one job, or a job that is the shared folder itself: keep its last part
        common = os.path.dirname(common)
    return {n: os.path.relpath(n, common) if common and common != os.sep else n for n in names}


def fleet(store: str | os.PathLike[str] | StoreRoot) -> pd.DataFrame:
    """Jobs x findings: one row per job, a column per finding id (count), worst jobs first."""
    root = open_store(store)
    traces = read_table(root, "traces")
    findings = read_table(root, "findings")
    if traces.empty:
        return pd.DataFrame(
            columns=[
                "job",
                "files",
                "failed",
                "critical",
                "warnings",
                "mean_step_ms",
                "gpu_idle_fraction",
                "worst_finding",
                "worst_saving_ms_per_step",
            ]
        )
    jobs = traces.groupby("job").agg(files=("path", "count"), failed=("status", lambda s: int((s != "ok").sum())))
    if len(findings):
        counts = findings.pivot_table(index="job", columns="id", values="key", aggfunc="count", fill_value=0)
        sev = findings.assign(critical=findings["severity"].eq("critical"), warnings=findings["severity"].eq("warning"))
        sev = sev.groupby("job")[["critical", "warnings"]].sum()
        jobs = jobs.join(sev, how="left").join(counts, how="left")
    else:
        jobs["critical"] = 0
        jobs["warnings"] = 0
    jobs = jobs.fillna(0)
    for col in jobs.columns:
        jobs[col] = jobs[col].astype(int)
    ok = traces[traces["status"] == "ok"]
    # the job's step time and GPU idle: its slowest rank's mean step and most idle rank (null when unknown)
    per_job = ok.groupby("job").agg(
        mean_step_ms=("mean_step_us", "max"), gpu_idle_fraction=("gpu_idle_fraction", "max")
    )
    per_job["mean_step_ms"] = per_job["mean_step_ms"] / 1000.0
    worst = _worst_findings(findings)
    out = jobs.join(per_job, how="left").join(worst, how="left")
    out = out.sort_values(["failed", "critical", "warnings"], ascending=False).reset_index()
    lead = ["job", "files", "failed", "critical", "warnings", "mean_step_ms", "gpu_idle_fraction", "worst_finding",
            "worst_saving_ms_per_step"]
    return out[lead + [c for c in out.columns if c not in lead]]


def missing_ranks(traces: pd.DataFrame) -> pd.DataFrame:
    """Per job whose traces state a world size (distributedInfo): the size, the ranks read, and how many of its
    ranks have no readable file (a job-level claim over it would be about ranks never seen)."""
    cols = ["job", "world_size", "ranks_read", "missing_ranks"]
    if traces.empty or "world_size" not in traces:
        return pd.DataFrame(columns=cols)
    ok = traces[(traces["status"] == "ok") & traces["world_size"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    g = ok.groupby("job")
    out = pd.DataFrame({"world_size": g["world_size"].max().astype("int64"), "ranks_read": g["rank"].nunique()})
    out["missing_ranks"] = out["world_size"] - out["ranks_read"]
    return out.reset_index()[cols]


def _worst_findings(findings: pd.DataFrame) -> pd.DataFrame:
    """Per job: its first finding by severity then saving, and what fixing it saves per step (ms; null when
    not estimated)."""
    cols = ["worst_finding", "worst_saving_ms_per_step"]
    if findings.empty:
        return pd.DataFrame(columns=cols)
    f = findings.assign(
        _sev=findings["severity"].map(SEVERITY_RANK).fillna(3),
        _saving=findings["saving_us_per_step"].fillna(-1.0) if "saving_us_per_step" in findings else -1.0,
    )
    f = f.sort_values(["job", "_sev", "_saving"], ascending=[True, True, False]).drop_duplicates("job").set_index("job")
    saving = f["saving_us_per_step"] / 1000.0 if "saving_us_per_step" in f else pd.Series(index=f.index, dtype=float)
    return pd.DataFrame({"worst_finding": f["severity"] + " " + f["id"], "worst_saving_ms_per_step": saving})


def store_report(store: str | os.PathLike[str]) -> str:
    root = open_store(store)
    traces = read_table(root, "traces")
    findings = read_table(root, "findings")
    out = [f"Kinetoscope batch store: {root}"]
    ok = int((traces["status"] == "ok").sum())
    out.append(f"{traces['job'].nunique()} jobs, {len(traces)} files: {ok} ok, {len(traces) - ok} failed")
    if len(findings):
        out.append("")
        out.append("Findings by id:")
        for fid, n in findings["id"].value_counts().items():
            out.append(f"  {fid:<26} {n}")
        out.append("")
        out.append("Worst jobs:")
        table = fleet(root).head(10)
        for r in table.itertuples():
            out.append(f"  {r.job}: {r.critical} critical, {r.warnings} warnings, {r.failed} failed files")
        straggler = findings[findings["id"] == "straggler"]
        for r in straggler.itertuples():
            out.append(f"  straggler in {r.job}: rank {r.rank} - {r.title}")
    failed = traces[traces["status"] != "ok"]
    if len(failed):
        out.append("")
        out.append("Failed files:")
        for r in failed.itertuples():
            out.append(f"  {r.path}: {r.error}")
    return "\n".join(out) + "\n"
