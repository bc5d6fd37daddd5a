"""The registry of analyzers: the CLI, the report, the app and batch all iterate it.

An analyzer is a pure function ``(trace, config) -> AnalysisResult``. Rank
analyzers take one ``RankTrace``; job analyzers take the whole ``Trace`` and
see every rank, reducing over what their ``per_rank`` view takes of each (the
report computes it as each rank's analyses end, so a rank's other views can go).
Adding an analysis is one module and one ``register`` call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import pandas as pd

from kinetoscope.analyze.model.findings import Finding


@dataclass(frozen=True)
class AnalysisResult:
    #: the analyzer's registry key
    key: str
    #: this result's fragment of the rank's report entry, JSON-ready
    #: (``{"loader": {...}}``); a value is ``None`` where it does not apply
    metrics: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()


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


_REGISTRY: dict[str, Analyzer] = {}


def register(key: str, title: str, scope: Literal["rank", "job"] = "rank", *,
             per_rank: Callable[..., Any] | None = None) -> Callable[[Callable[..., AnalysisResult]], Callable[..., AnalysisResult]]:
    if per_rank is not None and (scope != "job" or not hasattr(per_rank, "view_key")):
        raise ValueError(f"analyzer {key!r}: per_rank is a job analyzer's trace_view")

    def wrap(fn: Callable[..., AnalysisResult]) -> Callable[..., AnalysisResult]:
        if key in _REGISTRY:
            raise ValueError(f"analyzer {key!r} registered twice")
        _REGISTRY[key] = Analyzer(key=key, title=title, scope=scope, fn=fn, doc=(fn.__doc__ or "").strip(),
                                  per_rank=per_rank)
        return fn

    return wrap


def analyzers() -> tuple[Analyzer, ...]:
    from kinetoscope.analyze import analyzers as _  # noqa: F401  (registers the built-ins)

    return tuple(_REGISTRY.values())

