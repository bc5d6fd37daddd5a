"""The ``kinetoscope`` command. Errors become one line on stderr and an exit code here, and only here."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, Callable, Sequence

from kinetoscope import __version__
from kinetoscope.deps import import_pandas_without_pyarrow, require
from kinetoscope.errors import ConfigError, KinetoscopeError, OutputError

# The analyses do no linear algebra worth a BLAS thread pool, and OpenBLAS's idle threads spin on
# the cores the scanner uses (~5% of a 2-core run); must be set before numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_GATE = 0, 1, 2, 3
SEVERITY_LEVEL = {"info": 2, "warning": 1, "critical": 0}


def _cmd_analyze(args: argparse.Namespace) -> int:
    from kinetoscope.analyze.ingest.jobs import find_jobs
    from kinetoscope.analyze.ingest.limits import LoadLimits, parse_size
    from kinetoscope.analyze.ingest.scan import Ahead

    limits = LoadLimits(max_decompressed_bytes=parse_size(args.max_size), max_events=args.max_events,
                        max_depth=args.max_depth, max_fallback_bytes=parse_size(args.max_fallback))
    cache = None
    if args.cache or os.environ.get("KINETOSCOPE_CACHE_DIR"):
        from kinetoscope.analyze.ingest.cache import default_dir

        cache = default_dir()
    status = EXIT_OK
    jobs = []
    for path in args.paths:
        try:
            jobs.extend(find_jobs(path))
        except KinetoscopeError as exc:
            _error(str(exc))
            status = max(status, exc.exit_code)
    # parsing ranks in processes hands their tables over as Arrow: only a job of several files needs it
    in_processes = args.processes > 1 and any(len(job.files) > 1 for job in jobs)
    if cache is not None or in_processes:
        require("pyarrow", "--cache and --processes" if in_processes and cache else
                "--processes" if in_processes else "--cache (or KINETOSCOPE_CACHE_DIR)", "app")
    ahead = None
    if jobs and cache is None and not (args.processes > 1 and len(jobs[0].files) > 1):
        ahead = Ahead(jobs[0].files[0], limits)  # read while the analyses below are imported (~0.3 s)
    if cache is None and not in_processes and args.own_process:
        import_pandas_without_pyarrow()  # no tables handed over as Arrow here: pandas' plain columns, 0.15 s sooner
    from kinetoscope.analyze.ingest.loader import load_job
    from kinetoscope.analyze.report.builder import build_report
    from kinetoscope.render.json import report_to_json
    from kinetoscope.render.text import render_text

    for i, job in enumerate(jobs):
        path = job.name
        try:
            report = build_report(load_job(job, limits, cache, processes=args.processes,
                                           ahead=ahead if i == 0 else None), keep_views=False)
        except KinetoscopeError as exc:
            _error(str(exc))
            status = max(status, exc.exit_code)
            continue
        except Exception as exc:  # an internal bug on one input must not lose the others
            _internal(exc, args.debug, context=str(path))
            status = EXIT_INTERNAL if status == EXIT_OK else status
            continue
        if args.format == "json":
            _write(report_to_json(report, indent=args.indent) + "\n")
        else:
            if i:
                _write("\n")
            _write(render_text(report))
        if args.fail_on and any(SEVERITY_LEVEL[f.severity] <= SEVERITY_LEVEL[args.fail_on] for f in report.findings):
            worst = report.findings[0]
            _error(f"{path}: {worst.severity} finding {worst.id} (--fail-on {args.fail_on})")
            status = max(status, EXIT_GATE) if status != EXIT_INTERNAL else status
        for failure in report.failures:
            _error(f"{path}: analyzer {failure.analyzer} failed on rank {failure.rank}: {failure.error}")
            if args.debug:
                sys.stderr.write(failure.detail)
            status = EXIT_INTERNAL if status == EXIT_OK else status
    return status


def _write(text: str) -> None:
    """Write to standard output; a closed or full output is said plainly (exit 2), not as an internal error."""
    if sys.stdout is None:
        raise OutputError("cannot write the output (standard output is closed)")
    try:
        sys.stdout.write(text)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _unwritable(exc) from None


def _unwritable(exc: OSError) -> OutputError:
    return OutputError(f"cannot write the output ({exc.strerror or exc})")


def _parse_fraction(text: str) -> float:
    from kinetoscope.errors import ConfigError

    try:
        value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise ConfigError(f"not a fraction: {text!r} (examples: 5%, 0.05)") from None
    if value < 0:
        raise ConfigError("--max-regression must be >= 0")
    return value


def _cmd_diff(args: argparse.Namespace) -> int:
    import json

    if args.own_process:
        import_pandas_without_pyarrow()
    from kinetoscope.analyze.report.compare import diff_runs
    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report
    from kinetoscope.render.diff import gate_line, render_diff
    from kinetoscope.render.json import _clean

    limit = _parse_fraction(args.max_regression) if args.max_regression else None
    before, after = load_trace(args.before), load_trace(args.after)
    diff = diff_runs(before, after, build_report(before), build_report(after), before_label=args.before,
                     after_label=args.after, max_regression=limit)
    if args.format == "json":
        _write(json.dumps(_clean(diff.to_dict())) + "\n")
    else:
        _write(render_diff(diff))
    if diff.gate is not None and diff.gate.regressed:
        _error(gate_line(diff.gate, diff.step_change))
        return EXIT_GATE
    return EXIT_OK


def _cmd_app(args: argparse.Namespace) -> int:
    from kinetoscope.app.launch import launch

    return launch(args.paths, port=args.port, headless=args.headless)


def _error(message: str) -> None:
    sys.stderr.write(f"kinetoscope: error: {message}\n")


def _internal(exc: BaseException, debug: bool, context: str = "") -> None:
    where = f"{context}: " if context else ""
    _error(f"{where}internal error ({type(exc).__name__}: {exc}); rerun with --debug and report it")
    if debug:
        traceback.print_exception(exc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinetoscope",
        description="Find what makes PyTorch training steps slow, from Kineto (torch.profiler) traces.",
    )
    parser.add_argument("--version", action="version", version=f"kinetoscope {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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
    analyze.add_argument("--max-events", type=int, default=200_000_000, help="refuse traces with more events (default 200M)")
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
    analyze.set_defaults(func=_cmd_analyze, quick_exit=True)

    diff = sub.add_parser(
        "diff",
        help="compare two traces (or jobs): what got faster or slower, findings that appeared or disappeared",
        description=("Compare BEFORE and AFTER: the time per step over every step each run timed (the mean, with a "
                     "95% interval that DataLoader bursts and periodic validation cannot fool), every analysis' "
                     "headline numbers, the kernels and ops whose time per step changed most, and the findings that "
                     "appeared, disappeared or changed cost. With --max-regression, exit 3 when the time per step "
                     "grew by more than that with 95% confidence (a CI gate)."),
    )
    diff.add_argument("before", metavar="BEFORE")
    diff.add_argument("after", metavar="AFTER")
    diff.add_argument("--max-regression", help="allowed growth of the time per step, e.g. 5%% or 0.05")
    diff.add_argument("--format", choices=("text", "json"), default="text")
    diff.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    diff.set_defaults(func=_cmd_diff, quick_exit=True)

    app = sub.add_parser(
        "app",
        help="open the Streamlit app (on the bundled sample traces unless PATHs are given)",
        description="Start the Kinetoscope web app. With no PATH it opens the bundled sample traces.",
    )
    app.add_argument("paths", nargs="*", metavar="PATH", help="traces or rank directories to open")
    app.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    app.add_argument("--headless", action="store_true", help="do not open a browser")
    app.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    app.set_defaults(func=_cmd_app)

    redact = sub.add_parser(
        "redact",
        help="write a copy of a trace, or of a capture directory, with its secrets redacted (for a public bug report)",
        description=("Write TRACE to OUT with every secret-looking value replaced by [redacted]: tokens (Hugging Face, "
                     "GitHub, OpenAI-style, AWS, Slack, JWTs, ...), credentials in URLs, Azure account keys, and values "
                     "of keys or flags that name a secret (HF_TOKEN=..., --password ...), in the metadata and in every "
                     "event's arguments. Everything else is kept byte for byte, so OUT analyses like TRACE. OUT ending "
                     "in .gz is gzipped. TRACE may be a capture directory: then OUT is a new directory holding every "
                     "trace and sidecar (manifest, steps.json) of it, each redacted, under the same names (hidden "
                     "temporaries and other files are left out, and counted); nothing is written unless all of them "
                     "read as traces or JSON."),
    )
    redact.add_argument("trace", metavar="TRACE")
    redact.add_argument("-o", "--output", required=True, metavar="OUT")
    redact.add_argument("--max-size", default="8G", help="refuse traces larger than this once gunzipped (default 8G)")
    redact.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    redact.set_defaults(func=_cmd_redact)

    whatif = sub.add_parser(
        "whatif",
        help="predict the step time after fixing some findings (one or several at once)",
        description=("Replay each rank's steps with the fixes of the findings named by --fix applied together, and "
                     "print the predicted mean step time beside the measured one (gains of several fixes do not "
                     "simply add: a faster host may then wait for the GPU). Without --fix, list the findings and "
                     "what each is worth alone. Parameters of a fix: --set loader_stall.num_workers=4, "
                     "--set sync_in_loop.every=50, --set h2d_pageable.pinned_gbps=24."),
    )
    whatif.add_argument("path", metavar="PATH", help="trace file or directory of rank traces")
    whatif.add_argument("--fix", default="", metavar="ID[,ID...]", help="finding ids to fix together")
    whatif.add_argument("--set", action="append", default=[], metavar="ID.KEY=VALUE", help="a parameter of a fix")
    whatif.add_argument("--rank", type=int, default=None, help="only this rank")
    whatif.add_argument("--format", choices=("text", "json"), default="text")
    whatif.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    whatif.set_defaults(func=_cmd_whatif, quick_exit=True)

    _register_extra_commands(sub)
    return parser


def _fix_params(pairs: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in pairs:
        key, eq, value = item.partition("=")
        fid, dot, name = key.partition(".")
        if not (eq and dot and fid and name):
            raise ConfigError(f"--set {item!r}: expected ID.KEY=VALUE, e.g. loader_stall.num_workers=4")
        try:
            parsed: Any = int(value)
        except ValueError:
            try:
                parsed = float(value)
            except ValueError:
                raise ConfigError(f"--set {item!r}: {value!r} is not a number") from None
        out.setdefault(fid, {})[name] = parsed
    return out


def _cmd_whatif(args: argparse.Namespace) -> int:
    import json

    if args.own_process:
        import_pandas_without_pyarrow()
    from kinetoscope.analyze.whatif import replay as whatif
    from kinetoscope.analyze.model.findings import FINDING_IDS
    from kinetoscope.analyze.ingest.loader import load_trace
    from kinetoscope.analyze.report.builder import build_report
    from kinetoscope.render.json import _clean
    from kinetoscope.render.text import render_whatif

    wanted = list(dict.fromkeys(f for f in (x.strip() for x in args.fix.split(",")) if f))
    unknown = [f for f in wanted if f not in FINDING_IDS]
    if unknown:
        raise ConfigError(f"--fix: unknown finding id(s) {', '.join(unknown)}; known: {', '.join(FINDING_IDS)}")
    params = _fix_params(args.set)
    problems = whatif.check_params(params)
    if problems:
        raise ConfigError("--set " + "; ".join(problems))
    unused = [fid for fid in params if wanted and fid not in wanted
              and not (fid in ("loader_stall", "sync_in_loop", "sync_point") and "gpu_idle" in wanted)]
    if unused:
        sys.stderr.write(f"kinetoscope: note: --set for {', '.join(unused)}, not among --fix: not used\n")
    trace = load_trace(args.path)
    report = build_report(trace)
    ranks = [r for r in trace.ranks if args.rank is None or r.rank == args.rank]
    if not ranks:
        raise ConfigError(f"--rank {args.rank}: the trace has ranks {', '.join(str(r.rank) for r in trace.ranks)}")
    out = []
    for r in ranks:
        entry = next(e for e in report.ranks if e["rank"] == r.rank)
        mine = [f for f in report.findings if f.rank == r.rank]
        chosen = [f for f in mine if f.id in wanted]
        alone = [{"id": f.id, "severity": f.severity, "title": f.title,
                  "estimate": whatif.estimate(r, f, whatif.params_for(f.id, params)) if params else f.estimate}
                 for f in (chosen or mine)]
        together = whatif.combined(r, chosen, params) if chosen else None
        out.append({"rank": r.rank, "replay": entry.get("replay"), "fixes": alone, "together": together,
                    "applied": [f.id for f in chosen],
                    "not_found": [f for f in wanted if f not in {c.id for c in chosen}]})
    if args.format == "json":
        _write(json.dumps(_clean({"source": args.path, "fix": wanted, "ranks": out})) + "\n")
    else:
        _write(render_whatif(args.path, wanted, out))
    return EXIT_OK


def _cmd_redact(args: argparse.Namespace) -> int:
    import gzip
    from pathlib import Path

    from kinetoscope.analyze.ingest.limits import LoadLimits, parse_size
    from kinetoscope.analyze.ingest.loader import load_trace, read_bytes
    from kinetoscope.analyze.ingest.redact import redact_json_bytes
    from kinetoscope.errors import TraceSourceError
    from kinetoscope.fsutil import atomic_write

    source, target = Path(args.trace), Path(args.output)
    limits = LoadLimits(max_decompressed_bytes=parse_size(args.max_size))
    if source.is_dir():
        return _redact_directory(source, target, limits)
    if not source.is_file():
        raise TraceSourceError(f"{source}: no such file or directory")
    if target.resolve() == source.resolve():
        raise ConfigError("OUT must differ from TRACE (the original is kept)")
    load_trace(source, limits)  # what is not a trace is refused here, as by analyze (and nothing is written)
    data = read_bytes(source, limits)
    cleaned, changed = redact_json_bytes(data)
    del data
    atomic_write(target, gzip.compress(cleaned, compresslevel=6) if target.name.endswith(".gz") else cleaned)
    print(f"{target}: {changed} string{'s' if changed != 1 else ''} redacted", file=sys.stderr)
    return EXIT_OK


def _redact_directory(source: Any, target: Any, limits: Any) -> int:
    """``kinetoscope redact DIR -o OUT``: every trace and sidecar under DIR, redacted, into the new directory OUT
    (same relative names). Everything is read and checked first (traces as ``analyze`` reads them, sidecars as
    JSON); OUT is written as a temporary directory renamed into place, so a failure leaves nothing behind."""
    import gzip
    import shutil
    import tempfile
    from pathlib import Path

    import msgspec

    from kinetoscope.analyze.ingest.jobs import SIDECAR_SUFFIXES, TRACE_SUFFIXES
    from kinetoscope.analyze.ingest.loader import load_trace, read_bytes
    from kinetoscope.analyze.ingest.redact import redact_json_bytes
    from kinetoscope.errors import TraceFormatError

    src, out = source.resolve(), target.resolve()
    if out == src or src in out.parents:
        raise ConfigError("OUT must be a directory outside DIR (the originals are kept)")
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise ConfigError(f"{target} exists: name a new (or empty) directory for the redacted copy")
    files, hidden, other = [], 0, []
    for p in sorted(source.rglob("*")):
        rel = p.relative_to(source)
        if any(part.startswith(".") for part in rel.parts):
            hidden += p.is_file()
        elif p.is_file():
            (files if p.name.lower().endswith(TRACE_SUFFIXES) else other).append(p)
    if not files:
        raise TraceSourceError(f"{source}: directory holds no trace or sidecar (.json, .json.gz) files")
    sidecar = [p.name.lower().endswith(SIDECAR_SUFFIXES) for p in files]
    for p, is_sidecar in zip(files, sidecar):  # everything is read before anything is written
        if is_sidecar:
            try:
                msgspec.json.decode(read_bytes(p, limits))
            except msgspec.DecodeError as exc:
                raise TraceFormatError(str(p), f"a sidecar that is not JSON ({exc})") from None
        else:
            load_trace(p, limits)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    changed = 0
    try:
        for p in files:
            cleaned, n = redact_json_bytes(read_bytes(p, limits))
            changed += n
            dest = tmp / p.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(gzip.compress(cleaned, compresslevel=6) if p.name.endswith(".gz") else cleaned)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    traces = len(files) - sum(sidecar)
    left = [f"{hidden} hidden temporar{'ies' if hidden != 1 else 'y'}" if hidden else "",
            f"{len(other)} other file(s) ({', '.join(str(p.relative_to(source)) for p in other[:3])}"
            f"{', ...' if len(other) > 3 else ''})" if other else ""]
    left_out = "; left out: " + ", ".join(x for x in left if x) if any(left) else ""
    print(f"{target}: {traces} trace(s) and {sum(sidecar)} sidecar(s), {changed} string{'s' if changed != 1 else ''} "
          f"redacted{left_out}", file=sys.stderr)
    return EXIT_OK


def _register_extra_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Commands contributed by subpackages; their heavy imports (torch, Dask) happen only when they run."""
    from kinetoscope.batch.cli import add_batch_commands
    from kinetoscope.capture.cli import add_capture_command

    add_capture_command(sub)
    add_batch_commands(sub)


