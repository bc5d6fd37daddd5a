"""Session state shared by the pages: the current analysis, the chosen rank, formatting helpers."""

from __future__ import annotations

from typing import Any

import streamlit as st

from kinetoscope.app.data import Analysis

CURRENT = "analysis"
COMPARE = "compare_analysis"


def current() -> Analysis:
    """The analysis the sidebar selected; stops the page with a hint when there is none."""
    analysis = st.session_state.get(CURRENT)
    if analysis is None:
        st.info("Choose a bundled trace or upload one in the sidebar.")
        st.stop()
    return analysis


def rank_entry(analysis: Analysis) -> dict[str, Any]:
    ranks = [r["rank"] for r in analysis.report.ranks]
    chosen = st.session_state.get("rank", ranks[0])
    return analysis.report.ranks[ranks.index(chosen)] if chosen in ranks else analysis.report.ranks[0]


def ms(us: Any) -> str:
    return "n/a" if us is None else f"{us / 1000:,.2f} ms"


def pct(x: Any) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def mib(x: Any) -> str:
    return "n/a" if x is None else f"{x / 2**20:,.1f} MiB"
