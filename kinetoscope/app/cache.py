"""Analyses cached per job content (``st.cache_resource``: kept in memory, never pickled)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from kinetoscope.analyze.loader import Job
from kinetoscope.app import data
from kinetoscope.errors import KinetoscopeError


@st.cache_resource(show_spinner=False, max_entries=16)
def cached_analysis(key: str, label: str, files: tuple[str, ...]) -> data.Analysis:
    return data.analyse(label, Job(label, tuple(Path(f) for f in files)))


def analyse(key: str, label: str, job: Job) -> data.Analysis | None:
    """The job's analysis, or None after showing one clear sentence on the page."""
    try:
        with st.spinner(f"Parsing and analysing {label}…"):
            return cached_analysis(key, label, tuple(str(f) for f in job.files))
    except KinetoscopeError as exc:
        st.error(f"Could not analyse {label}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a bug must still read as one sentence
        st.error(f"Internal error while analysing {label} ({type(exc).__name__}: {exc}). Please report it.")
    return None
