"""Run every registered analyzer over a job and collect one report.

The JSON form (``Report.to_dict``) is the stable machine-readable contract;
see ``docs/report.md``. ``schema_version`` changes only when a key is removed
or changes meaning; new keys may appear at any time.
"""

from __future__ import annotations

import os
import time
import traceback
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from kinetoscope import __version__
from kinetoscope.analyze import whatif
from kinetoscope.analyze.model.config import DEFAULT_CONFIG, AnalysisConfig
from kinetoscope.analyze.model.findings import Finding, rank_findings
from kinetoscope.analyze.model.record import Record, json_ready
from kinetoscope.analyze.model.timeline import window
from kinetoscope.analyze.model.trace import RankTrace, Trace
from kinetoscope.analyze.registry import AnalysisResult, analyzers
from kinetoscope.analyze.report.policy import RunTime, judge, judge_as_job, limit
from kinetoscope.errors import ConfigError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class AnalyzerFailure:
    analyzer: str
    rank: int | None
    error: str
    detail: str


R = TypeVar("R", bound=Record)


@dataclass(frozen=True)
class RankReport:
    """One rank's report entry, typed: the header, then each analyzer's result record (by registry key, in the
    registry's order; an analyzer that failed is absent), then the what-if's replay check. ``to_dict`` writes the
    report's rank entry (``docs/report.md``)."""

    rank: int
    #: "trace" (the file says), "file name", or "default" (nothing said: 0)
    rank_source: str
    world_size: int | None
    file: str
    #: each device's name (None where unnamed); None where the trace names no device
    devices: list[str | None] | None
    events: int
    memory_events: int
    warnings: list[str]
    unhandled_events: dict[str, int]
    #: each analyzer's metrics by registry key: a typed record, or a dict from an analyzer not yet typed
    analyses: dict[str, Record | dict[str, Any] | None] = field(default_factory=dict)
    #: the what-if's replay of the rank's steps against what was measured (``whatif.replay_entry``); None where it
    #: failed
    replay: dict[str, Any] | None = None
    #: further per-rank blocks written after ``replay``, in order, by key (the what-if's own blocks beside the
    #: replay: ``comm_roles``, ``critical_path``): a typed record, or None where the block does not apply or failed
    after_replay: dict[str, Record | dict[str, Any] | None] = field(default_factory=dict)

    def result(self, cls: type[R]) -> R | None:
        """The typed result of that record type (``rr.result(StepsResult)``, or a block written after the replay:
        ``rr.result(CommRoles)``); None where its analyzer failed or is not typed, or the block is absent."""
        return next((m for m in (*self.analyses.values(), *self.after_replay.values()) if isinstance(m, cls)), None)

    def value(self, key: str) -> Any:
        """The rank entry's ``key`` as the JSON report has it (``rr.value("host")``), from whichever analyzer
        gives it, typed or not; None where none does. For renderers of an analyzer not yet typed: typed ones are
        read with ``result``."""
        for metrics in self.analyses.values():
            if isinstance(metrics, Record):
                if key in metrics.__struct_fields__:
                    return json_ready(getattr(metrics, key))
            elif metrics and key in metrics:
                return metrics[key]
        return json_ready(self.after_replay.get(key))

    def header(self) -> dict[str, Any]:
        return {"rank": self.rank, "rank_source": self.rank_source, "world_size": self.world_size, "file": self.file,
                "devices": self.devices, "events": self.events, "memory_events": self.memory_events,
                "warnings": self.warnings, "unhandled_events": self.unhandled_events}

    def to_dict(self) -> dict[str, Any]:
        out = self.header()
        for metrics in self.analyses.values():
            if isinstance(metrics, Record):
                out.update(metrics.to_dict())
            elif metrics:
                out.update(metrics)
        out["replay"] = self.replay
        out.update({key: json_ready(block) for key, block in self.after_replay.items()})
        return out


