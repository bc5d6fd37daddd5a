"""The Kinetoscope Streamlit app: pick or upload traces, see what is wrong and why.

Run with ``kinetoscope app [PATH ...]``. Pages only lay out results; every number comes from
``kinetoscope.analyze`` (renderers never compute). Analyses are cached per file content with
``st.cache_resource`` (objects kept in memory, never pickled).
"""

from __future__ import annotations

import os
from pathlib import Path

from kinetoscope.analyze.ingest.loader import Job
from kinetoscope.app import data, state
from kinetoscope.app.cache import analyse, store_choices, try_analyse, watch_upload
from kinetoscope.app.launch import PATHS_ENV, given_paths
from kinetoscope.app.screens import (
    compare,
    copies,
    distributed,
    export,
    fleet,
    hang,
    memory,
    metadata,
    modules,
    operators,
    overview,
    ranks,
    steps,
    streams,
    telemetry,
    timeline,
)
from kinetoscope.app.ui import md, page_style, st
from kinetoscope.batch.store import is_store
from kinetoscope.errors import KinetoscopeError
from kinetoscope.render.format import missing_ranks_text

#: tests (and scripts) may put uploads here instead of going through the browser widget
PENDING_UPLOADS = "pending_uploads"
#: the session's upload folder (a data.UploadDir): deleted on the next upload or when the session ends
UPLOAD_DIR = "upload_dir"
#: the session's uploaded job (all its files), and whether several files are ranks of one job or separate runs
UPLOADED = "uploaded_job"
UPLOAD_MODE = "upload_mode"
RANKS, RUNS = "ranks of one job", "separate runs"
#: the same question for given paths and a store's jobs whose files name no rank
PATHS_MODE = "paths_mode"
#: the page shown first (tests use it: AppTest cannot switch between function pages)
START_PAGE = "start_page"


def sidebar() -> None:
    st.sidebar.markdown(md("**Kinetoscope**"))
    given = given_paths(os.environ.get(PATHS_ENV, ""))
    stores = [p for p in given if is_store(p)]
    try:
        if stores:
            # a platform team's store: its jobs are what the other pages show (opened in place from the Fleet page)
            st.session_state[fleet.STORE_KEY] = stores[0]
            given = [p for p in given if p not in stores]
            choices = store_choices(stores[0]) + (data.path_choices(given) if given else [])
        else:
            choices = data.path_choices(given) if given else data.sample_choices()
    except KinetoscopeError as exc:
        st.sidebar.error(str(exc))
        choices = []
    opened = st.session_state.pop(fleet.OPEN_KEY, None)
    if opened is not None:  # the Fleet page's "open this job": chosen here, before the widgets exist
        st.session_state["source"] = "Store jobs"
        st.session_state["trace"] = opened
    first = "Store jobs" if stores else "Given paths" if given else "Bundled samples"
    source = st.sidebar.radio("Traces", [first, "Upload"], key="source")
    pending = st.session_state.pop(PENDING_UPLOADS, None)
    if source == "Upload" or pending:
        files = st.sidebar.file_uploader(
            md("Kineto trace files (.json, .json.gz), up to {} MiB in total.", data.MAX_UPLOAD_MB),
            type=["json", "gz"], accept_multiple_files=True, key="upload",
        )
        uploads = pending or [(f.name, f.getvalue()) for f in files or []]
        if uploads:
            key = data.upload_key(uploads)
            if key != st.session_state.get("upload_key"):
                try:
                    key, job, folder = data.save_uploads(uploads)
                except KinetoscopeError as exc:
                    st.error(str(exc))
                    return
                old = st.session_state.get(UPLOAD_DIR)
                if old is not None:
                    old.cleanup()  # the session's previous upload: its files go now
                # the folder lives as long as the session holds it (dropped with the session's state), and no
                # longer than the session itself (the janitor: Streamlit drops ended sessions lazily)
                st.session_state[UPLOAD_DIR] = folder
                watch_upload(folder.path)
                st.session_state[state.JOB] = job
                st.session_state[UPLOADED] = job
                st.session_state["upload_key"] = key
                st.session_state[state.CURRENT] = None
            job = st.session_state[UPLOADED]
            # several files: ranks of one job, or runs to compare? Asked, never assumed (a second file once became
            # rank 1 of the first without a word)
            open_job(job, key, job.name, st.session_state[UPLOAD_DIR].path, ask=True)
        elif source == "Upload" and st.session_state.get("upload_key") is None:
            st.session_state[state.CURRENT] = None
    else:
        st.session_state["upload_key"] = None
        if not choices:
            st.sidebar.warning("No traces found: upload one, or start with kinetoscope app PATH.")
            st.session_state[state.CURRENT] = None
            return
        labels = [c.label for c in choices]
        # the bundled samples open on the V100 ResNet-50 trace (it has something to show); given paths on the first
        default = 0 if given or stores else next((i for i, c in enumerate(choices) if "v100_resnet50" in c.label), 0)
        if st.session_state.get("trace") not in labels:
            st.session_state.pop("trace", None)
        # the default only when nothing chose one (a value set through the session state wins)
        where = {} if "trace" in st.session_state else {"index": default}
        label = st.sidebar.selectbox("Job" if stores else "Trace", labels, key="trace", **where)
        choice = choices[labels.index(label)]
        job = choice.job
        st.session_state[state.JOB] = job
        if choice.unread:
            st.sidebar.warning(md("{} of this job's {} rank files could not be read by the batch: opened without "
                                  "them (see the Fleet page for why).", choice.unread, choice.unread + len(job.files)))
        if len(job.files) > fleet.MAX_OPEN_RANKS:
            st.sidebar.warning(md("{} has {:,} rank files: more than the {} the app opens at once. Its job-level "
                                  "results are on the Fleet page.", label, len(job.files), fleet.MAX_OPEN_RANKS))
            st.session_state[state.CURRENT] = None
            return
        open_job(job, data.content_key(job.files + job.hang_dumps), label, None, ask=False)
    analysis = st.session_state.get(state.CURRENT)
    if analysis is not None:
        for name, reason in analysis.failed:
            st.error(md("{} was not analysed: {}", name, reason))
        ranks = [r["rank"] for r in analysis.report.ranks]
        if len(ranks) > 1:
            worst = analysis.report.worst_rank
            if st.session_state.get("rank") not in ranks:  # a new job: start on its worst rank
                st.session_state["rank"] = worst
            st.sidebar.selectbox("Rank", ranks, key="rank",
                                 format_func=lambda r: f"{r} (most severe finding)" if r == worst else str(r))


