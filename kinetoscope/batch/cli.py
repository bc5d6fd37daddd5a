"""``kinetoscope batch`` and ``kinetoscope report``."""

from __future__ import annotations

import argparse
import sys

from kinetoscope.deps import require
from kinetoscope.errors import ConfigError


def add_batch_commands(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "batch",
        help="analyse every trace under some directories on Dask, into a Parquet store",
        description=(
            "Discover jobs under each ROOT (rank files of one job are grouped; a lone trace is a job of one rank), "
            "analyse every file in parallel on Dask and write one row per file, finding and step into the store "
            "(Parquet; query it with DuckDB or 'kinetoscope report STORE'). A broken file becomes a failed row; "
            "the others complete. Local worker processes by default; --scheduler uses an existing cluster."
        ),
    )
    b.add_argument("roots", nargs="+", metavar="ROOT", help="directories or trace files")
    b.add_argument("--store", required=True, help="results directory (created if missing)")
    b.add_argument("--scheduler", help="address of a running Dask scheduler, e.g. tcp://10.0.0.5:8786")
    b.add_argument("--workers", type=int, help="local worker processes (default: one per core)")
    b.add_argument("--resume", action="store_true", help="skip files already in the store (same content and version)")
    b.add_argument("--quiet", action="store_true", help="no per-file progress lines")
    b.add_argument("--max-size", default="8G", help="refuse traces larger than this once gunzipped (default 8G)")
    b.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    b.set_defaults(func=run_batch_command)

    r = sub.add_parser("report", help="summarise a batch store", description="Print what a batch store holds: "
                       "jobs, files ok/failed, the most frequent findings, the worst jobs and the failed files.")
    r.add_argument("store", metavar="STORE")
    r.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    r.set_defaults(func=report_command)


def run_batch_command(args: argparse.Namespace) -> int:
    require("dask", "kinetoscope batch", "cluster")
    require("pyarrow", "kinetoscope batch", "cluster")
    from kinetoscope.analyze.ingest.limits import LoadLimits, parse_size
    from kinetoscope.batch.discover import discover
    from kinetoscope.batch.run import print_progress_factory, run_batch

    if args.workers is not None and args.workers < 1:
        raise ConfigError("--workers must be >= 1")
    total = sum(len(j.files) for j in discover(args.roots))
    progress = None if args.quiet else print_progress_factory(total)
    from kinetoscope.cli.settings import from_environment

    limits = LoadLimits(max_decompressed_bytes=parse_size(args.max_size), decoder=from_environment().decoder)
    summary = run_batch(args.roots, args.store, scheduler=args.scheduler, workers=args.workers, resume=args.resume,
                        limits=limits, on_result=progress)
    for line in summary.lines():
        print(line)
    return 0


def report_command(args: argparse.Namespace) -> int:
    require("pyarrow", "kinetoscope report", "cluster")
    require("duckdb", "kinetoscope report", "cluster")
    from kinetoscope.batch.report import store_report

    sys.stdout.write(store_report(args.store))
    return 0
