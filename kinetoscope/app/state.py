"""Session state shared by the pages: the current analysis, the chosen rank, formatting helpers."""

from __future__ import annotations

from typing import Any, TypeVar

from kinetoscope.analyze.model.analysis import AnalysisResult
from kinetoscope.analyze.model.record import Record
from kinetoscope.app.data import Analysis
from kinetoscope.app.ui import st
from kinetoscope.render.format import mib, ms, pct  # noqa: F401  (re-exported for the screens)

R = TypeVar("R", bound=Record)

CURRENT = "analysis"
#: the job (its files) behind the current analysis, as this session has it
JOB = "job"
COMPARE = "compare_analysis"
#: an upload's files as separate runs (data.Choice each), when the user said so; Compare offers them
UPLOAD_RUNS = "upload_runs"
#: this run's st.Page objects by url path (st.switch_page needs one)
PAGE_OBJECTS = "page_objects"


def current() -> Analysis:
    """The analysis the sidebar selected; stops the page with a hint when there is none."""
    analysis = st.session_state.get(CURRENT)
    if analysis is None:
        st.title("Kinetoscope")
        st.info("Choose a bundled trace or upload one in the sidebar.")
        st.stop()
    return analysis


def rank_entry(analysis: Analysis) -> dict[str, Any]:
    ranks = [r["rank"] for r in analysis.report.ranks]
    chosen = st.session_state.get("rank", analysis.report.worst_rank)
    return analysis.report.ranks[ranks.index(chosen)] if chosen in ranks else analysis.report.ranks[0]


def rank_result(analysis: Analysis, entry: dict[str, Any], cls: type[R]) -> R | None:
    """The typed result of that record type for the entry's rank (``RankReport.result``); None where none."""
    typed = next((rr for rr in analysis.report.rank_reports if rr.rank == entry["rank"]), None)
    return typed.result(cls) if typed is not None else None


def page(title: str) -> tuple[Analysis, dict[str, Any], dict[str, AnalysisResult]]:
    """The preamble of a per-rank page: the analysis, the chosen rank's entry and results, and a header."""
    analysis = current()
    entry = rank_entry(analysis)
    st.title(f"{title} · rank {entry['rank']}")
    return analysis, entry, analysis.report.results.get(entry["rank"], {})


def quote(path: str) -> str:
    import shlex

    return shlex.quote(path)


def window_start_ns(analysis: Analysis, entry: dict[str, Any]) -> int:
    """The rank's window start on the trace clock, exact (tables show times from it)."""
    from kinetoscope.analyze.model.timeline import window

    return window(analysis.trace.rank(entry["rank"])).start_ns
