"""The registry of analyzers: the CLI, the report, the app and batch all iterate it.

The one module that imports the analyzers (``kinetoscope.analyze.analyzers``, the leaves of the pipeline): each
module marks its function with ``model.analysis.register``; the order of ``MODULES`` is the report's order. Adding
an analysis is one module and one entry here.
"""

from __future__ import annotations

from types import ModuleType

from kinetoscope.analyze.analyzers import (
    allocator,
    anatomy,
    comm,
    compiled,
    copies,
    coverage,
    efficiency,
    gpu,
    hang,
    host,
    hygiene,
    loader,
    memory,
    outliers,
    steps,
    straggler,
    telemetry,
)
from kinetoscope.analyze.model.analysis import ANALYZER_ATTR, AnalysisResult, Analyzer, register

__all__ = ["AnalysisResult", "Analyzer", "MODULES", "analyzers", "register"]

#: the analyzer modules, in report order (the keys of a rank's report entry follow it: comm before host, as when
#: host imported comm and so registered it first)
MODULES: tuple[ModuleType, ...] = (steps, anatomy, loader, gpu, efficiency, allocator, copies, memory, comm, host,
                                   telemetry, hygiene, outliers, coverage, straggler, hang, compiled)


def _collect() -> tuple[Analyzer, ...]:
    found: dict[str, Analyzer] = {}
    for module in MODULES:
        for value in vars(module).values():
            spec = getattr(value, ANALYZER_ATTR, None)
            if isinstance(spec, Analyzer) and getattr(value, "__module__", None) == module.__name__:
                if spec.key in found:
                    raise ValueError(f"analyzer {spec.key!r} registered twice")
                found[spec.key] = spec
    return tuple(found.values())


_ANALYZERS = _collect()


def analyzers() -> tuple[Analyzer, ...]:
    return _ANALYZERS


def analyzer(key: str) -> Analyzer:
    """The analyzer ``key``; a ``KeyError`` for an unknown one."""
    for a in _ANALYZERS:
        if a.key == key:
            return a
    raise KeyError(key)
