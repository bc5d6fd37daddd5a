"""Timeline: a row per GPU stream and per host thread's nesting level, steps labelled, ms from the window start;
spans under a pixel merged (analyze.views.timeline_view); the full trace in Perfetto."""

import altair as alt
from kinetoscope.app.ui import md, st

from kinetoscope.analyze.views import KIND_COLOURS, step_range_ms, timeline_view
from kinetoscope.app import state
from kinetoscope.app.perfetto import open_in_perfetto

#: pixels per row; the chart's height also holds the legend and the axis (~110 px)
ROW_PX = 20


def render() -> None:
    analysis, entry, _ = state.page("Timeline")
    rank = analysis.trace.rank(entry["rank"])
    window_ms = float(entry.get("window_us") or 0.0) / 1000.0
    steps = rank.steps
    positions = list(range(len(steps)))
    mode = st.radio("Range", ["Steps", "Time range", "Whole window"] if positions else ["Time range", "Whole window"],
                    horizontal=True, key="tl_mode")
    start = end = None
    if mode == "Steps":
        if len(positions) > 1:
            label = dict(zip(positions, steps["step"].astype(int)))
            first, last = st.select_slider("Steps", options=positions, value=(0, 1), key="tl_steps",
                                           format_func=lambda p: f"#{label[p]}")
        else:
            first = last = 0
        start, end = step_range_ms(rank, first, last)
    elif mode == "Time range" and window_ms >= 0.002:  # a slider needs two distinct ms values
        default_end = min(window_ms, max(window_ms / 20, 1.0))
        start, end = st.slider("ms from the window start", 0.0, round(window_ms, 3), (0.0, round(default_end, 3)),
                               step=max(round(window_ms / 2000, 3), 0.001), key="tl_range")
    view = timeline_view(rank, start, end)
    merged = (f"; {view.merged_spans:,} spans shorter than a pixel ({view.resolution_ms * 1000:,.1f} µs) are merged into "
              "blocks that say how many they hold: narrow the range to see them one by one") if view.merged_spans else ""
    kernels = f" ({view.kernels:,} kernels, {view.kernels_drawn:,} drawn one by one)" if view.kernels else ""
    st.caption(f"{view.start_ms:,.3f}–{view.end_ms:,.3f} ms from the window start: {view.total_spans:,} spans{kernels}{merged}. "
               "Drag to pan, scroll to zoom; hover a launch or a kernel to see the other end.")
    open_in_perfetto(analysis, entry["rank"])
    if view.spans.empty:
        st.info("No spans in this range.")
        return
    hover = alt.selection_point(fields=["link_id"], on="pointerover", empty=False, clear="pointerout")
    y = alt.Y("row:N", sort=view.rows, title=None, axis=alt.Axis(labelLimit=260, labelOverlap=False))
    x = alt.X("start_ms:Q", title="ms from the window start", scale=alt.Scale(domain=[view.start_ms, view.end_ms], nice=False))
    bars = alt.Chart(view.spans).mark_bar(clip=True).encode(
        x=x, x2="end_ms:Q", y=y,
        color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=list(KIND_COLOURS), range=list(KIND_COLOURS.values())),
                        legend=alt.Legend(orient="top", columns=10)),
        stroke=alt.condition(hover, alt.value("#000000"), alt.value(None)),
        strokeWidth=alt.condition(hover, alt.value(2), alt.value(0)),
        tooltip=[alt.Tooltip("name:N", title="name"), alt.Tooltip("kind:N", title="kind"),
                 alt.Tooltip("start_ms:Q", title="start (ms)", format=",.3f"),
                 alt.Tooltip("dur_ms:Q", title="duration (ms)", format=",.4f"),
                 alt.Tooltip("spans:Q", title="spans"), alt.Tooltip("link:N", title="launch")],
    ).add_params(hover)
    labels = alt.Chart(view.steps.assign(row="steps", label="step " + view.steps["step"].astype(str))).mark_text(
        align="left", dx=3, fontSize=11, clip=True).encode(x=alt.X("start_ms:Q"), y=y, text="label:N")
    zoom = alt.selection_interval(bind="scales", encodings=["x"])
    chart = alt.layer(bars, labels).add_params(zoom).properties(height=ROW_PX * len(view.rows) + 110).configure_scale(
        bandPaddingInner=0.15)
    st.altair_chart(chart, width="stretch")
