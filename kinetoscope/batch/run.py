"""Run the batch on Dask: one task per trace file, results written by the workers into the store."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kinetoscope.analyze.ingest.limits import DEFAULT_LIMITS, LoadLimits
from kinetoscope.analyze.ingest.loader import Job
from kinetoscope.analyze.model.config import DEFAULT_CONFIG, AnalysisConfig
from kinetoscope.analyze.model.distributed import RankSummary
from kinetoscope.analyze.model.estimate import Estimate
from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.registry import analyzer
from kinetoscope.analyze.report.policy import RunTime, judge
from kinetoscope.analyze.whatif.fixes import straggler_saving_us, straggler_shards
from kinetoscope.batch.compact import compact
from kinetoscope.batch.discover import discover
from kinetoscope.batch.store import SCHEMAS, StoreRoot, open_store, read_rows, write_rows
from kinetoscope.batch.task import analyze_file, file_key


@dataclass
class BatchSummary:
    store: str
    jobs: int = 0
    files: int = 0
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    top_findings: list[tuple[str, int]] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # advice about the cluster (its workers' settings)

    def lines(self) -> list[str]:
        out = [f"{self.jobs} jobs, {self.files} files: {self.ok} ok, {self.failed} failed"
               + (f" ({self.skipped} already in the store)" if self.skipped else "")
               + f", {self.seconds:.1f} s; store: {self.store}"]
        if self.top_findings:
            out.append("top findings: " + ", ".join(f"{fid} x{n}" for fid, n in self.top_findings))
        for path, reason in self.failures[:10]:
            out.append(f"failed: {reason if reason.startswith(path) else f'{path}: {reason}'}")
        if len(self.failures) > 10:
            out.append(f"... and {len(self.failures) - 10} more failed files (kinetoscope report {self.store})")
        return out + self.notes


#: Dask's nanny starts its workers with MALLOC_TRIM_THRESHOLD_=65536, and setting any of glibc's malloc thresholds
#: freezes the mmap threshold at 128 KiB: every column array of a trace is then mmap'ed, faulted in page by page and
#: unmapped again, and the trim gives the heap's top back after every free (a 17 MB rank: 54k page faults instead of
#: 300, sys time 0.11 s instead of 0.005, about twice the CPU in all). Both thresholds at glibc's own upper bound for
#: the dynamic mmap threshold (32 MiB) restore single-process speed for ~20 MiB more peak RSS per worker
#: (BENCHMARKS.md). The batch's own local workers get them; a cluster's are told how (deploy/README.md).
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(32 * 2**20), "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}
#: Dask settings for workers that run long CPU-bound tasks (deploy/README.md says why; BENCHMARKS.md measures):
#: no statistical profiler (it keeps every task's stacks, ~0.3 MB per trace analysed: a worker grew 202 -> 240 MiB
#: over 128 traces; the batch does not show them), and the event loop's 20 ms tick, the 0.5 s system monitor and the
#: 0.1 s memory monitor slowed down: an idle nanny and two workers spent 0.070 of a core on them, 0.008 with these
#: (0.06 CPU s per rank over a 1,024-rank batch). As environment variables for ``dask worker``: ``WORKER_ENV``.
WORKER_DASK_CONFIG: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "1s",
}
WORKER_ENV = {"DASK_" + k.upper().replace(".", "__").replace("-", "_"): str(v) for k, v in WORKER_DASK_CONFIG.items()}


def _worker_malloc_env() -> dict[str, str | None]:
    """On a worker: the malloc settings its process started with."""
    return {name: os.environ.get(name) for name in MALLOC_ENV}


def _slow_malloc(env: dict[str, str | None]) -> bool:
    """Thresholds set (which freezes glibc's dynamic mmap threshold) and either missing or below 16 MiB."""
    if all(v is None for v in env.values()):
        return False  # glibc's defaults: the mmap threshold adapts
    try:
        return any(v is None or int(v) < 16 * 2**20 for v in env.values())
    except ValueError:
        return True


def slow_allocator_note(client: Any) -> str | None:
    """A line of advice when a cluster's workers run with a small fixed malloc threshold (Dask's nanny sets one by
    default): each trace then costs them about twice the CPU. None when no worker does (or they cannot tell)."""
    try:
        settings = client.run(_worker_malloc_env)
    except Exception:  # noqa: BLE001 - advice only: a worker that cannot answer is not an error of the batch
        return None
    slow = [addr for addr, env in settings.items() if _slow_malloc(env)]
    if not slow:
        return None
    fix = " ".join(f"{k}={v}" for k, v in MALLOC_ENV.items())
    return (f"note: {len(slow)} of {len(settings)} workers run with a small fixed malloc threshold (Dask's nanny sets "
            f"MALLOC_TRIM_THRESHOLD_=65536): each trace costs them about twice the CPU; start `dask worker` with "
            f"{fix} in its environment (deploy/README.md)")


def _job_key(job: Job) -> str:
    return "job-" + hashlib.sha256(job.name.encode()).hexdigest()[:32]


def _client(scheduler: str | None, workers: int | None) -> tuple[Any, Any]:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        from kinetoscope.errors import KinetoscopeError

        raise KinetoscopeError("batch needs Dask: pip install 'kinetoscope[cluster]'") from None
    if scheduler:
        return Client(scheduler, timeout="30s"), None
    import dask

    settings: dict[str, Any] = dict(WORKER_DASK_CONFIG)  # on a cluster of your own: WORKER_ENV, deploy/README.md
    settings.update({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in MALLOC_ENV.items()})
    with dask.config.set(settings):
        cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                               dashboard_address=None, host="127.0.0.1")
    return Client(cluster), cluster