@dataclass(frozen=True)
class Report:
    source: str
    #: each rank's entry as the JSON report writes it (``RankReport.to_dict``), for readers of the contract
    ranks: tuple[dict[str, Any], ...]
    findings: tuple[Finding, ...]
    job: dict[str, Any]
    #: full results (with DataFrames) for renderers that show tables, by rank then analyzer key
    results: dict[int, dict[str, AnalysisResult]] = field(repr=False, default_factory=dict)
    job_results: dict[str, AnalysisResult] = field(repr=False, default_factory=dict)
    failures: tuple[AnalyzerFailure, ...] = ()
    #: numbers that break an invariant (a fraction outside [0, 1], a fix whose replayed step ends later than before):
    #: a bug, reported, never clamped away
    violations: tuple[str, ...] = ()
    #: each rank's entry, typed (what ``ranks`` is written from), in the same order
    rank_reports: tuple[RankReport, ...] = ()
    #: seconds each analyzer took, summed over ranks ("replay" and "estimates": the what-if), for benchmarks;
    #: not part of the JSON report (timings are not results)
    timings_s: dict[str, float] = field(repr=False, default_factory=dict)

    @property
    def worst_rank(self) -> int | None:
        """The rank of the first-ranked finding that names one (most severe, largest saving), the straggler among
        findings as severe (the rank the others wait for is where a job's time goes); else the first."""
        named = [f for f in self.findings if f.rank is not None and any(r["rank"] == f.rank for r in self.ranks)]
        if named:
            top = [f for f in named if f.severity == named[0].severity]
            straggler = next((f for f in top if f.id == "straggler"), None)
            return int((straggler or named[0]).rank)  # type: ignore[arg-type]
        return int(self.ranks[0]["rank"]) if self.ranks else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "kinetoscope", "version": __version__},
            "source": self.source,
            "ranks": list(self.ranks),
            "job": self.job,
            "findings": [f.to_dict() for f in self.findings],
            "analysis_errors": [
                {"analyzer": f.analyzer, "rank": f.rank, "error": f.error} for f in self.failures
            ],
            "invariant_violations": list(self.violations),
        }


def entry_value(entry: dict[str, Any], *keys: str) -> Any:
    """A value deep in a rank entry (``entry_value(r, "steps", "mean_us")``), None where any level is missing."""
    value: Any = entry
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


#: keys holding a share of something (``fraction_of`` says what): each must lie in [0, 1]
_FRACTION_SUFFIXES = ("fraction", "_share")
_TOLERANCE = 1e-9


def estimate_violations(findings: list[Finding]) -> list[str]:
    """Estimates are never clamped: a fix whose replayed step ends later than before (or before it begins) is the
    model's error, listed with the report's invariant violations."""
    return [f"finding {f.id} (rank {f.rank}): {v}" for f in findings if f.estimate is not None
            for v in f.estimate.violations()]


def fraction_violations(obj: Any, path: str = "") -> list[str]:
    """Every fraction in a report fragment that lies outside [0, 1], as ``path = value``."""
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            where = f"{path}.{k}" if path else str(k)
            k = str(k)
            if (str(k).endswith(_FRACTION_SUFFIXES) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    and not (-_TOLERANCE <= v <= 1 + _TOLERANCE)):
                out.append(f"{where} = {v}")
            out += fraction_violations(v, where)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += fraction_violations(v, f"{path}[{i}]")
    return out


def above_peak_violations(entry: dict[str, Any]) -> list[str]:
    """No kernel or operator achieves more than its device's peak: one that does was given FLOPs that are not its own
    (an attribution bug), said plainly beside the out-of-range fraction."""
    eff = entry.get("efficiency") or {}
    out = []
    for table in ("kernels", "operators"):
        for row in eff.get(table) or []:
            achieved, peak = row.get("achieved_tflops"), row.get("peak_tflops")
            if achieved is not None and peak is not None and achieved > peak:
                out.append(f"efficiency.{table}: {row.get('name')} achieves {achieved} TFLOP/s, above its device's "
                           f"{row.get('peak_dtype')} peak of {peak} (FLOPs attributed to the wrong kernels)")
    return out


