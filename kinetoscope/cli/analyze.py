"""``kinetoscope analyze``: a report per job, as text or JSON."""

from __future__ import annotations

import argparse
import sys

from kinetoscope.cli import process
from kinetoscope.cli.output import EXIT_GATE, EXIT_INTERNAL, EXIT_OK, SEVERITY_LEVEL, error, internal, write
from kinetoscope.cli.process import import_pandas_without_pyarrow
from kinetoscope.deps import require
from kinetoscope.errors import KinetoscopeError


def add_parser(sub: argparse._SubParsersAction) -> None:
    analyze = sub.add_parser(
        "analyze",
        help="analyse trace files or rank directories and print a report",
        description=(
            "Analyse each PATH (a .json/.json.gz trace, or a directory holding one job's rank files) and print "
            "a report: findings ranked by severity, then per-rank numbers. A broken PATH is reported on stderr "
            "and the others are still analysed. Exit codes: 0 ok, 2 bad input, 1 internal error."
        ),
    )
    analyze.add_argument("paths", nargs="+", metavar="PATH", help="trace file or directory of rank traces")
    analyze.add_argument("--format", choices=("text", "json"), default="text",
                         help="text (default) or json: one JSON report per PATH, one per line")
    analyze.add_argument("--indent", type=int, default=None, help="pretty-print JSON with this indent")
    analyze.add_argument("--max-size", default="8G", help="refuse traces larger than this once gunzipped (default 8G)")
    analyze.add_argument(
        "--max-events", type=int, default=200_000_000, help="refuse traces with more events (default 200M)"
    )
    analyze.add_argument("--max-depth", type=int, default=512,
                         help="refuse JSON nested deeper than this many levels (default 512, at most 900)")
    analyze.add_argument("--max-fallback", default="16M",
                         help="largest file (gunzipped) the reference decoder may hold whole in memory, for valid JSON "
                              "the fast scanner does not handle (default 16M)")
    analyze.add_argument("--processes", type=int, default=1,
                         help="parse the rank files of a job in this many processes (default 1)")
    analyze.add_argument("--cache", action="store_true",
                         help="keep parsed traces as Parquet in ~/.cache/kinetoscope (or $KINETOSCOPE_CACHE_DIR) "
                              "and reopen them from there")
    analyze.add_argument("--fail-on", choices=("info", "warning", "critical"),
                         help="exit 3 when a finding of this severity or worse is found (a CI gate)")
    analyze.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    analyze.set_defaults(func=run, quick_exit=True)



def run(args: argparse.Namespace) -> int:
    from kinetoscope.analyze.ingest.jobs import find_jobs
    from kinetoscope.analyze.ingest.limits import LoadLimits, parse_size
    from kinetoscope.analyze.ingest.scan import Ahead
    from kinetoscope.cli.settings import default_cache_dir, from_environment

    settings = from_environment()
    limits = LoadLimits(max_decompressed_bytes=parse_size(args.max_size), max_events=args.max_events,
                        max_depth=args.max_depth, max_fallback_bytes=parse_size(args.max_fallback),
                        decoder=settings.decoder)
    cache = default_cache_dir() if args.cache or settings.cache_dir is not None else None
    status = EXIT_OK
    jobs = []
    for path in args.paths:
        try:
            jobs.extend(find_jobs(path))
        except KinetoscopeError as exc:
            error(str(exc))
            status = max(status, exc.exit_code)
    # parsing ranks in processes hands their tables over as Arrow: only a job of several files needs it
    in_processes = args.processes > 1 and any(len(job.files) > 1 for job in jobs)
    if cache is not None or in_processes:
        require("pyarrow", "--cache and --processes" if in_processes and cache else
                "--processes" if in_processes else "--cache (or KINETOSCOPE_CACHE_DIR)", "app")
    ahead = None
    if jobs and jobs[0].files and cache is None and not (args.processes > 1 and len(jobs[0].files) > 1):
        ahead = Ahead(jobs[0].files[0], limits)  # read while the analyses below are imported (~0.3 s)
    if cache is None and not in_processes and args.own_process:
        import_pandas_without_pyarrow()  # no tables handed over as Arrow here: pandas' plain columns, 0.15 s sooner
    from kinetoscope.analyze.report.job import analyse_job
    from kinetoscope.render.json import report_to_json
    from kinetoscope.render.text import render_text

    after_parse = process.give_back_free_memory if args.own_process else None
    for i, job in enumerate(jobs):
        path = job.name
        try:
            report = analyse_job(job, limits=limits, cache=cache, processes=args.processes,
                                 ahead=ahead if i == 0 else None, after_parse=after_parse, keep_views=False,
                                 max_threads=settings.threads).report
            assert report is not None  # not tolerant: a job that cannot be read raised
        except KinetoscopeError as exc:
            error(str(exc))
            status = max(status, exc.exit_code)
            continue
        except Exception as exc:  # an internal bug on one input must not lose the others
            internal(exc, args.debug, context=str(path))
            status = EXIT_INTERNAL if status == EXIT_OK else status
            continue
        if args.format == "json":
            write(report_to_json(report, indent=args.indent) + "\n")
        else:
            if i:
                write("\n")
            write(render_text(report))
        if args.fail_on and any(SEVERITY_LEVEL[f.severity] <= SEVERITY_LEVEL[args.fail_on] for f in report.findings):
            worst = report.findings[0]
            error(f"{path}: {worst.severity} finding {worst.id} (--fail-on {args.fail_on})")
            status = max(status, EXIT_GATE) if status != EXIT_INTERNAL else status
        for failure in report.failures:
            error(f"{path}: analyzer {failure.analyzer} failed on rank {failure.rank}: {failure.error}")
            if args.debug:
                sys.stderr.write(failure.detail)
            status = EXIT_INTERNAL if status == EXIT_OK else status
    return status


