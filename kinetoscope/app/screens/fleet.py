"""Fleet: a batch store's jobs x findings, worst first, with drill-down into one job."""

import json

import streamlit as st

from kinetoscope.analyze.findings import SEVERITY_ORDER
from kinetoscope.app import state
from kinetoscope.batch.report import fleet
from kinetoscope.batch.store import read_table

STORE_KEY = "store_path"


def render() -> None:
    store = st.session_state.get(STORE_KEY)
    st.header("Fleet")
    if not store:
        st.info("Open a batch store to see the fleet view: kinetoscope app STORE (made by kinetoscope batch).")
        return
    table = fleet(store)
    traces = read_table(store, "traces")
    findings = read_table(store, "findings")
    ok = int((traces["status"] == "ok").sum())
    st.caption(f"{store} · {traces['job'].nunique()} jobs · {len(traces)} files ({ok} ok, {len(traces) - ok} failed)")
    st.dataframe(table, hide_index=True, use_container_width=True)
    if table.empty:
        return
    job = st.selectbox("Drill into a job", list(table["job"]), key="fleet_job")
    rows = traces[traces["job"] == job]
    st.subheader(job)
    st.dataframe(rows.drop(columns=["key", "tool_version", "content_sha256"]), hide_index=True, use_container_width=True)
    mine = findings[findings["job"] == job]
    order = mine["severity"].map(SEVERITY_ORDER).fillna(len(SEVERITY_ORDER))
    saving = mine["saving_us_per_step"].fillna(-1) if "saving_us_per_step" in mine else 0
    mine = mine.assign(_order=order, _saving=saving).sort_values(["_order", "_saving"], ascending=[True, False])
    for f in mine.itertuples():
        with st.expander(f"{f.severity.upper()} · rank {f.rank} · {f.title}"):
            st.json(json.loads(f.evidence_json), expanded=False)
    st.caption("To inspect a file in depth, start the app on it: kinetoscope app " + state.quote(rows["path"].iloc[0]))