def _rank_header(r: RankTrace) -> RankReport:
    m = r.meta
    return RankReport(
        rank=r.rank,
        rank_source=m.rank_source,
        world_size=m.world_size,
        file=m.source,
        devices=[p.get("name") for p in m.device_properties] or None,
        events=int(len(r.events)),
        memory_events=int(len(r.memory)),
        warnings=list(m.warnings),
        unhandled_events=dict(m.unhandled_events),
    )


def _capped(found: tuple[Finding, ...], entry: dict[str, Any]) -> list[Finding]:
    """A window the trace did not mark (steps inferred from DataLoader waits) cannot carry the strongest
    claim: findings on it are at most warnings, and say why; nothing but a step cut short carries no claim."""
    steps = entry.get("steps") or {}
    if steps.get("partial") and not steps.get("count"):
        # nothing but a step cut short (a crash, a stop): no warning rests on that alone
        return [limit(f, "info", "from a partial step only: the run ended inside it",
                      {"window_basis": "partial_step"}) for f in found]
    if (entry.get("window") or {}).get("basis") != "inferred_steps":
        return list(found)
    return [limit(f, "warning", "steps inferred: the trace has no ProfilerStep marks",
                  {"window_basis": "inferred_steps"}) for f in found]


#: a rank's analyzers share threads when a rank holds this many events (measured: 290k events 0.31 -> 0.23 s on
#: two threads; 104k events 0.12 -> 0.13 s, 27k events 0.08 -> 0.10 s: the GIL taken in turns costs more)
THREADS_FROM_EVENTS = 200_000


def analysis_threads(chosen: int | None = None) -> int:
    """Threads a large rank's analyzers share: ``chosen`` (the command's ``KINETOSCOPE_THREADS``; 1: one after
    another), else up to 4 (past that the GIL-bound parts dominate), no more than the cores."""
    if chosen is not None:
        if not 1 <= chosen <= 64:
            raise ConfigError(f"{chosen} analysis threads: expected a whole number of threads from 1 to 64")
        return chosen
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


def _timed(key: str, rank: int | None, fn: Any, *args: Any) -> tuple[Any, AnalyzerFailure | None, float]:
    """(fn's result, None, seconds) or (None, the failure, seconds): one broken analyzer, or what-if, must not sink
    the report."""
    started = time.perf_counter()
    try:
        return fn(*args), None, time.perf_counter() - started
    except Exception as exc:
        return None, AnalyzerFailure(key, rank, f"{type(exc).__name__}: {exc}", traceback.format_exc()), \
            time.perf_counter() - started


def _exposure_less_waits(trace: Trace, findings: list[Finding], job: dict[str, Any],
                         config: AnalysisConfig) -> list[Finding]:
    """Each rank's exposed communication less its waits for later ranks beyond what every rank waits, where the job's
    collectives were matched across ranks (that part is a straggler's cost, not overlap to be had), judged again.
    What every rank waits inside a step - per step, the least any rank waits: lateness that moves between ranks
    within a step, each waiting for the others in turn - is no rank's cost to fix, and overlapped collectives hide it
    like their transfer: it stays exposure. Lateness that moves from step to step does not (each step ends in a
    barrier its slowest rank sets; was: the least total wait of any rank stayed, so a one-bucket DDP job whose ranks
    took turns being late by 10-30 ms was told overlap would win 5% of its run, where its all-reduce takes under a
    millisecond with both ranks there)."""
    from kinetoscope.analyze.report.exposure import runqueue_less_waits, without_waits

    ranks = [r for r in (job.get("collectives") or {}).get("ranks", []) if r.get("wait_us") is not None]
    if not ranks or not any(r["wait_us"] for r in ranks):
        return findings
    coll = job.get("collectives") or {}
    shared = float(coll.get("shared_wait_us") or 0.0)
    waits = {r["rank"]: float(r["wait_us"]) for r in ranks}
    # exposure less the waits in it: a wait the rank spends computing (an overlapped bucket's) was never exposed; a
    # rank whose exposure its trace cannot tell counts its whole wait
    exposed_waits = {r["rank"]: float(r["exposed_wait_us"] if r.get("exposed_wait_us") is not None else r["wait_us"])
                     for r in ranks}
    known = coll.get("shared_exposed_wait_us")
    exposed_shared = float(known) if known is not None else shared
    # ranks losing time to the run queue over the run (measured): a host whose CPUs every rank lacks
    starved = {f.rank for f in findings if f.id == "host_oversubscribed" and f.evidence.get("measured")
               and _run_or_window_share(f) >= config.host_runqueue_min_fraction}
    out = []
    for f in findings:
        if (f.id == "exposed_comm" and f.rank is not None and exposed_waits.get(f.rank)
                and any(r.rank == f.rank for r in trace.ranks)):
            g = without_waits(f, exposed_waits[f.rank], config, shared_us=exposed_shared)
            out.append(f if g is f else _judged_again(g, trace.rank(f.rank), float(g.evidence.get("window_us") or 0),
                                                      config))
        elif (f.id == "host_oversubscribed" and f.rank is not None and waits.get(f.rank) and f.evidence.get("measured")
              and not (starved - {f.rank}) and any(r.rank == f.rank for r in trace.ranks)):
            # the ranks it waits for lose no time to the run queue: its own loss hides behind their lateness (where
            # they are starved too, a fix of the shared host speeds them as well: nothing is taken off)
            g = runqueue_less_waits(f, waits[f.rank], shared_us=shared)
            r = trace.rank(f.rank)
            out.append(f if g is f else _judged_again(g, r, window(r).dur_ns / 1000.0, config))
        else:
            out.append(f)
    return out


