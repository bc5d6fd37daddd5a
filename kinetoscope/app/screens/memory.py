"""Memory: allocated and reserved per step and over time, the peak, and the growth line."""

import altair as alt
import streamlit as st

from kinetoscope.app import state


def render() -> None:
    _, entry, results = state.page("Memory")
    mem = entry.get("memory")
    if not mem:
        st.write("No [memory] events in this trace (capture with profile_memory=True).")
        st.stop()
    per_step = results["memory"].tables["memory_per_step"]
    timeline = results["memory"].tables["memory_timeline"]
    for d in mem["devices"]:
        device = d["device"]
        st.subheader(device)
        cols = st.columns(3)
        cols[0].metric("Peak allocated", state.mib(d["peak_allocated_bytes"]), help=f"at {d['peak_op'] or 'unknown op'}, step {d['peak_step']}")
        growth = d["growth_bytes_per_step"]
        cols[1].metric("Growth", f"{state.mib(growth)}/step" if growth is not None else "n/a",
                       help=f"R² {d['growth_r2']}, steady: {d['steady_growth']}")
        cols[2].metric("Fragmentation (max)", state.mib(d["fragmentation_bytes_max"]), help="reserved − allocated at step ends")
        steps = per_step[per_step["device"] == device].set_index("step")
        if len(steps):
            st.markdown("At each step end (dashed: the fitted growth line)")
            st.line_chart(steps[["allocated_bytes", "reserved_bytes", "growth_fit_bytes"]], y_label="bytes")
        series = timeline[timeline["device"] == device]
        if len(series):
            base = alt.Chart(series).encode(x=alt.X("ts_us:Q", title="time (µs, trace clock)"))
            lines = base.mark_line().encode(y=alt.Y("allocated_bytes:Q", title="allocated bytes"))
            peak = alt.Chart(series.nlargest(1, "allocated_bytes")).mark_point(color="red", size=80).encode(
                x="ts_us:Q", y="allocated_bytes:Q", tooltip=["ts_us", "allocated_bytes"])
            st.altair_chart(lines + peak, use_container_width=True)
