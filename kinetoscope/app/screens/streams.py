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
    missing = gpu.get("missing_activity") or {}
    for d in gpu["devices"]:
        if d["idle_fraction"] is None:
            st.markdown(f"**GPU {d['device']}**: busy {state.ms(d['busy_us'])}; idle not judged - the trace misses the "
                        f"GPU's activity for {state.pct(missing.get('unknown_fraction'))} of the window")
            continue
        st.markdown(f"**GPU {d['device']}**: idle {state.pct(d['idle_fraction'])} of the window ({state.ms(d['idle_us'])})")
        st.bar_chart(pd.Series(d["idle_by_cause_us"], name="idle µs"), y_label="µs idle, by what the host was doing")
    if gpu.get("judgement"):
        st.caption(f"GPU findings are information only here: {gpu['judgement']}")
    st.markdown("**Streams** (busy is the union of kernels, copies and memsets; idle is the measure of the gaps)")
    st.dataframe(results["gpu"].tables["streams"], hide_index=True, width="stretch")
    gaps = results["gpu"].tables["gaps"]
    if len(gaps):
        st.markdown("**Largest device gaps** (step = the ProfilerStep it starts in)")
        st.dataframe(gaps.drop(columns=["start_ns"]), hide_index=True, width="stretch")