def _judged_again(f: Finding, r: RankTrace, window_us: float, config: AnalysisConfig) -> Finding:
    """A finding the job-level pass scaled, judged again against its rank's run (its estimate's mean step before)."""
    est = f.estimate
    mean = float(est.step_us_after) + float(est.saving_us_per_step) if est is not None else None
    first = f.extra.get("run_time")
    # the run it was first judged against, where its window's steps are known (was: the run without them, so a
    # saving the estimate placed in the window's steps was spread over the run's alike, for the re-judged rank only)
    run = replace(first, mean_step_us=mean, window_us=window_us) if isinstance(first, RunTime) \
        else _run_of(r, mean, window_us)
    return judge(f, run, config)


def _run_or_window_share(f: Finding) -> float:
    """A measured run-queue finding's share of the run where the capture timed it, else of the window."""
    run = f.evidence.get("run_lost_fraction")
    window = f.evidence.get("runqueue_wait_fraction_of_steps")
    return float(run) if isinstance(run, (int, float)) else float(window or 0)


def run_time(r: RankTrace) -> RunTime:
    """What a finding of this rank is worth against: its replayed mean step, the run the capture timed, its window."""
    if not whatif.replay_graph(r).steps:
        return _run_of(r, None, window(r).dur_ns / 1000.0)
    base = whatif.baseline(r)
    return _run_of(r, base.mean_step_ns / 1000.0, window(r).dur_ns / 1000.0,
                   tuple(float(x) / 1000.0 for x in base.step_ns))


def _run_of(r: RankTrace, mean_step_us: float | None, window_us: float,
            window_steps_us: tuple[float, ...] | None = None) -> RunTime:
    """A RunTime from a mean step and window already known, and the steps the capture timed."""
    rs = r.run_steps
    if rs is None or len(rs) == 0:
        return RunTime(mean_step_us=mean_step_us, run_steps=None, run_wall_us=None, window_us=window_us)
    walls = rs["wall_ns"].to_numpy(dtype=float)
    return RunTime(mean_step_us=mean_step_us, run_steps=int(len(rs)), run_wall_us=float(walls.sum()) / 1000.0,
                   window_us=window_us, window_steps_us=window_steps_us,
                   run_steps_us=tuple((walls / 1000.0).tolist()))


