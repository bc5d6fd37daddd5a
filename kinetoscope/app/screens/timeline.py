"""Timeline: GPU streams and the training thread for a range of steps."""

import altair as alt
import streamlit as st

from kinetoscope.analyze.views import MAX_SPANS, timeline_spans
from kinetoscope.app import state


def render() -> None:
    analysis = state.current()
    entry = state.rank_entry(analysis)
    rank = analysis.trace.rank(entry["rank"])
    st.header(f"Timeline · rank {entry['rank']}")
    steps = [int(s) for s in rank.steps["step"]]
    if len(steps) > 1:
        first, last = st.select_slider("Steps", options=steps, value=(steps[0], steps[min(1, len(steps) - 1)]), key="tl_steps")
    elif steps:
        first = last = steps[0]
    else:
        first = last = None
    spans = timeline_spans(rank, first, last)
    st.caption(f"{len(spans):,} spans (at most {MAX_SPANS:,}, the longest kept); times from the start of the range. "
               "For the full trace, open the file in Perfetto (see Export).")
    chart = alt.Chart(spans).mark_bar().encode(
        x=alt.X("start_us:Q", title="µs"), x2="end_us:Q",
        y=alt.Y("lane:N", title=None, sort=None),
        color=alt.Color("kind:N"),
        tooltip=["name", "kind", "lane", alt.Tooltip("dur_us:Q", format=",.1f")],
    ).properties(height=40 * max(3, spans["lane"].nunique()))
    st.altair_chart(chart.interactive(bind_y=False), use_container_width=True)
