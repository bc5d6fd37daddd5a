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
    w = b.add_argument_group("watch", "keep running: analyse jobs as they land (kinetoscope/batch/watch.py)")
    w.add_argument("--watch", action="store_true",
                   help="keep listing the ROOTs and analyse each job once it is complete (its capture manifests are "
                        "there, or its files stopped changing); what the store holds is kept (--resume); Ctrl-C or "
                        "SIGTERM stops once the files in flight are written, a second one at once")
    w.add_argument("--settle", type=float, default=60.0, metavar="S",
                   help="a job whose files have not changed for S seconds is complete (default 60)")
    w.add_argument("--poll", type=float, default=5.0, metavar="S",
                   help="list every S seconds, doubling while nothing changes up to --max-poll (default 5)")
    w.add_argument("--max-poll", type=float, default=300.0, metavar="S", help="longest wait between listings (300)")
    w.add_argument("--max-attempts", type=int, default=3,
                   help="tries of a file that cannot be read before it is given up with a failed row (default 3)")
    w.add_argument("--retry-delay", type=float, default=30.0, metavar="S",
                   help="wait before the first retry, doubled for each further one (default 30)")
    w.add_argument("--max-in-flight", type=int, default=None,
                   help="files being analysed at once (default: twice the workers, at least 2)")
    w.add_argument("--compact-every", type=int, default=256, metavar="N",
                   help="compact the store's small files into parts once N files have been analysed since the last "
                        "compaction; new files wait until those in flight are written, so at most N stay un-compacted "
                        "(default 256)")
    w.add_argument("--compact-quiet", type=float, default=120.0, metavar="S",
                   help="compact once nothing has been written for S seconds; also the wait before a compaction that "
                        "failed is tried again (default 120). A failed compaction is reported, never fatal; a clean "
                        "stop compacts once more")
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
    if args.watch:
        return watch_command(args)
    total = sum(len(j.files) for j in discover(args.roots))
    progress = None if args.quiet else print_progress_factory(total)
    from kinetoscope.cli.settings import from_environment

    limits = LoadLimits(max_decompressed_bytes=parse_size(args.max_size), decoder=from_environment().decoder)
    summary = run_batch(args.roots, args.store, scheduler=args.scheduler, workers=args.workers, resume=args.resume,
                        limits=limits, on_result=progress)
    for line in summary.lines():
        print(line)
    return 0


def watch_command(args: argparse.Namespace) -> int:
    """``batch --watch``: the command's own process, so the signal handlers are set here (and put back after)."""
    import os
    import signal
    import threading

    from kinetoscope.analyze.ingest.limits import LoadLimits, parse_size
    from kinetoscope.batch.run import _client
    from kinetoscope.batch.store import open_store
    from kinetoscope.batch.watch import Watcher, WatchPolicy

    for name in ("settle", "poll", "max_poll", "retry_delay", "compact_quiet"):
        if not getattr(args, name) >= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0 seconds")
    if args.max_attempts < 1 or args.compact_every < 1 or (args.max_in_flight is not None and args.max_in_flight < 1):
        raise ConfigError("--max-attempts, --max-in-flight and --compact-every must be >= 1")
    workers = args.workers or os.cpu_count() or 1
    policy = WatchPolicy(settle_s=args.settle, poll_s=max(args.poll, 0.1), max_poll_s=max(args.max_poll, args.poll),
                         max_attempts=args.max_attempts, retry_s=args.retry_delay,
                         max_in_flight=args.max_in_flight or max(2, 2 * workers),
                         compact_every=args.compact_every, compact_quiet_s=args.compact_quiet)
    limits = LoadLimits(max_decompressed_bytes=parse_size(args.max_size))
    root = open_store(args.store, create=True)
    stop, abandon = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set():
            abandon.set()
            return
        stop.set()
        sys.stderr.write("kinetoscope: stopping once the files in flight are written (again to stop at once)\n")

    def on_event(kind: str, text: str) -> None:
        if not args.quiet:
            sys.stderr.write(f"kinetoscope: {kind}: {text}\n")
            sys.stderr.flush()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    client, cluster = _client(args.scheduler, args.workers)
    try:
        summary = Watcher(args.roots, root, lambda fn, *a: client.submit(fn, *a, pure=False), policy=policy,
                          limits=limits, on_event=on_event,
                          workers_alive=lambda: bool(client.nthreads())).run(stop, abandon)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    for line in summary.lines():
        print(line)
    return 0


def report_command(args: argparse.Namespace) -> int:
    require("pyarrow", "kinetoscope report", "cluster")
    require("duckdb", "kinetoscope report", "cluster")
    from kinetoscope.batch.report import store_report

    sys.stdout.write(store_report(args.store))
    return 0