def _estimated(r: RankTrace, found: list[Finding],
               config: AnalysisConfig) -> tuple[list[Finding], list[AnalyzerFailure]]:
    """Each finding with what fixing it alone is worth for its rank (``whatif``), judged by the severity policy,
    and the estimates that failed."""
    out, failures = [], []
    run, failure, _ = _timed("whatif", r.rank, run_time, r)
    if failure is not None:  # no replay: worth from what the analyzers measured, over the window
        failures.append(failure)
        run = RunTime(None, None, None, window(r).dur_ns / 1000.0)
    for f in found:
        estimate, failure, _ = _timed("whatif", r.rank, whatif.estimate, r, f)
        out.append(judge(replace(f, estimate=estimate), run, config))
        failures.extend([failure] if failure is not None else [])
    return out, failures


#: ranks started at once when views are dropped as ranks finish (``keep_views=False``); with more than one thread,
#: one more may still hold its views while its last work (``_finish_rank``) runs
RANKS_IN_FLIGHT = 2


def _finish_rank(r: RankTrace, found: list[Finding], maps: list[tuple[str, Any]], keep_views: bool,
                 config: AnalysisConfig) -> tuple[list[Finding], list[AnalyzerFailure], dict[str, float]]:
    """A rank's last work: its findings' estimates, then the job analyzers' map steps (views, kept with the rank;
    one that fails here fails again, reported, in its analyzer; seconds by analyzer); then, unless kept, its other
    views are dropped."""
    out, failures = _estimated(r, found, config)
    took: dict[str, float] = {}
    for key, step in maps:
        started = time.perf_counter()
        try:
            step(r)
        except Exception:  # noqa: BLE001 - reported by the job analyzer, which asks for it again
            pass
        took[key] = time.perf_counter() - started
    if not keep_views:
        r.drop_views(keep=tuple(step for _, step in maps))
    return out, failures, took


