"""What an analyzer is and what it gives: the ``Analyzer`` record and its ``AnalysisResult``.

An analyzer is a pure function ``(trace, config) -> AnalysisResult``. Rank analyzers take one ``RankTrace``; job
analyzers take the whole ``Trace`` and see every rank, reducing over what their ``per_rank`` view takes of each (the
report computes it as each rank's analyses end, so a rank's other views can go). ``register`` only marks the
function with its record; ``kinetoscope.analyze.registry`` lists the analyzer modules and collects the records, so
no analyzer imports the registry (and the registry is the only module that imports the analyzers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

from kinetoscope.analyze.model.findings import Finding
from kinetoscope.analyze.model.record import Record


@dataclass(frozen=True)
class AnalysisResult:
    #: the analyzer's registry key
    key: str
    #: what it measured: a typed record (``model.results``) whose fields are the keys it adds to the rank's report
    #: entry (a rank analyzer: ``LoaderResult(loader=...)``) or the job's object under its key (a job analyzer;
    #: ``None`` where it does not apply). A plain dict (the fragment itself, JSON-ready) is still taken, for an
    #: analyzer not yet typed; ``fragment()`` gives either as JSON.
    metrics: Record | dict[str, Any] | None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()

    def fragment(self) -> dict[str, Any]:
        """The metrics as JSON-ready objects: the rank entry's keys (or the job object); empty for none."""
        if self.metrics is None:
            return {}
        return self.metrics.to_dict() if isinstance(self.metrics, Record) else self.metrics


@dataclass(frozen=True)
class Analyzer:
    key: str
    title: str
    scope: Literal["rank", "job"]
    fn: Callable[..., AnalysisResult]
    doc: str
    #: a job analyzer's map step: what it needs of one rank (a ``trace_view``), computed by the report as each
    #: rank's analyses end, while that rank's views are at hand; the analyzer then reduces over ranks
    per_rank: Callable[..., Any] | None = None
    #: a job analyzer's reduce over the ``per_rank`` views alone (no trace): what batch runs once its workers have
    #: stored each rank's view, ``(views, config) -> (metrics, table, finding or None)``
    reduce: Callable[..., Any] | None = None


#: the attribute ``register`` sets on an analyzer function
ANALYZER_ATTR = "kinetoscope_analyzer"


def register(key: str, title: str, scope: Literal["rank", "job"] = "rank", *,
             per_rank: Callable[..., Any] | None = None,
             reduce: Callable[..., Any] | None = None,
             ) -> Callable[[Callable[..., AnalysisResult]], Callable[..., AnalysisResult]]:
    """Mark ``fn`` as the analyzer ``key``; the registry collects it from its module."""
    if per_rank is not None and (scope != "job" or not hasattr(per_rank, "view_key")):
        raise ValueError(f"analyzer {key!r}: per_rank is a job analyzer's trace_view")
    if reduce is not None and per_rank is None:
        raise ValueError(f"analyzer {key!r}: reduce goes with a per_rank view")

    def wrap(fn: Callable[..., AnalysisResult]) -> Callable[..., AnalysisResult]:
        setattr(fn, ANALYZER_ATTR, Analyzer(key=key, title=title, scope=scope, fn=fn, doc=(fn.__doc__ or "").strip(),
                                            per_rank=per_rank, reduce=reduce))
        return fn

    return wrap
