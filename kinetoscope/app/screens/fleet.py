"""Fleet: a batch store's jobs x findings, worst first; broken jobs apart; a job opened in place."""

import streamlit as st

from kinetoscope.analyze.findings import SEVERITY_ORDER
from kinetoscope.app import state
from kinetoscope.batch.report import fleet, relative_names
from kinetoscope.batch.store import read_table
from kinetoscope.render.format import evidence_lines

STORE_KEY = "store_path"
#: the job the Fleet page asked the sidebar to open (its relative name)
OPEN_KEY = "fleet_open_job"


def render() -> None:
    store = st.session_state.get(STORE_KEY)
    st.header("Fleet")
    if not store:
        st.info("Open a batch store to see the fleet view: kinetoscope app STORE (made by kinetoscope batch).")
        return
    table = fleet(store)
    traces = read_table(store, "traces")
    findings = read_table(store, "findings")
    names = relative_names(sorted(traces["job"].unique()))
    ok = int((traces["status"] == "ok").sum())
    st.caption(f"{store} · {traces['job'].nunique()} jobs · {len(traces)} files ({ok} ok, {len(traces) - ok} failed) · "
               "jobs named from the folder they share")
    table = table.assign(job=table["job"].map(names))
    broken = table[table["failed"] == table["files"]]
    table = table[table["failed"] < table["files"]]
    st.dataframe(table.style.format({"mean_step_ms": "{:,.2f}", "gpu_idle_fraction": "{:.1%}",
                                     "worst_saving_ms_per_step": "{:,.2f}"}, na_rep=""),
                 hide_index=True, width="stretch")
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
    if st.button("Open this job in the app", key="fleet_open", type="primary",
                 help="every page (Overview, Distributed, Timeline ...) on this job's rank files, read in place"):
        st.session_state[OPEN_KEY] = job
        pages = st.session_state.get(state.PAGE_OBJECTS) or {}
        if "overview" in pages:
            st.switch_page(pages["overview"])
        st.rerun()
    st.dataframe(rows.drop(columns=["key", "tool_version", "content_sha256"]), hide_index=True, width="stretch")
    mine = findings[findings["job"] == key]
    order = mine["severity"].map(SEVERITY_ORDER).fillna(len(SEVERITY_ORDER))
    saving = mine["saving_us_per_step"].fillna(-1) if "saving_us_per_step" in mine else 0
    mine = mine.assign(_order=order, _saving=saving).sort_values(["_order", "_saving"], ascending=[True, False])
    for f in mine.itertuples():
        with st.expander(f"{f.severity.upper()} · rank {f.rank} · {f.title}"):
            st.markdown("\n".join(f"- {x}" for x in evidence_lines(_json(f.evidence_json))))


def _json(text: str) -> dict:
    import json

    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
