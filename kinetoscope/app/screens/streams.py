"""Streams: per-stream busy/idle and the largest gaps, each with its step and cause."""

import pandas as pd
import streamlit as st

from kinetoscope.app import state


def render() -> None:
    _, entry, results = state.page("CUDA streams")
    gpu = entry.get("gpu")
    if not gpu:
        st.write("No GPU activity in this trace.")
        st.stop()
    for d in gpu["devices"]:
        st.markdown(f"**GPU {d['device']}**: idle {state.pct(d['idle_fraction'])} of the window ({state.ms(d['idle_us'])})")
        st.bar_chart(pd.Series(d["idle_by_cause_us"], name="idle µs"), y_label="µs idle, by what the host was doing")
    st.markdown("**Streams** (busy is the union of kernels, copies and memsets; idle = window − busy)")
    st.dataframe(results["gpu"].tables["streams"], hide_index=True, use_container_width=True)
    gaps = results["gpu"].tables["gaps"]
    if len(gaps):
        st.markdown("**Largest device gaps** (step = the ProfilerStep it starts in)")
        st.dataframe(gaps.drop(columns=["start_ns"]), hide_index=True, use_container_width=True)
