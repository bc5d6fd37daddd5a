"""Fleet: a batch store's jobs x findings, worst first; broken jobs apart; a job opened in place."""

from kinetoscope.analyze.model.findings import SEVERITY_ORDER
from kinetoscope.analyze.views.hang import hung_first, hung_jobs
from kinetoscope.app import state
from kinetoscope.app.ui import bullets, md, st
from kinetoscope.batch.report import fleet, missing_ranks, relative_names
from kinetoscope.batch.store import read_table, store_version
from kinetoscope.render.format import display_table, evidence_lines

STORE_KEY = "store_path"
#: the job the Fleet page asked the sidebar to open (its relative name)
OPEN_KEY = "fleet_open_job"
#: the page to show the job on, where not the Overview (a hung job: the Hang page)
OPEN_PAGE_KEY = "fleet_open_page"
#: a job of more ranks is not opened in the app (every rank's tables are held in memory): its job-level results show
MAX_OPEN_RANKS = 64
#: the store's version this page last showed; checked every REFRESH_S (one stat, or one listing of a bucket)
VERSION_KEY = "fleet_store_version"
REFRESH_S = 10.0


def _rerun_when_changed(store: str) -> None:
    """A batch --watch adds jobs all day: the page is drawn again when the store's version moves."""
    if store_version(store) != st.session_state.get(VERSION_KEY):
        st.rerun(scope="app")


