"""``kinetoscope diff``: two runs compared, and a CI gate on the time per step."""

from __future__ import annotations

import argparse

from kinetoscope.cli.output import EXIT_GATE, EXIT_OK, error, write
from kinetoscope.cli.process import give_back_free_memory, import_pandas_without_pyarrow
from kinetoscope.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
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
    diff.set_defaults(func=run, quick_exit=True)



def _parse_fraction(text: str) -> float:

    try:
        value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise ConfigError(f"not a fraction: {text!r} (examples: 5%, 0.05)") from None
    if value < 0:
        raise ConfigError("--max-regression must be >= 0")
    return value


def run(args: argparse.Namespace) -> int:
    import json

    if args.own_process:
        import_pandas_without_pyarrow()
    from kinetoscope.analyze.report.compare import diff_runs
    from kinetoscope.analyze.report.job import analyse_job, job_at
    from kinetoscope.render.diff import gate_line, render_diff
    from kinetoscope.render.json import _clean

    limit = _parse_fraction(args.max_regression) if args.max_regression else None
    after_parse = give_back_free_memory if args.own_process else None
    from kinetoscope.analyze.ingest.limits import LoadLimits
    from kinetoscope.cli.settings import from_environment

    settings = from_environment()
    limits = LoadLimits(decoder=settings.decoder)
    before = analyse_job(job_at(args.before), limits=limits, after_parse=after_parse, max_threads=settings.threads)
    after = analyse_job(job_at(args.after), limits=limits, after_parse=after_parse, max_threads=settings.threads)
    assert before.trace and before.report and after.trace and after.report  # not tolerant: an unreadable job raised
    diff = diff_runs(before.trace, after.trace, before.report, after.report, before_label=args.before,
                     after_label=args.after, max_regression=limit)
    if args.format == "json":
        write(json.dumps(_clean(diff.to_dict())) + "\n")
    else:
        write(render_diff(diff))
    if diff.gate is not None and diff.gate.regressed:
        error(gate_line(diff.gate, diff.step_change))
        return EXIT_GATE
    return EXIT_OK


