"""``analyse_job``: a job's files in, its ``Trace`` and ``Report`` out. The one entry the command, the app and batch
share: load (ingest), then every registered analyzer, the estimates and the severity policy (``build_report``).

What differs between callers is said in parameters, never read from the process: how the files are read
(``limits``, ``cache``, ``processes``, a scan already started), what the caller's own process does after a parse
(``after_parse``), whether a broken rank file sinks the job (``tolerant``), and how many threads the analyzers
share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kinetoscope.analyze.ingest import scan
from kinetoscope.analyze.ingest.jobs import Job, TraceFile
from kinetoscope.analyze.ingest.limits import DEFAULT_LIMITS, LoadLimits
from kinetoscope.analyze.ingest.loader import load_job, load_job_tolerant
from kinetoscope.analyze.model.config import DEFAULT_CONFIG, AnalysisConfig
from kinetoscope.analyze.model.trace import Trace
from kinetoscope.analyze.report import builder
from kinetoscope.analyze.report.builder import Report


@dataclass(frozen=True)
class JobAnalysis:
    #: None where no file of the job could be read (``tolerant``; ``failed`` says why)
    trace: Trace | None
    report: Report | None
    #: rank files that could not be read, with the reason (``tolerant`` only; else the first one raises)
    failed: tuple[tuple[TraceFile, str], ...] = ()
    load_seconds: float = 0.0
    analyse_seconds: float = 0.0


def analyse_job(job: Job, config: AnalysisConfig = DEFAULT_CONFIG, *, limits: LoadLimits = DEFAULT_LIMITS,
                cache: Path | None = None, processes: int = 1, ahead: scan.Ahead | None = None,
                after_parse: Callable[[], None] | None = None, first_rank: int = 0, tolerant: bool = False,
                relabel: Callable[[Trace], Trace] | None = None, threads: int | None = None,
                keep_views: bool = True, max_threads: int | None = None) -> JobAnalysis:
    """Load ``job`` and report on it. ``tolerant``: broken rank files are returned in ``failed`` and the rest are
    analysed (else the first raises its ``KinetoscopeError``). ``relabel``: the caller's change to the loaded trace
    before it is analysed (the app names uploaded files by their name, not the server's folder). ``first_rank``,
    ``threads``, ``keep_views``, ``max_threads``: as ``load_job`` and ``build_report`` take them."""
    started = time.perf_counter()
    failed: list[tuple[TraceFile, str]] = []
    if tolerant:
        trace, failed = load_job_tolerant(job, limits, after_parse=after_parse, first_rank=first_rank)
    else:
        trace = load_job(job, limits, cache, processes=processes, ahead=ahead, after_parse=after_parse,
                         first_rank=first_rank)
    loaded = time.perf_counter()
    if trace is None:
        return JobAnalysis(None, None, tuple(failed), loaded - started)
    if relabel is not None:
        trace = relabel(trace)
    report = builder.build_report(trace, config, threads=threads, keep_views=keep_views, max_threads=max_threads)
    return JobAnalysis(trace, report, tuple(failed), loaded - started, time.perf_counter() - loaded)


def job_at(path: str | Path) -> Job:
    """The one job at ``path`` (a trace file, or a directory of one job's rank files)."""
    from kinetoscope.analyze.ingest.jobs import resolve

    return Job(str(path), tuple(resolve(path)))
