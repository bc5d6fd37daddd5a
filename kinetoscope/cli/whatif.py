"""``kinetoscope whatif``: the step time predicted after fixing some findings, one or several at once."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kinetoscope.cli.output import EXIT_OK, write
from kinetoscope.cli.process import give_back_free_memory, import_pandas_without_pyarrow
from kinetoscope.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
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
    whatif.set_defaults(func=run, quick_exit=True)



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


def run(args: argparse.Namespace) -> int:
    import json

    if args.own_process:
        import_pandas_without_pyarrow()
    from kinetoscope.analyze import whatif
    from kinetoscope.analyze.model.findings import FINDING_IDS
    from kinetoscope.analyze.report.job import analyse_job, job_at
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
    # a fix that stands for others (gpu_idle) takes their parameters
    standing_for = {other for w in wanted if w in whatif.FIXES for other in whatif.FIXES[w].stands_for}
    unused = [fid for fid in params if wanted and fid not in wanted and fid not in standing_for]
    if unused:
        sys.stderr.write(f"kinetoscope: note: --set for {', '.join(unused)}, not among --fix: not used\n")
    from kinetoscope.analyze.ingest.limits import LoadLimits
    from kinetoscope.cli.settings import from_environment

    settings = from_environment()
    analysed = analyse_job(job_at(args.path), limits=LoadLimits(decoder=settings.decoder),
                           after_parse=give_back_free_memory if args.own_process else None,
                           max_threads=settings.threads)
    trace, report = analysed.trace, analysed.report
    assert trace is not None and report is not None  # not tolerant: an unreadable job raised
    ranks = [r for r in trace.ranks if args.rank is None or r.rank == args.rank]
    if not ranks:
        raise ConfigError(f"--rank {args.rank}: the trace has ranks {', '.join(str(r.rank) for r in trace.ranks)}")
    out = []
    for r in ranks:
        entry = next(e for e in report.ranks if e["rank"] == r.rank)
        mine = [f for f in report.findings if f.rank == r.rank]
        chosen = [f for f in mine if f.id in wanted]
        alone = []
        graph = whatif.replay_graph(r)
        for f in chosen or mine:
            est = whatif.estimate(r, f, whatif.params_for(f.id, params)) if params else f.estimate
            fix = whatif.FIXES.get(f.id)
            plan = whatif.plan_for(r, graph, f, whatif.params_for(f.id, params)) \
                if graph.steps and est is not None and f.one_off_us is None \
                and (fix is None or fix.no_time_cost is None) else None
            alone.append({"id": f.id, "severity": f.severity, "title": f.title,
                          "estimate": est.to_dict() if est is not None else None,
                          "critical_path": whatif.fix_limits(r, plan.edits) if plan is not None else None})
        both = whatif.combined(r, chosen, params) if chosen else None
        together = both.to_dict() if both is not None else None
        out.append({"rank": r.rank, "replay": entry.get("replay"), "fixes": alone, "together": together,
                    "applied": [f.id for f in chosen],
                    "not_found": [f for f in wanted if f not in {c.id for c in chosen}]})
    if args.format == "json":
        write(json.dumps(_clean({"source": args.path, "fix": wanted, "ranks": out})) + "\n")
    else:
        write(render_whatif(args.path, wanted, out))
    return EXIT_OK