def render() -> None:
    store = st.session_state.get(STORE_KEY)
    st.title("Fleet")
    if not store:
        st.info("Open a batch store to see the fleet view: kinetoscope app STORE (made by kinetoscope batch).")
        return
    st.session_state[VERSION_KEY] = store_version(store)  # before reading: a row landing after is seen next time
    st.fragment(run_every=REFRESH_S)(_rerun_when_changed)(store)
    table = fleet(store)
    traces = read_table(store, "traces")
    findings = read_table(store, "findings")
    hangs = read_table(store, "hangs")
    names = relative_names(sorted(set(traces["job"]) | set(hangs.loc[hangs["status"] == "ok", "job"])))
    ok = int((traces["status"] == "ok").sum())
    st.caption(f"{store} · {traces['job'].nunique()} jobs · {len(traces)} files ({ok} ok, {len(traces) - ok} failed) · "
               "jobs named from the folder they share")
    hung, unread = hung_jobs(hangs, names)
    if len(hung):  # first: a job that stopped costs more than any slow step
        st.subheader(f"Hung jobs ({len(hung)})")
        st.caption("Jobs whose ranks' hang dumps show where they stopped: the process group and sequence number "
                   "where the ranks parted, the op most ranks entered, and the ranks held responsible (stuck).")
        shown, units = display_table(hung)
        st.dataframe(shown, formats=units, pinned=("job",), width="stretch")
        chosen = st.selectbox("Open a hung job", list(hung["job"]), key="fleet_hung_job")
        if st.button("Open on the Hang page", key="fleet_open_hang", help="every rank's part and stack"):
            st.session_state[OPEN_KEY] = chosen
            st.session_state[OPEN_PAGE_KEY] = "hang"
            st.rerun()
    if len(unread):
        st.subheader(f"Hang dumps that could not be read ({len(unread)})")
        st.dataframe(unread, width="stretch")
    completeness = missing_ranks(traces).set_index("job")
    gaps = completeness["missing_ranks"]
    table = table.assign(missing_ranks=table["job"].map(gaps).astype("Int64"), job=table["job"].map(names))
    broken = table[table["failed"] == table["files"]]
    table = table[table["failed"] < table["files"]]
    # worst first by what fixing the job's worst finding saves per step; jobs without an estimate after
    table = table.sort_values(["worst_saving_ms_per_step", "critical", "warnings"], ascending=False, na_position="last",
                              kind="stable")
    table = hung_first(table, hung)
    lead = ["job", "worst_saving_ms_per_step", "worst_finding", "missing_ranks"]
    shown, units = display_table(table[lead + [c for c in table.columns if c not in lead]])
    st.caption("Hung jobs first, then worst first by what fixing each job's worst finding saves per step; missing "
               "ranks: ranks of the job (by its world size) with no readable file.")
    st.dataframe(shown, formats=units, pinned=("job",), width="stretch")
    if len(broken):
        st.subheader(f"Jobs that could not be analysed ({len(broken)})")
        failed = traces[traces["status"] != "ok"]
        rows = failed[failed["job"].map(names).isin(broken["job"])]
        st.dataframe(rows.assign(job=rows["job"].map(names))[["job", "path", "error"]], hide_index=True,
                     width="stretch")
    if table.empty:
        return
    job = st.selectbox("Drill into a job", list(table["job"]), key="fleet_job")
    key = next(k for k, v in names.items() if v == job)
    rows = traces[traces["job"] == key]
    st.subheader(job)
    too_many = int((rows["status"] == "ok").sum()) > MAX_OPEN_RANKS
    if too_many:
        st.caption(
            f"{len(rows):,} rank files: more than the {MAX_OPEN_RANKS} the app opens at once (each rank's tables "
            "are held in memory). Its job-level results are below; open a rank's file with kinetoscope app PATH."
        )
    if st.button("Open this job in the app", key="fleet_open", type="primary", disabled=too_many,
                 help="every page (Overview, Distributed, Timeline ...) on this job's rank files, read in place"):
        st.session_state[OPEN_KEY] = job
        pages = st.session_state.get(state.PAGE_OBJECTS) or {}
        if "overview" in pages:
            st.switch_page(pages["overview"])
        st.rerun()
    job_row = read_table(store, "jobs")
    job_row = job_row[job_row["job"] == key]
    missing = int(gaps.get(key, 0) or 0)
    if missing:
        st.warning(md("{:,} of this job's {:,} ranks have no readable file: nothing is claimed about the whole job "
                      "(its straggler); the ranks read are below.", missing, int(completeness.loc[key, "world_size"])))
    if len(job_row) and not missing:
        j = job_row.iloc[0]
        st.markdown(
            md(
                "**Across ranks** {}",
                f"(the reduce over {int(j['ranks']):,} ranks' summaries): "
                + (
                    f"straggler rank {int(j['straggler_rank'])} ({j['straggler_cause']}), the others wait "
                    f"{j['straggler_wait_us_per_step'] / 1000:,.3f} ms per step for it; "
                    if j["straggler_rank"] == j["straggler_rank"] and j["straggler_rank"] is not None
                    else "no straggler; "
                )
                + f"{int(j['matched']):,} collectives matched, {int(j['unmatched']):,} unmatched; largest clock skew "
                + (
                    "n/a"
                    if j["max_abs_clock_skew_us"] != j["max_abs_clock_skew_us"]
                    else f"{j['max_abs_clock_skew_us'] / 1000:,.3f} ms"
                ),
            )
        )
        per_rank = read_table(store, "job_ranks")
        per_rank = per_rank[per_rank["job"] == key].sort_values("rank")
        shown, formats = display_table(per_rank.drop(columns=["key", "job"]))
        st.dataframe(shown, formats=formats, width="stretch")
    shown, units = display_table(rows.drop(columns=["key", "tool_version", "content_sha256"]).assign(
        job=rows["job"].map(names)))
    st.dataframe(shown, formats=units, width="stretch")
    mine = findings[findings["job"] == key]
    order = mine["severity"].map(SEVERITY_ORDER).fillna(len(SEVERITY_ORDER))
    saving = mine["saving_us_per_step"].fillna(-1) if "saving_us_per_step" in mine else 0
    mine = mine.assign(_order=order, _saving=saving).sort_values(["_order", "_saving"], ascending=[True, False])
    for f in mine.itertuples():
        with st.expander(f"{f.severity.upper()} · rank {f.rank} · {f.title}"):
            st.markdown(bullets(evidence_lines(_json(f.evidence_json))))


def _json(text: str) -> dict:
    import json

    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
