"""Ranks: step time, GPU idle, data loading and collective wait per rank, the straggler highlighted."""

import pandas as pd
import streamlit as st

from kinetoscope.app import state


def render() -> None:
    analysis = state.current()
    report = analysis.report
    st.header("Ranks")
    rows = []
    stragglers = {f.rank for f in report.findings if f.id == "straggler"}
    coll = {r["rank"]: r for r in (report.job.get("collectives") or {}).get("ranks", [])}
    for r in report.ranks:
        rows.append({
            "rank": r["rank"],
            "straggler": r["rank"] in stragglers,
            "mean_step_us": (r.get("steps") or {}).get("mean_us"),
            "gpu_idle_fraction": (r.get("gpu") or {}).get("idle_fraction"),
            "loader_fraction": (r.get("loader") or {}).get("fraction"),
            "collective_wait_us": (coll.get(r["rank"]) or {}).get("wait_us"),
            "clock_skew_us": (coll.get(r["rank"]) or {}).get("clock_skew_us"),
            "last_to_arrive": (coll.get(r["rank"]) or {}).get("waited_for_count"),
            "file": r["file"],
        })
    table = pd.DataFrame(rows)
    if len(table) < 2:
        st.info("A single rank: load a directory (or upload several files) of one job to compare ranks.")
    st.dataframe(table.style.apply(lambda row: ["background-color: #fde2e1" if row["straggler"] else "" for _ in row], axis=1),
                 hide_index=True, width="stretch")
    if len(table) > 1 and table["collective_wait_us"].notna().any():
        # in a synchronous job every rank's step is as long as the slowest: the wait is what differs
        st.bar_chart(table.set_index("rank")[["collective_wait_us"]], y_label="µs waiting in collectives")
