"""Memory: allocated and reserved per step and over time, the peak, and the growth line."""

import altair as alt
from kinetoscope.app.ui import md, st

from kinetoscope.analyze.ops import allocations_by_op
from kinetoscope.app import state


def render() -> None:
    _, entry, results = state.page("Memory")
    mem = entry.get("memory")
    if not mem:
        st.markdown("No [memory] events in this trace (capture with profile_memory=True).")
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
        steps = per_step[per_step["device"] == device]
        if len(steps) >= 2:
            st.markdown("At each step end: allocated and reserved (solid), the fitted growth line (dashed)")
            long = steps.melt(id_vars=["step"], value_vars=["allocated_mib", "reserved_mib", "growth_fit_mib"],
                              var_name="series", value_name="MiB").dropna()
            long["series"] = long["series"].map({"allocated_mib": "allocated", "reserved_mib": "reserved",
                                                 "growth_fit_mib": "growth line (fit)"})
            chart = alt.Chart(long).mark_line(point=True).encode(
                x=alt.X("step:O", title="step"), y=alt.Y("MiB:Q", title="MiB", scale=alt.Scale(zero=False),
                                                          axis=alt.Axis(format=",.1f")),
                color=alt.Color("series:N", title=None),
                strokeDash=alt.condition(alt.datum.series == "growth line (fit)", alt.value([6, 4]), alt.value([1, 0])),
                tooltip=["step", "series", alt.Tooltip("MiB:Q", format=",.1f")])
            st.altair_chart(chart, width="stretch")
        else:
            st.caption("One step in the window: no per-step chart (capture more active steps to judge growth).")
        series = timeline[timeline["device"] == device]
        if len(series):
            st.markdown("Allocated over the window (the band spans each moment's lowest and highest value: the "
                        "dips between steps show)")
            base = alt.Chart(series).encode(x=alt.X("t_ms:Q", title="time from the window start (ms)"))
            band = base.mark_area(opacity=0.3, color="#4c78a8").encode(
                y=alt.Y("allocated_min_mib:Q", title="allocated (MiB)", scale=alt.Scale(zero=False),
                        axis=alt.Axis(format=",.1f")), y2="allocated_mib:Q")
            lines = band + base.mark_line(color="#4c78a8").encode(y=alt.Y("allocated_mib:Q"))
            peak = alt.Chart(series.nlargest(1, "allocated_mib")).mark_point(color="red", size=80).encode(
                x="t_ms:Q", y="allocated_mib:Q",
                tooltip=[alt.Tooltip("t_ms:Q", format=",.2f", title="ms"), alt.Tooltip("allocated_mib:Q", format=",.1f", title="MiB")])
            st.altair_chart(lines + peak, width="stretch")
    _by_op(state.current().trace.rank(entry["rank"]))


def _by_op(trace) -> None:
    table = allocations_by_op(trace)
    st.subheader("Allocations by operator")
    if table.empty:
        st.caption("No allocator events in the window.")
        return
    st.caption("Each allocation and free of the window charged to the innermost operator running on its thread when it "
               "happened ('(no op)': outside any operator); by MiB allocated, the first 50 shown. A large net (allocated "
               "less freed) is memory the operator's results still hold at the window's end, or handed to another op to free.")
    st.dataframe(table.head(50).rename(columns={
        "allocated_mib": "allocated (MiB)", "freed_mib": "freed (MiB)", "net_mib": "net (MiB)",
        "largest_mib": "largest (MiB)"}).style.format({c: "{:,.2f}" for c in ("allocated (MiB)", "freed (MiB)", "net (MiB)",
                                                                         "largest (MiB)")}),
                 hide_index=True, width="stretch")
