"""Copies: host-to-device and device-to-host, pageable vs pinned, overlap with compute."""

import pandas as pd
import streamlit as st

from kinetoscope.app import state


def render() -> None:
    _, entry, results = state.page("Copies")
    for key, label in (("h2d", "Host → device"), ("d2h", "Device → host")):
        c = entry.get(key)
        st.subheader(label)
        if not c:
            st.write("No such copies.")
            continue
        cols = st.columns(5)
        cols[0].metric("Copies", c["count"])
        cols[1].metric("Time", state.ms(c["time_us"]), help="union of copy intervals")
        cols[2].metric("Bandwidth", f"{c['bandwidth_gb_per_s']} GB/s" if c["bandwidth_gb_per_s"] is not None else "n/a")
        cols[3].metric("Pageable", state.pct(c["pageable_fraction"]), help="of copy time")
        cols[4].metric("Overlapped", state.pct(c["overlap_fraction"]), help="copy time with a kernel on another stream of the device")
        st.bar_chart(pd.Series({"pageable": c["pageable_count"], "pinned": c["pinned_count"],
                                "other": c["count"] - c["pageable_count"] - c["pinned_count"]}, name="copies"))
    copies = results.get("copies")
    if copies is not None and "copies" in copies.tables and len(copies.tables["copies"]):
        st.subheader("Every copy")
        st.dataframe(copies.tables["copies"], hide_index=True, width="stretch")
