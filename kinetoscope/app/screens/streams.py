"""Streams: per-stream busy/idle and the largest gaps, each with its step and cause."""

import altair as alt
import pandas as pd

from kinetoscope.app import state
from kinetoscope.app.ui import md, st
from kinetoscope.render.format import display_table, listing, series_label


def render() -> None:
    _, entry, results = state.page("CUDA streams")
    gpu = entry.get("gpu")
    if not gpu:
        st.markdown("No GPU activity in this trace.")
        st.stop()
    missing = gpu.get("missing_activity") or {}
    for d in gpu["devices"]:
        if d["idle_fraction"] is None:
            st.markdown(md("**GPU {}**: busy {}; idle not judged - the trace misses the GPU's activity for {} of the "
                           "window", d["device"], state.ms(d["busy_us"]), state.pct(missing.get("unknown_fraction"))))
            continue
        st.markdown(md("**GPU {}**: idle {} of the window ({})", d["device"], state.pct(d["idle_fraction"]),
                       state.ms(d["idle_us"])))
        causes = pd.DataFrame({"cause": [series_label(c) for c in d["idle_by_cause_us"]],
                               "ms": [v / 1000 for v in d["idle_by_cause_us"].values()]})
        st.altair_chart(
            alt.Chart(causes)
            .mark_bar(color="#e45756")
            .encode(
                x=alt.X("ms:Q", title="ms idle in the window, by what the host was doing"),
                y=alt.Y("cause:N", title=None, sort="-x"),
                tooltip=["cause", alt.Tooltip("ms:Q", format=",.3f")],
            ),
            width="stretch",
            description=f"GPU {d['device']} idle in the window by what the host was doing: "
            + listing(zip(causes["cause"], causes["ms"], strict=False), "ms"),
        )
    _graph_replays(missing)
    if gpu.get("judgement"):
        st.caption(f"GPU findings are information only here: {gpu['judgement']}")
    st.markdown(md("**Streams** (busy is the union of kernels, copies and memsets; idle is the measure of the gaps)"))
    table, formats = display_table(results["gpu"].tables["streams"])
    st.dataframe(table, formats=formats, width="stretch")
    gaps = results["gpu"].tables["gaps"]
    if len(gaps):
        st.markdown(md("**Largest device gaps** (step = the ProfilerStep it starts in)"))
        table, formats = display_table(gaps, window_start_ns=state.window_start_ns(state.current(), entry))
        st.dataframe(table, formats=formats, width="stretch")


def _graph_replays(missing: dict) -> None:
    """Graph replays whose kernels were not recorded: which were judged from their graph's capture, how they were
    matched, and what the graph holds (the captured launches: their kernels never ran there, so no names)."""
    if not missing.get("graph_launches_unrecorded"):
        return
    span = missing.get("graph_replay_span_us")
    st.markdown(md("**Graph replays without recorded kernels**: {}, of which {} judged from their graph's capture{}",
                   missing["graph_launches_unrecorded"], missing.get("graph_launches_from_capture", 0),
                   f" (running a captured graph for {state.ms(span)}: neither idle nor unknown)" if span is not None
                   else ""))
    for g in missing.get("captured_graphs") or []:
        size = f", batch size {g['batch_size']}" if g["batch_size"] is not None else ""
        busy = g.get("recorded_replay_busy_us")
        alike = (f"; a recorded replay of its kernels keeps the GPU busy {state.ms(busy)} (median of "
                 f"{g['recorded_replays_alike']})" if busy is not None else "")
        st.markdown(md("Graph {} of {}{}: {} launches; {} replays ({} judged), matched by {}, {} confidence{}",
                       g["capture"], g["source"], size, g["launches"], g["replays"], g["replays_judged"],
                       ", ".join(g["matched_by"]), g["confidence"], alike))
        st.dataframe(pd.DataFrame(g["launch_list"], columns=["call", "op", "kernel", "grid"]), width="stretch")
    for reason, count in (missing.get("graph_launches_not_judged") or {}).items():
        st.markdown(md("{} not judged: {}", count, reason))
