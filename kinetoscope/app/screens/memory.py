"""Memory: allocated and reserved over time and per step, the peak, the growth line, every allocation of a range
(size, op, when it was freed), and what each operator allocated, freed and still holds (analyze.ops)."""

import altair as alt

from kinetoscope.analyze.views.ops import EARLIER, allocation_events, allocations_by_op
from kinetoscope.app import state
from kinetoscope.app.ui import md, st
from kinetoscope.render.format import listing, number

SERIES = {"allocated_mib": "allocated", "reserved_mib": "reserved", "growth_fit_mib": "growth line (fit)"}


def render() -> None:
    analysis, entry, results = state.page("Memory")
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
        cols[0].metric("Peak allocated", state.mib(d["peak_allocated_bytes"]),
                       help=md("at {}, step {}", d["peak_op"] or "an unknown op", d["peak_step"]))
        growth = d["growth_bytes_per_step"]
        cols[1].metric("Growth per step", state.mib(growth) if growth is not None else "n/a",
                       help=md("robust slope of allocated memory at step ends; R² {}, steady: {}",
                               number(d["growth_r2"]), "yes" if d["steady_growth"] else "no"))
        cols[2].metric("Fragmentation (max)", state.mib(d["fragmentation_bytes_max"]),
                       help="reserved − allocated at step ends; n/a where the allocator reports no reserved memory")
        series = timeline[timeline["device"] == device]
        if len(series):
            st.markdown(md("**Over the window** — allocated (the band spans each moment's lowest and highest value: "
                           "the dips between steps show) and reserved"))
            base = alt.Chart(series).encode(x=alt.X("t_ms:Q", title="time from the window start (ms)"))
            band = base.mark_area(opacity=0.3, color="#4c78a8").encode(
                y=alt.Y("allocated_min_mib:Q", title="MiB", scale=alt.Scale(zero=False), axis=alt.Axis(format=",.3~f")),
                y2="allocated_mib:Q")
            lines = series.melt(id_vars=["t_ms"], value_vars=["allocated_mib", "reserved_mib"], var_name="series",
                                value_name="MiB").dropna()
            lines["series"] = lines["series"].map(SERIES)
            drawn = alt.Chart(lines).mark_line().encode(
                x="t_ms:Q", y="MiB:Q",
                color=alt.Color("series:N", title=None, scale=alt.Scale(
                    domain=[n for n in ("allocated", "reserved") if n in set(lines["series"])],
                    range=["#4c78a8", "#f58518"]),
                                legend=alt.Legend(orient="bottom")),
                tooltip=[alt.Tooltip("t_ms:Q", format=",.2f", title="ms"), "series",
                         alt.Tooltip("MiB:Q", format=",.2f")])
            peak = alt.Chart(series.nlargest(1, "allocated_mib")).mark_point(color="red", size=80).encode(
                x="t_ms:Q", y="allocated_mib:Q",
                tooltip=[alt.Tooltip("t_ms:Q", format=",.2f", title="peak at (ms)"),
                         alt.Tooltip("allocated_mib:Q", format=",.2f", title="MiB")])
            top = series.nlargest(1, "allocated_mib").iloc[0]
            st.altair_chart(
                band + drawn + peak,
                width="stretch",
                description=(
                    f"{device} allocated memory over the window: {number(series['allocated_min_mib'].min())} to "
                    f"{number(series['allocated_mib'].max())} MiB, peak at {number(top['t_ms'])} ms"
                    + (
                        f"; reserved up to {number(series['reserved_mib'].max())} MiB"
                        if series["reserved_mib"].notna().any()
                        else ""
                    )
                ),
            )
        steps = per_step[per_step["device"] == device]
        if len(steps) >= 2:
            st.markdown(md("**At each step end** — allocated and reserved (solid), the fitted growth line (dashed)"))
            long = steps.melt(id_vars=["step"], value_vars=list(SERIES), var_name="series", value_name="MiB").dropna()
            long["series"] = long["series"].map(SERIES)
            chart = alt.Chart(long).mark_line(point=True).encode(
                x=alt.X("step:O", title="step"), y=alt.Y("MiB:Q", title="MiB", scale=alt.Scale(zero=False),
                                                          axis=alt.Axis(format=",.3~f")),
                color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom")),
                strokeDash=alt.condition(alt.datum.series == "growth line (fit)", alt.value([6, 4]), alt.value([1, 0])),
                tooltip=["step", "series", alt.Tooltip("MiB:Q", format=",.2f")])
            st.altair_chart(
                chart,
                width="stretch",
                description=f"{device} at each step end, MiB: "
                + "; ".join(
                    f"step {s}: " + listing(zip(g["series"], g["MiB"], strict=False))
                    for s, g in list(long.groupby("step"))[:12]
                ),
            )
        else:
            st.caption("One step in the window: no per-step chart (capture more active steps to judge growth).")
    rank = analysis.trace.rank(entry["rank"])
    _by_op(rank)
    _events(rank, float(entry.get("window_us") or 0.0) / 1000.0)


def _by_op(rank) -> None:
    table = allocations_by_op(rank)
    st.subheader("Allocations by operator")
    if table.empty:
        st.caption("No allocator events in the window.")
        return
    st.caption(md("Each allocation of the window charged to the innermost operator running on its thread ('(no op)': "
                  "outside any operator), and each free to the allocation of the same block, so an operator's freed "
                  "and held never exceed what it allocated; held: what its allocations still hold at the window's "
                  "end. Frees of blocks allocated before the window are the row '{}' (negative held). Per device, "
                  "held adds up to the change of allocated memory over the window. {:,} rows, most held first.",
                  EARLIER, len(table)))
    st.dataframe(table.rename(columns={"allocated_mib": "allocated (MiB)", "freed_mib": "freed (MiB)",
                                       "held_mib": "held at the end (MiB)", "largest_mib": "largest (MiB)"}),
                 formats={c: "{:,.2f}" for c in ("allocated (MiB)", "freed (MiB)", "held at the end (MiB)",
                                                 "largest (MiB)")}, pinned=("op",), width="stretch")


def _events(rank, window_ms: float) -> None:
    st.subheader("Allocations over a range")
    if window_ms < 0.002:
        return
    lo, hi = st.slider("ms from the window start", 0.0, round(window_ms, 3), (0.0, round(window_ms, 3)),
                       step=max(round(window_ms / 2000, 3), 0.001), key="mem_range")
    events = allocation_events(rank, lo, hi)
    st.caption(md("{:,} allocations start in {}–{} ms: when, how large, by which operator, and when the window freed "
                  "it (blank: not within the window).", len(events), number(lo), number(hi)))
    if events.empty:
        return
    st.dataframe(
        events.rename(
            columns={
                "time_ms": "time (ms)",
                "size_mib": "size (MiB)",
                "freed_at_ms": "freed at (ms)",
                "lifetime_ms": "lived (ms)",
            }
        ),
        formats={"time (ms)": "{:,.3f}", "size (MiB)": "{:,.3f}", "freed at (ms)": "{:,.3f}", "lived (ms)": "{:,.3f}"},
        pinned=("time (ms)",),
        width="stretch",
    )