def build_report(trace: Trace, config: AnalysisConfig = DEFAULT_CONFIG, *, threads: int | None = None,
                 keep_views: bool = True, max_threads: int | None = None) -> Report:
    """Run the registry over every rank, then the job-level analyzers. ``threads``: how many the analyzers share
    (default: ``analysis_threads(max_threads)`` when a rank has THREADS_FROM_EVENTS events, else 1; a caller running
    reports side by side, such as a batch worker, gives 1). ``keep_views=False``: each rank's derived views are dropped
    once its analyses end, and RANKS_IN_FLIGHT ranks are started at once (one more may be finishing), so a job of
    many ranks holds the views of two or three, not of all (for a caller that will not look at the views again,
    such as the command)."""
    rank_reports: list[RankReport] = []
    findings: list[Finding] = []
    results: dict[int, dict[str, AnalysisResult]] = {}
    failures: list[AnalyzerFailure] = []
    timings: defaultdict[str, float] = defaultdict(float)
    registered = analyzers()
    per_rank = [a for a in registered if a.scope == "rank"]
    # the job analyzers' map steps, while each rank's views are at hand (one rank: nothing to reduce over)
    maps = [(a.key, a.per_rank) for a in registered if a.scope == "job" and a.per_rank is not None] \
        if len(trace.ranks) > 1 else []
    # a rank's analyzers are pure and independent: ranks' analyzers run on threads at once (numpy and pandas
    # release the GIL in their sorts, searches and takes); results are taken in the registry's and the ranks'
    # order, so the report is the one they give one after another
    if threads is None:  # below ~200k events a rank's pandas operations are too small: threads only contend
        chosen = analysis_threads(max_threads)
        threads = chosen if any(len(r.events) >= THREADS_FROM_EVENTS for r in trace.ranks) else 1
    in_flight = len(trace.ranks) if keep_views else RANKS_IN_FLIGHT
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kinetoscope-analyze")

    def start(r: RankTrace) -> tuple[list[Any], Any, Any, Any]:
        return ([pool.submit(_timed, a.key, r.rank, a.fn, r, config) for a in per_rank],
                pool.submit(_timed, "whatif", r.rank, whatif.replay_entry, r),
                pool.submit(_timed, "critical_path", r.rank, whatif.critical_path_entry, r),
                pool.submit(_timed, "comm_roles", r.rank, whatif.comm_roles_entry, r, config))

    try:
        running = [start(r) for r in trace.ranks[:in_flight]]
        estimating = []
        rank_failures: list[list[AnalyzerFailure]] = []  # in the order one thread would meet them, rank by rank
        unestimated: list[list[Finding]] = []
        for i, r in enumerate(trace.ranks):
            futures, replay, path, roles = running[i]
            typed = _rank_header(r)
            entry = typed.header()  # the entry so far, for the ceilings of the findings that follow
            results[r.rank] = {}
            mine: list[Finding] = []
            lost: list[AnalyzerFailure] = []
            for a, future in zip(per_rank, futures, strict=False):
                res, failure, took = future.result()
                timings[a.key] += took
                if failure is not None:  # one broken analyzer must not sink the report
                    lost.append(failure)
                    continue
                results[r.rank][a.key] = res
                typed.analyses[a.key] = res.metrics
                entry.update(res.fragment())
                mine.extend(_capped(res.findings, entry))
            played, failure, took = replay.result()
            timings["replay"] += took
            if failure is not None:  # the what-if must not sink the report
                lost.append(failure)
            after: dict[str, Record | dict[str, Any] | None] = {}
            for key, future in (("critical_path", path), ("comm_roles", roles)):
                after[key], failure, took = future.result()
                timings[key] += took
                if failure is not None:
                    lost.append(failure)
            rank_reports.append(replace(typed, replay=played, after_replay=after))
            estimating.append(pool.submit(_timed, "whatif", r.rank, _finish_rank, r, mine, maps, keep_views,
                                          config))
            if i + in_flight < len(trace.ranks):  # queued after this rank's last work: its views go first
                running.append(start(trace.ranks[i + in_flight]))
            rank_failures.append(lost)
            unestimated.append(mine)
        for future, lost, mine in zip(estimating, rank_failures, unestimated, strict=False):
            done, failure, took = future.result()
            if failure is not None:  # a bug past the estimates (each caught on its own): the findings, unestimated
                findings.extend(mine)
                failures.extend(lost + [failure])
                continue
            found, more, mapped = done
            findings.extend(found)
            failures.extend(lost + more)
            for key, seconds in mapped.items():
                timings[key] += seconds
            timings["estimates"] += took - sum(mapped.values())
    except BaseException:  # Ctrl-C (or a bug): the analyses not yet started are dropped, not waited for
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    missing = list(trace.missing_ranks)
    job: dict[str, Any] = {"ranks": len(trace.ranks), "world_size": trace.world_size, "missing_ranks": missing}
    job_results: dict[str, AnalysisResult] = {}
    for a in registered:
        if a.scope != "job":
            continue
        res, failure, took = _timed(a.key, None, a.fn, trace, config)
        timings[a.key] += took
        if failure is not None:
            failures.append(failure)
            continue
        job_results[a.key] = res
        if res.fragment():
            job[a.key] = res.fragment()
        for f in res.findings:
            if missing and f.id != "hang":  # a claim about the whole job (its straggler) over ranks it never saw is
                continue                    # not made; a hang rests on the ranks' dumps, not on their traces
            ranks = [r for r in trace.ranks if r.rank == f.rank]
            found, lost = _estimated(ranks[0], [f], config) if ranks else ([f], [])
            findings.extend(found)
            failures.extend(lost)
    findings = _exposure_less_waits(trace, findings, job, config)
    if len(trace.ranks) > 1:
        findings = judge_as_job(findings, config)
    entries = [rr.to_dict() for rr in rank_reports]  # the JSON report's rank entries, from the typed ones
    violations = [f"rank {e['rank']}: {v}" for e in entries for v in fraction_violations(e)]
    violations += [f"rank {e['rank']}: {v}" for e in entries for v in above_peak_violations(e)]
    violations += [f"job: {v}" for v in fraction_violations(job)]
    violations += [f"finding {f.id} (rank {f.rank}): {v}" for f in findings for v in fraction_violations(f.evidence)]
    violations += estimate_violations(findings)
    return Report(
        source=trace.source,
        ranks=tuple(entries),
        findings=tuple(rank_findings(findings)),
        job=job,
        rank_reports=tuple(rank_reports),
        results=results,
        job_results=job_results,
        failures=tuple(failures),
        violations=tuple(violations),
        timings_s=dict(timings),
    )
