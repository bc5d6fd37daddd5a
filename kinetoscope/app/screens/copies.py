"""Copies: host-to-device and device-to-host, pageable vs pinned, overlap with compute."""

import altair as alt
import pandas as pd

from kinetoscope.app import state
from kinetoscope.app.ui import st
from kinetoscope.render.format import display_table, listing


def render() -> None:
    _, entry, results = state.page("Copies")
    for key, label in (("h2d", "Host → device"), ("d2h", "Device → host")):
        c = entry.get(key)
        st.subheader(label)
        if not c:
            st.markdown("No such copies.")
            continue
        cols = st.columns(5)
        cols[0].metric("Copies", c["count"])
        cols[1].metric("Time", state.ms(c["time_us"]), help="union of copy intervals")
        cols[2].metric("Bandwidth", f"{c['bandwidth_gb_per_s']} GB/s" if c["bandwidth_gb_per_s"] is not None else "n/a")
        cols[3].metric("Pageable", state.pct(c["pageable_fraction"]), help="of copy time")
        cols[4].metric(
            "Overlapped",
            state.pct(c["overlap_fraction"]),
            help="copy time with a kernel on another stream of the device",
        )
        kinds = pd.DataFrame({"host memory": ["pageable", "pinned", "other or unknown"],
                              "copies": [c["pageable_count"], c["pinned_count"],
                                         c["count"] - c["pageable_count"] - c["pinned_count"]]})
        st.altair_chart(
            alt.Chart(kinds)
            .mark_bar()
            .encode(
                x=alt.X("copies:Q", title="copies"),
                y=alt.Y("host memory:N", title=None, sort=None, axis=alt.Axis(labelOverlap=False, labelLimit=0)),
                color=alt.Color(
                    "host memory:N",
                    legend=None,
                    scale=alt.Scale(
                        domain=["pageable", "pinned", "other or unknown"], range=["#e45756", "#54a24b", "#bab0ac"]
                    ),
                ),
                tooltip=["host memory", "copies"],
            )
            .properties(height=3 * 28 + 60),
            width="stretch",
            description=f"{label} copies by host memory: "
            + listing(zip(kinds["host memory"], kinds["copies"], strict=False)),
        )
    copies = results.get("copies")
    if copies is not None and "copies" in copies.tables and len(copies.tables["copies"]):
        st.subheader("Every copy")
        table, formats = display_table(
            copies.tables["copies"], window_start_ns=state.window_start_ns(state.current(), entry)
        )
        st.dataframe(table, formats=formats, width="stretch")
