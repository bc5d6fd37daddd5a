"""Metadata: devices, versions, distributed info — secret-looking values redacted."""

import streamlit as st

from kinetoscope.analyze.redact import redact
from kinetoscope.app import state


def render() -> None:
    analysis = state.current()
    entry = state.rank_entry(analysis)
    meta = analysis.trace.rank(entry["rank"]).meta
    st.header(f"Metadata · rank {entry['rank']}")
    st.markdown(f"**File** `{meta.source}` · schema {meta.schema_version} · {meta.n_events:,} events · "
                f"loaded in {meta.load_seconds:.2f} s · rank from {meta.rank_source}")
    st.subheader("Devices")
    st.json(redact(list(meta.device_properties)) or "no deviceProperties", expanded=False)
    st.subheader("Distributed")
    st.json(redact(meta.distributed_info) if meta.distributed_info else "no distributedInfo", expanded=False)
    st.subheader("Other trace metadata (secrets redacted)")
    st.json(redact(meta.other), expanded=False)
    if meta.unhandled_events:
        st.subheader("Events not analysed")
        st.json(meta.unhandled_events)
    for w in meta.warnings:
        st.caption(f"note: {w}")