def _files_are_runs(key: str) -> bool:
    return st.sidebar.radio(
        "These files are", [RANKS, RUNS], key=key,
        help="ranks of one job: analysed together (collectives, stragglers); separate runs: each analysed on its "
             "own, to pick one and compare it with the others") == RUNS


def open_job(job: Job, key: str, label: str, folder: Path | None, *, ask: bool) -> None:
    """Analyse the chosen job and make it the current analysis. Several files are the ranks of one job or separate
    runs: for an upload the user is asked at once; for given paths and a store's jobs, when the files do not say
    their ranks (no distributedInfo, no rank-N in the name: four unrelated traces once read as "rank 3 of 4"), the
    same question and a warning. As separate runs, each file is analysed on its own; a file that cannot be is
    never a run to pick, and its error stays in the sidebar."""
    several = len(job.files) > 1
    separate = several and ask and _files_are_runs(UPLOAD_MODE)
    if not separate:
        analysis = analyse(key, label, job, folder)
        defaulted = [r for r in analysis.report.ranks if r["rank_source"] == "default"] if analysis else []
        if several and defaulted:
            st.sidebar.warning(md("{} of the {} files name no rank (no distributedInfo, no rank-N in the name): they "
                                  "were numbered in file order, as the ranks of one job. If they are separate runs, "
                                  "say so {}.", len(defaulted), len(job.files), "above" if ask else "below"))
            separate = not ask and _files_are_runs(PATHS_MODE)
        if analysis is not None:
            missing = missing_ranks_text(analysis.report.job)
            if missing:
                st.sidebar.warning(md("{}.", missing[0].upper() + missing[1:]))
        if not separate:
            st.session_state[state.UPLOAD_RUNS] = []
            st.session_state[state.JOB] = job
            st.session_state[state.CURRENT] = analysis
            return
    runs = data.separate_runs(job)
    outcomes = {r.label: try_analyse((key + "/" + r.label) if folder is not None else data.content_key(r.job.files),
                                     r.label, r.job, folder) for r in runs}
    good = [r for r in runs if not isinstance(outcomes[r.label], str)]
    for r in runs:
        if isinstance(outcomes[r.label], str):
            st.sidebar.error(md("{} cannot be opened as a run: {}", r.label, outcomes[r.label]))
    st.session_state[state.UPLOAD_RUNS] = good
    if not good:
        st.session_state[state.CURRENT] = None
        return
    labels = [r.label for r in good]
    if st.session_state.get("upload_run") not in labels:
        st.session_state.pop("upload_run", None)
    chosen = st.sidebar.selectbox("Run", labels, key="upload_run")
    run = good[labels.index(chosen)]
    st.session_state[state.JOB] = run.job
    st.session_state[state.CURRENT] = outcomes[chosen]


st.set_page_config(page_title="Kinetoscope", layout="wide")
page_style()
sidebar()
PAGES = [
    ("overview", "Overview", overview.render),
    ("steps", "Step breakdown", steps.render),
    ("streams", "Streams", streams.render),
    ("copies", "Copies", copies.render),
    ("memory", "Memory", memory.render),
    ("operators", "Operators & kernels", operators.render),
    ("modules", "Modules", modules.render),
    ("telemetry", "Telemetry", telemetry.render),
    ("timeline", "Timeline", timeline.render),
    ("ranks", "Ranks", ranks.render),
    ("distributed", "Distributed", distributed.render),
    ("compare", "Compare", compare.render),
    ("metadata", "Metadata", metadata.render),
    ("export", "Export", export.render),
    ("fleet", "Fleet (batch store)", fleet.render),
]
# a job with hang dumps: the Hang page first, and for dumps alone (no rank traces) with the Fleet page only
current = st.session_state.get(state.CURRENT)
if hang.has_hang_dumps(current):
    PAGES.insert(0, ("hang", "Hang", hang.render))
    if current is not None and not current.report.ranks:
        PAGES = [p for p in PAGES if p[0] in ("hang", "fleet")]
# Pages are functions in screens/ (not pages/: Streamlit then also runs its old multipage mode
# and drops widget changes), and AppTest cannot switch between them: tests pick START_PAGE.
start_page = st.session_state.get(START_PAGE, "fleet" if st.session_state.get(fleet.STORE_KEY) else
                                  "hang" if hang.has_hang_dumps(current) else "overview")
pages = {name: st.Page(fn, title=title, url_path=name, default=name == start_page) for name, title, fn in PAGES}
st.session_state[state.PAGE_OBJECTS] = pages  # for pages that send the user to another (Fleet -> Overview)
goto = st.session_state.pop(fleet.OPEN_PAGE_KEY, None)
if goto in pages:  # the Fleet page opened a hung job: its page exists now that the sidebar has opened it
    st.switch_page(pages[goto])
st.navigation(list(pages.values()), expanded=True).run()
