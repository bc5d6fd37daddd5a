"""Step breakdown: where each step's time goes, on the host and on the GPU."""

import pandas as pd
import streamlit as st

from kinetoscope.app import state


def render() -> None:
    _, entry, results = state.page("Step breakdown")
    anatomy = results.get("phases")
    if anatomy is None or anatomy.tables["phases_per_step"].empty:
        st.write("No steps to break down.")
        st.stop()
    per_step = anatomy.tables["phases_per_step"].set_index("step")
    phase_cols = [c for c in per_step.columns if c.endswith("_us") and c != "step_us"]
    st.markdown("**Host (training thread)** — every µs of each step in exactly one phase")
    st.bar_chart(per_step[phase_cols], y_label="µs", x_label="step")
    gpu = results.get("gpu")
    if gpu is not None and "gpu_per_step" in gpu.tables and len(gpu.tables["gpu_per_step"]):
        st.markdown("**GPU** — busy (union of all streams) and idle per step")
        g = gpu.tables["gpu_per_step"]
        for device, rows in g.groupby("device"):
            st.bar_chart(rows.set_index("step")[["busy_us", "idle_us"]], y_label=f"GPU {device} µs", x_label="step")
    st.markdown("**Phases over the window**")
    st.dataframe(pd.DataFrame(entry["phases"]).T, width="stretch")
    loader = results.get("loader")
    if loader is not None and len(loader.tables["loader_per_step"]):
        st.markdown("**Data loading per step**")
        st.dataframe(loader.tables["loader_per_step"], hide_index=True, width="stretch")
