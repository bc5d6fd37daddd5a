"""Analyses cached per job content, in memory within a byte budget shared by every session (never pickled)."""

from __future__ import annotations

from pathlib import Path

from kinetoscope.analyze.ingest.loader import Job
from kinetoscope.app import data
from kinetoscope.app.ui import md, st
from kinetoscope.batch.store import store_version
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


def try_analyse(key: str, label: str, job: Job, upload: Path | None = None) -> data.Analysis | str:
    """The job's analysis, or why it could not be made (one sentence, naming no server folder)."""
    cache = shared_cache()
    hit = cache.get(key)
    if hit is not None:
        return hit
    try:
        with st.spinner(md("Parsing and analysing {}…", label)):
            analysis = data.analyse(label, job, upload)
    except KinetoscopeError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a bug must still read as one sentence
        return (f"internal error ({type(exc).__name__}: {data.without_folder(str(exc), upload)}); "
                "please report it")
    cache.put(key, analysis)
    return analysis


def analyse(key: str, label: str, job: Job, upload: Path | None = None) -> data.Analysis | None:
    """The job's analysis, or None after showing one clear sentence on the page."""
    got = try_analyse(key, label, job, upload)
    if isinstance(got, str):
        st.error(md("Could not analyse {}: {}", label, got))
        return None
    return got


@st.cache_resource(show_spinner=False, max_entries=8)
def _store_choices(store: str, version: str) -> list[data.Choice]:
    return data.store_choices(store)


def store_choices(store: str) -> list[data.Choice]:
    """A batch store's jobs, read once per state of the store (its traces folder changes when a row lands): every
    interaction reruns the sidebar, and a store of thousands of files took a read of all of them each time."""
    return _store_choices(str(store), store_version(store))