def main(argv: Sequence[str] | None = None) -> int:
    return _main(argv)[0]


def run() -> None:
    """The ``kinetoscope`` command's process. A command that only reads and prints (analyze, diff, whatif) ends the
    process as soon as its output is flushed: tearing the interpreter down (pandas' modules, the trace's columns)
    took ~0.12 s of a 0.8 s analysis. Commands that start servers, clusters or child processes exit normally."""
    from kinetoscope.heap import one_malloc_arena

    one_malloc_arena()  # this process is ours, and no thread has started yet
    code, quick = _main(None, own_process=True)
    if not quick:
        sys.exit(code)
    os._exit(_flushed(code))


def _flushed(code: int) -> int:
    """``code`` once stdout and stderr are flushed; a failed write (a full disk) is an error, said on stderr if it
    can be; a reader that went away (a closed pipe) is not."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with the descriptor closed
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            pass
        except OSError as exc:
            try:  # not through sys.stderr: it may be the stream that failed
                os.write(2, f"kinetoscope: error: {_unwritable(exc)}\n".encode())
            except OSError:
                pass
            code = code if code not in (EXIT_OK, EXIT_GATE) else OutputError.exit_code
    return code


def _main(argv: Sequence[str] | None, own_process: bool = False) -> tuple[int, bool]:
    """(exit status, whether the process may end without the interpreter's teardown). ``own_process``: the command's
    own process (``run``), whose imports it may choose; never so for ``main``, called from someone else's."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.own_process = own_process
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE, False
    return _call(func, args), getattr(args, "quick_exit", False)


def _call(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return func(args)
    except KinetoscopeError as exc:
        _error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        _internal(exc, args.debug)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    run()
