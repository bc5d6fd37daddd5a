"""Analyses cached per job content, in memory within a byte budget shared by every session (never pickled)."""

from __future__ import annotations

from pathlib import Path

from kinetoscope.app.ui import md, st

from kinetoscope.analyze.loader import Job
from kinetoscope.app import data
from kinetoscope.errors import KinetoscopeError


@st.cache_resource(show_spinner=False)
def shared_cache() -> data.AnalysisCache:
    """One cache per app server (Streamlit keeps this object for every session)."""
    data.sweep_stale_uploads()
    return data.AnalysisCache(data.app_cache_bytes())


@st.cache_resource(show_spinner=False)
def upload_janitor() -> data.UploadJanitor:
    """One janitor per app server: deletes the upload folders of sessions that have ended."""
    from streamlit import runtime

    def is_active(session_id: str) -> bool:
        return not runtime.exists() or runtime.get_instance().is_active_session(session_id)

    return data.UploadJanitor(is_active)


def watch_upload(folder: Path) -> None:
    """Have the server's janitor delete ``folder`` once this browser session has ended."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is not None:
        upload_janitor().watch(ctx.session_id, folder)


def analyse(key: str, label: str, job: Job, upload: Path | None = None) -> data.Analysis | None:
    """The job's analysis, or None after showing one clear sentence on the page."""
    cache = shared_cache()
    hit = cache.get(key)
    if hit is not None:
        return hit
    try:
        with st.spinner(f"Parsing and analysing {label}…"):
            analysis = data.analyse(label, job, upload)
    except KinetoscopeError as exc:
        st.error(f"Could not analyse {label}: {exc}")
        return None
    except Exception as exc:  # noqa: BLE001 - a bug must still read as one sentence
        st.error(f"Internal error while analysing {label} ({type(exc).__name__}: "
                 f"{data.without_folder(str(exc), upload)}). Please report it.")
        return None
    cache.put(key, analysis)
    return analysis


@st.cache_resource(show_spinner=False, max_entries=8)
def _store_choices(store: str, traces_mtime_ns: int) -> list[data.Choice]:
    return data.store_choices(store)


def store_choices(store: str) -> list[data.Choice]:
    """A batch store's jobs, read once per state of the store (its traces folder changes when a row lands): every
    interaction reruns the sidebar, and a store of thousands of files took a read of all of them each time."""
    try:
        stamp = (Path(store) / "traces").stat().st_mtime_ns
    except OSError:
        stamp = -1
    return _store_choices(str(store), stamp)