def run_batch(
    roots: list[str | os.PathLike[str]],
    store: str | os.PathLike[str],
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    resume: bool = False,
    client: Any = None,
    config: AnalysisConfig = DEFAULT_CONFIG,
    limits: LoadLimits = DEFAULT_LIMITS,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    compact_store: bool = True,
) -> BatchSummary:
    """Analyse every trace under ``roots`` on Dask and write the results into ``store``, then compact the store's
    small files into one part per table (``compact_store``)."""
    from dask.distributed import as_completed

    started = time.perf_counter()
    root = open_store(store, create=True)
    jobs = discover(roots)
    owned = None
    if client is None:
        client, owned = _client(scheduler, workers)
    summary = BatchSummary(store=str(root), jobs=len(jobs))
    if owned is None and (note := slow_allocator_note(client)) is not None:
        summary.notes.append(note)
    try:
        futures = {}
        for job in jobs:
            for index, file in enumerate(job.files):
                fut = client.submit(analyze_file, str(file), job.name, index, str(root), resume, limits,
                                    key=f"kinetoscope-{file_key(str(file), 'task')}", retries=2, pure=False)
                futures[fut] = (job, str(file), index)
        summary.files = len(futures)
        rows_by_job: dict[str, list[dict[str, Any]]] = {job.name: [] for job in jobs}
        pending = as_completed(list(futures))
        for fut in pending:
            job, path, index = futures.pop(fut)
            try:
                row = fut.result()
            except Exception as exc:  # noqa: BLE001 - the task died (e.g. its workers kept crashing)
                row = {"job": job.name, "path": path, "rank": index, "status": "failed",
                       "error": f"task failed: {type(exc).__name__}: {exc}", "key": file_key(path, "task-failed")}
                write_rows(root, "traces", row["key"], [row])
            fut.release()  # the worker may forget the result: the row is here now
            del fut
            rows_by_job[job.name].append(row)
            summary.skipped += bool(row.get("skipped"))
            if row["status"] == "ok":
                summary.ok += 1
            else:
                summary.failed += 1
                summary.failures.append((path, row.get("error") or "unknown error"))
            if on_result is not None:
                on_result(row)
        _cross_rank(root, jobs, rows_by_job, config)
        _hangs(root, jobs, config, limits)
        if compact_store:
            compact(root, SCHEMAS)
    finally:
        if owned is not None:
            client.close()
            owned.close()
    summary.top_findings = _top_findings(root)
    summary.seconds = time.perf_counter() - started
    return summary


