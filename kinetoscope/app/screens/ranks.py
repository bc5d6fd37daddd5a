"""Ranks: step time, GPU idle and data loading per rank, the straggler highlighted."""

import pandas as pd
import streamlit as st

from kinetoscope.app import state


def render() -> None:
    analysis = state.current()
    report = analysis.report
    st.header("Ranks")
    rows = []
    stragglers = {f.rank for f in report.findings if f.id == "straggler"}
    comm = {r["rank"]: r["collective_us"] for r in (report.job.get("straggler") or {}).get("ranks", [])}
    for r in report.ranks:
        rows.append({
            "rank": r["rank"],
            "straggler": r["rank"] in stragglers,
            "mean_step_us": (r.get("steps") or {}).get("mean_us"),
            "gpu_idle_fraction": (r.get("gpu") or {}).get("idle_fraction"),
            "loader_fraction": (r.get("loader") or {}).get("fraction"),
            "collective_us": comm.get(r["rank"]),
            "file": r["file"],
        })
    table = pd.DataFrame(rows)
    if len(table) < 2:
        st.info("A single rank: load a directory (or upload several files) of one job to compare ranks.")
    st.dataframe(table.style.apply(lambda row: ["background-color: #fde2e1" if row["straggler"] else "" for _ in row], axis=1),
                 hide_index=True, use_container_width=True)
    if len(table) > 1:
        st.bar_chart(table.set_index("rank")[["mean_step_us"]], y_label="mean step µs")
