"""The unit of batch work: one trace file in, its rows in the store out. Runs on a Dask worker.

Never raises for a bad trace: every failure becomes a ``failed`` row with its reason.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from kinetoscope import __version__
from kinetoscope.analyze.ingest.jobs import Job
from kinetoscope.analyze.ingest.limits import DEFAULT_LIMITS, LoadLimits
from kinetoscope.analyze.registry import analyzer
from kinetoscope.analyze.report.builder import entry_value
from kinetoscope.analyze.report.job import analyse_job
from kinetoscope.batch.store import read_rows, write_rows
from kinetoscope.errors import KinetoscopeError
from kinetoscope.sources import trace_path, version_of


def file_key(path: str, content_sha256: str, version: str = __version__) -> str:
    """Identity of a result: the file's path and content, and the tool version that analysed it."""
    return hashlib.sha256(f"{path}\0{content_sha256}\0{version}".encode()).hexdigest()[:40]


def _file_sha256(path: Path) -> str:
    """The file's bytes (as stored: a .gz is hashed compressed), read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * 2**20):
            digest.update(chunk)
    return digest.hexdigest()


def analyze_file(path: str, job: str, index: int, store: str, resume: bool = False,
                 limits: LoadLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Analyse one file of a job and write its rows; returns the trace row (with ``skipped`` if resumed)."""
    root = trace_path(store)
    file = trace_path(path)
    base: dict[str, Any] = {"job": job, "path": path, "rank": index, "tool_version": __version__}
    started = time.perf_counter()
    try:
        # a local file by its content; an object in a store by its size and ETag (hashing it would download it
        # once more, whole, besides the scan's stream)
        sha = _file_sha256(file) if isinstance(file, Path) else None
        identity = sha or "{}:{}".format(*version_of(file))
    except OSError as exc:  # missing or unreadable
        try:
            size, version = version_of(file)
            identity = f"unreadable:{size}:{version}"
        except OSError:
            identity = "missing"
        key = file_key(path, identity)
        if resume and (existing := read_rows(root, "traces", key)):
            return {**existing[0], "skipped": True}
        row = {**base, "key": key, "status": "failed", "error": f"{path}: cannot read ({exc.strerror or exc})"}
        write_rows(root, "traces", key, [row])
        return row
    key = file_key(path, identity)
    if resume:
        existing = read_rows(root, "traces", key)
        if existing:
            return {**existing[0], "skipped": True}
    base.update(key=key, content_sha256=sha)
    try:
        # streamed: a worker holds the trace's columns, never its JSON text
        # one file of the job: its rank, where the file does not name it, is its place among the job's files
        analysed = analyse_job(Job(job, (file,)), limits=limits, first_rank=index,
                               threads=1)  # the workers are the parallelism
        assert analysed.trace is not None and analysed.report is not None  # not tolerant: a bad file raised
        rank, report = analysed.trace.ranks[0], analysed.report
        base["size_bytes"] = rank.meta.bytes_read
    except KinetoscopeError as exc:
        row = {**base, "status": "failed", "error": str(exc), "parse_s": time.perf_counter() - started}
        write_rows(root, "traces", key, [row])
        return row
    except Exception as exc:  # noqa: BLE001 - an internal bug on one file must not sink the batch
        row = {**base, "status": "failed", "error": f"internal error: {type(exc).__name__}: {exc}",
               "parse_s": time.perf_counter() - started}
        write_rows(root, "traces", key, [row])
        return row
    entry = report.ranks[0]
    severities = [f.severity for f in report.findings]
    # the job-level analysis' map step, through the registry as the report runs it
    summary = analyzer("collectives").per_rank(rank)  # type: ignore[misc]  # collectives has a per_rank view
    row = {
        **base,
        "rank": rank.rank,
        "status": "ok" if not report.failures else "failed",
        "error": "; ".join(f"{f.analyzer}: {f.error}" for f in report.failures) or None,
        "events": entry["events"],
        "parse_s": analysed.load_seconds,
        "analyze_s": analysed.analyse_seconds,
        "window_us": entry["window_us"],
        "steps": entry_value(entry, "steps", "count"),
        "mean_step_us": entry_value(entry, "steps", "mean_us"),
        "gpu_idle_fraction": entry_value(entry, "gpu", "idle_fraction"),
        "loader_fraction": entry_value(entry, "loader", "fraction"),
        "loader_gpu_idle_cost_us": entry_value(entry, "loader", "gpu_idle_cost_us"),
        "h2d_overlap_fraction": entry_value(entry, "h2d", "overlap_fraction"),
        "h2d_pageable_fraction": entry_value(entry, "h2d", "pageable_fraction"),
        "memory_growth_bytes_per_step": entry_value(entry, "memory", "growth_bytes_per_step"),
        "peak_allocated_bytes": entry_value(entry, "memory", "peak_allocated_bytes"),
        "collective_us": summary.collective_us,
        "loader_us": summary.components_us["input"],
        "findings": len(report.findings),
        "critical": severities.count("critical"),
        "warnings": severities.count("warning"),
        "replay_step_us": entry_value(entry, "replay", "step_us"),
        "world_size": rank.meta.world_size,
        "replay_error": entry_value(entry, "replay", "error"),
    }
    findings = [
        {"key": key, "job": job, "path": path, "rank": f.rank, "id": f.id, "severity": f.severity, "title": f.title,
         "impact_us": f.impact_us, "evidence_json": json.dumps(f.evidence, default=str),
         "saving_us_per_step": f.estimate.get("saving_us_per_step") if f.estimate is not None else None,
         "step_us_after": f.estimate.get("step_us_after") if f.estimate is not None else None,
         "estimate_json": json.dumps(dict(f.estimate), default=str) if f.estimate else None}
        for f in report.findings
    ]
    loader_steps = (
        report.results[rank.rank]["loader"].tables["loader_per_step"] if "loader" in report.results[rank.rank] else None
    )
    gpu_steps = (
        report.results[rank.rank]["gpu"].tables.get("gpu_per_step") if "gpu" in report.results[rank.rank] else None
    )
    idle = {} if gpu_steps is None or gpu_steps.empty else gpu_steps.groupby("step")["idle_us"].max().to_dict()
    steps = [
        {"key": key, "job": job, "path": path, "rank": rank.rank, "step": int(s.step), "dur_us": s.dur_ns / 1000.0,
         "loader_us": None, "gpu_idle_us": idle.get(int(s.step))}
        for s in rank.steps.itertuples()
    ]
    if loader_steps is not None and len(loader_steps):
        by_step = dict(zip(loader_steps["step"].astype(int), loader_steps["loader_us"], strict=False))
        for s in steps:
            s["loader_us"] = by_step.get(s["step"])
    # findings and steps first, the trace row last: a row in traces/ means the file is complete
    write_rows(root, "findings", key, findings)
    write_rows(root, "steps", key, steps)
    write_rows(root, "summaries", key, [{"key": key, "job": job, "path": path, "rank": rank.rank,
                                         "summary_json": json.dumps(summary.to_dict())}])
    write_rows(root, "traces", key, [row])
    return row