def _judged(finding: Finding, summaries: list[RankSummary], config: AnalysisConfig) -> Finding:
    """The job-level finding judged by the one severity policy, as ``analyze`` judges it, from what the stored
    summaries hold: the others' wait for the straggler per step against its rank's mean step (was: stored with the
    finding's default, info, whatever it was worth). A straggler by the run's step counts is worth its cost over the
    run the summaries' step timings hold; for one by its arrivals the window's mean step stands for the run, and the
    title says nothing more than analyze's."""
    mine = next((s for s in summaries if s.rank == finding.rank), None)
    if finding.run_cost_us is not None and mine is not None and mine.run_wall_us:
        # a straggler by the run's step counts: worth what the run timed, as analyze judges it
        return judge(finding, RunTime(mean_step_us=mine.mean_step_us, run_steps=mine.run_timed_steps,
                                      run_wall_us=float(mine.run_wall_us), window_us=mine.window_us), config)
    saving = straggler_saving_us(finding.evidence)
    if mine is None or not mine.mean_step_us or saving is None:
        return judge(finding, RunTime(mean_step_us=None, run_steps=None, run_wall_us=None,
                                      window_us=mine.window_us if mine else 0.0), config)
    known = finding.evidence.get("cause") != "unknown" and finding.evidence.get("cause_excess_us_per_step") is not None
    mean_ns = float(mine.mean_step_us) * 1000.0
    estimate = Estimate.of(mean_ns, mean_ns - float(saving) * 1000.0, "measured: collective waits",
                           ("the others' waits for it at collectives, from the job's stored per-rank summaries"
                            + ("; its validation sharded across the group, each rank keeping its share"
                               if straggler_shards(finding.evidence) else ""),),
                           bound=None if known else "upper")
    return judge(replace(finding, estimate=estimate),
                 RunTime(mean_step_us=float(mine.mean_step_us), run_steps=None, run_wall_us=None,
                         window_us=mine.window_us), config)


def _cross_rank(
    root: StoreRoot, jobs: list[Job], rows_by_job: dict[str, list[dict[str, Any]]], config: AnalysisConfig
) -> None:
    """Job-level results (matched collectives, clock skews, the straggler) of each multi-rank job: a reduce
    over the small per-rank summaries the workers stored; no trace is loaded again."""
    for job in jobs:
        # in rank order, not the order the workers finished in: the reduce's output (its evidence's per-rank maps)
        # is then the same on any cluster
        rows = sorted((r for r in rows_by_job[job.name] if r["status"] == "ok"), key=lambda r: (r["rank"], r["path"]))
        if len(rows) < 2:
            continue
        summaries = []
        for r in rows:
            stored = read_rows(root, "summaries", r["key"])
            if stored:
                summaries.append(RankSummary.from_dict(json.loads(stored[0]["summary_json"])))
        if sum(1 for s in summaries if s.op) < 2:
            continue
        reduce_started = time.perf_counter()
        # the job-level analysis' reduce, through the registry, over the summaries the workers stored
        reduce = analyzer("collectives").reduce
        assert reduce is not None  # the collectives analyzer has one
        coll, _, finding = reduce(summaries, config)
        if finding is not None:
            finding = _judged(finding, summaries, config)
        reduce_s = time.perf_counter() - reduce_started
        path_of = {int(r["rank"]): r["path"] for r in rows}
        findings = [] if finding is None else [{
            "key": _job_key(job), "job": job.name, "path": path_of.get(finding.rank, job.name), "rank": finding.rank,
            "id": finding.id, "severity": finding.severity, "title": finding.title, "impact_us": finding.impact_us,
            "evidence_json": json.dumps(finding.evidence, default=str),
            # the job-level straggler: the others' wait for it per step, what its cause's removal gives back
            # (by the run's step counts: none in the window, its saving over the run in its evidence)
            "saving_us_per_step": None if finding.evidence.get("cause") == "uneven_steps"
            else straggler_saving_us(finding.evidence), "step_us_after": None,
            "estimate_json": None}]
        write_rows(root, "findings", _job_key(job), findings)
        write_rows(
            root,
            "job_ranks",
            _job_key(job),
            [
                {
                    "key": _job_key(job),
                    "job": job.name,
                    "rank": pr.rank,
                    "clock_skew_us": pr.clock_skew_us,
                    "wait_us": pr.wait_us,
                    "waited_for_count": pr.waited_for_count,
                    "waited_for_us": pr.waited_for_us,
                    "matched": pr.matched,
                    "unmatched": pr.unmatched,
                    "straggler": finding is not None and finding.rank == pr.rank,
                    "straggler_cause": finding.evidence["cause"]
                    if finding is not None and finding.rank == pr.rank
                    else None,
                    "waited_for_rank": pr.waited_for_rank,
                }
                for pr in coll.ranks
            ],
        )
        skews = [abs(pr.clock_skew_us) for pr in coll.ranks if pr.clock_skew_us is not None]
        write_rows(
            root,
            "jobs",
            _job_key(job),
            [
                {
                    "key": _job_key(job),
                    "job": job.name,
                    "ranks": len(rows),
                    "ranks_with_collectives": sum(1 for s in summaries if s.op),
                    "matched": coll.matched,
                    "unmatched": coll.unmatched,
                    "reference_rank": coll.reference_rank,
                    "most_waited_for_rank": coll.most_waited_for_rank,
                    "straggler_rank": finding.rank if finding is not None else None,
                    "straggler_cause": finding.evidence["cause"] if finding is not None else None,
                    "straggler_wait_us_per_step": finding.evidence["others_wait_us_per_step"]
                    if finding is not None
                    else None,
                    "max_abs_clock_skew_us": max(skews) if skews else None,
                    "reduce_s": reduce_s,
                }
            ],
        )


