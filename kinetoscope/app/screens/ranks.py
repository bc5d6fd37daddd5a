"""Ranks: step time, GPU idle, data loading and collective wait per rank, the straggler highlighted."""

from pathlib import Path

import altair as alt
import pandas as pd

from kinetoscope.analyze.views.distributed import distributed_view
from kinetoscope.app import state
from kinetoscope.app.ui import st
from kinetoscope.render.format import display_table, listing


def render() -> None:
    analysis = state.current()
    report = analysis.report
    st.title("Ranks")
    rows = []
    view = distributed_view(analysis.trace, report)  # the straggler as the analysis names it
    stragglers = set(view.ranks.loc[view.ranks["straggler"], "rank"])
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
            "file": Path(r["file"]).name,
        })
    table = pd.DataFrame(rows)
    if len(table) < 2:
        st.info("A single rank: load a directory (or upload several files) of one job to compare ranks.")
    shown, formats = display_table(table.rename(columns={"last_to_arrive": "last to arrive (collectives)"}))
    st.dataframe(shown, formats=formats, highlight=shown["straggler"], width="stretch")
    if len(table) > 1 and table["collective_wait_us"].notna().any():
        # in a synchronous job every rank's step is as long as the slowest: the wait is what differs
        wait = table.assign(ms=table["collective_wait_us"] / 1000)
        st.altair_chart(alt.Chart(wait).mark_bar(color="#e45756").encode(
            x=alt.X("ms:Q", title="ms waiting in collectives for the last rank, in the window"), y=alt.Y("rank:O"),
            tooltip=["rank", alt.Tooltip("ms:Q", format=",.3f")]), width="stretch",
            description="ms each rank waited in collectives for the last rank, in the window: " + listing(
                (f"rank {r}", v) for r, v in zip(wait["rank"], wait["ms"], strict=False) if v == v))