def _hangs(root: StoreRoot, jobs: list[Job], config: AnalysisConfig, limits: LoadLimits) -> None:
    """Each job's hang dumps (small JSON files, read here), diagnosed by the registry's ``hang`` analyzer: a row of
    the ``hangs`` table and, where it hung, its finding. Dumps that cannot be read (a pickle) are a failed row."""
    from kinetoscope.analyze.ingest.hangs import read_hang_dumps
    from kinetoscope.analyze.model.trace import Trace
    from kinetoscope.errors import KinetoscopeError

    for job in jobs:
        if not job.hang_dumps:
            continue
        key = _job_key(job)
        row: dict[str, Any] = {"key": key, "job": job.name, "dumps": len(job.hang_dumps)}
        try:
            dumps = read_hang_dumps(job.hang_dumps, limits)
        except KinetoscopeError as exc:
            write_rows(root, "hangs", key, [{**row, "status": "failed", "error": str(exc)}])
            continue
        result = analyzer("hang").fn(Trace(source=job.name, ranks=(), hang_dumps=dumps), config)
        finding = result.findings[0] if result.findings else None
        m = result.fragment()  # the job's hang object (``model.results.Hang``); a key only where the dumps say it
        write_rows(root, "hangs", key, [{
            **row, "status": "ok", "error": None, "hung": finding is not None,
            "process_group": m.get("process_group"), "seq": m.get("seq"), "op": m.get("expected_op"),
            "stuck_ranks": m.get("stuck_ranks"), "missing_ranks": m.get("missing_ranks"),
            "mismatched_ranks": m.get("mismatched_ranks"), "waiting_ranks": m.get("waiting_ranks"),
            "ranks_without_dump": m.get("ranks_without_dump"),
            "cause": finding.title if finding is not None else None}])
        if finding is not None:
            existing = read_rows(root, "findings", key) or []
            write_rows(root, "findings", key, [r for r in existing if r["id"] != "hang"] + [{
                "key": key, "job": job.name, "path": job.name, "rank": None, "id": "hang", "severity": finding.severity,
                "title": finding.title, "impact_us": finding.impact_us,
                "evidence_json": json.dumps(finding.evidence, default=str), "saving_us_per_step": None,
                "step_us_after": None, "estimate_json": None}])


def _top_findings(root: StoreRoot) -> list[tuple[str, int]]:
    from kinetoscope.batch.store import read_table

    findings = read_table(root, "findings")
    return Counter(findings["id"]).most_common(5) if len(findings) else []


def print_progress_factory(total: int) -> Callable[[dict[str, Any]], None]:
    """A one-line progress printer for terminals (rich when available)."""
    try:
        from rich.console import Console

        console = Console(stderr=True)
    except ImportError:  # pragma: no cover
        console = None
    done = {"n": 0}

    def show(row: dict[str, Any]) -> None:
        done["n"] += 1
        status = "skip" if row.get("skipped") else row["status"]
        text = f"[{done['n']}/{total}] {status:6s} {row['path']}"
        if console is not None:
            style = {"ok": "green", "failed": "red", "skip": "dim"}[status]
            console.print(text, style=style, highlight=False)
        else:  # pragma: no cover
            print(text, file=sys.stderr)

    return show
