"""Timeline: GPU streams and host threads (a row per nesting depth) over a range, in ms from the window start;
spans under a pixel merged, each block drawn as dark as the time it holds (analyze.views.timeline_view). Zooming
is dragging across the chart: the range is read again at its own resolution, never the coarse blocks stretched.
The full trace in Perfetto."""

import altair as alt

from kinetoscope.analyze.model.results import CriticalPathSummary
from kinetoscope.analyze.views.spans import KIND_COLOURS, step_range_ms, timeline_view
from kinetoscope.app import state
from kinetoscope.app.perfetto import open_in_perfetto
from kinetoscope.app.ui import md, st
from kinetoscope.render.format import number

#: pixels per row; the chart's height also holds the legend and the axis (~110 px)
ROW_PX = 20
#: the range chosen by dragging across the chart: (start_ms, end_ms), over whatever the controls chose
ZOOM = "tl_zoom"
#: the zooms before the current one (Zoom out goes back one)
ZOOMS = "tl_zooms"
#: a drag narrower than this (ms) is a click, not a range
MIN_ZOOM_MS = 1e-6


def _reset_zoom() -> None:
    st.session_state.pop(ZOOM, None)
    st.session_state.pop(ZOOMS, None)


def _zoom_out() -> None:
    previous = st.session_state.get(ZOOMS) or []
    if previous:
        st.session_state[ZOOM] = previous.pop()
    else:
        st.session_state.pop(ZOOM, None)


def _share(fraction: float) -> str:
    return f"{fraction:.0%}"


def render() -> None:
    analysis, entry, _ = state.page("Timeline")
    rank = analysis.trace.rank(entry["rank"])
    window_ms = float(entry.get("window_us") or 0.0) / 1000.0
    steps = rank.steps
    positions = list(range(len(steps)))
    mode = st.radio("Range", ["Steps", "Time range", "Whole window"] if positions else ["Time range", "Whole window"],
                    horizontal=True, key="tl_mode", on_change=_reset_zoom)
    start = end = None
    if mode == "Steps":
        if len(positions) > 1:
            label = dict(zip(positions, steps["step"].astype(int), strict=False))
            first, last = st.select_slider("Steps", options=positions, value=(0, 1), key="tl_steps",
                                           format_func=lambda p: f"#{label[p]}", on_change=_reset_zoom)
        else:
            first = last = 0
        start, end = step_range_ms(rank, first, last)
    elif mode == "Time range" and window_ms >= 0.002:  # a slider needs two distinct ms values
        default_end = min(window_ms, max(window_ms / 20, 1.0))
        start, end = st.slider("ms from the window start", 0.0, round(window_ms, 3), (0.0, round(default_end, 3)),
                               step=max(round(window_ms / 2000, 3), 0.001), key="tl_range", on_change=_reset_zoom)
    zoom = st.session_state.get(ZOOM)
    if zoom is not None:
        start, end = zoom
    path = state.rank_result(analysis, entry, CriticalPathSummary)
    with_path = path is not None and st.checkbox(
        "Critical path", value=True, key="tl_path",
        help="the chain of host work, launches, GPU work and waits that ends each step (a row under the steps)")
    view = timeline_view(rank, start, end, with_path=with_path)
    if with_path and path is not None:
        top = sorted(path.by_kind, key=lambda k: -k.step_fraction)[:5]
        kinds = ", ".join(f"{k.kind} {_share(k.step_fraction)}" for k in top)
        slack = ", ".join(f"{who} {number(us / 1000.0)} ms" for who, us in (("GPU", path.gpu_slack_us),
                                                                              ("host", path.host_slack_us))
                          if us is not None)
        st.caption(md("Critical path of the mean step: {}. Slack beside it (median step): {}.", kinds,
                      slack or "unknown"))
    merged = (md("; {:,} spans shorter than a pixel ({} ms) are merged into blocks drawn as dark as the share of the "
                 "block they run (a block half busy is half transparent)", view.merged_spans,
                 number(view.resolution_ms)) if view.merged_spans else md(""))
    kernels = md(" ({:,} kernels, {:,} drawn one by one)", view.kernels, view.kernels_drawn) if view.kernels else md("")
    st.caption(md("{:,.3f}–{:,.3f} ms from the window start: {:,} spans{}{}. Drag across the chart to zoom in: the "
                  "range is read again at its own resolution. Hover a launch or a kernel to see the other end.",
                  view.start_ms, view.end_ms, view.total_spans, kernels, merged))
    if zoom is not None:
        cols = st.columns([1, 1, 4])
        cols[0].button("Zoom out", key="tl_zoom_out", on_click=_zoom_out,
                       help="back to the range before the last zoom")
        cols[1].button("Reset zoom", key="tl_zoom_reset", on_click=_reset_zoom,
                       help="back to the range the controls above choose")
    open_in_perfetto(analysis, entry["rank"])
    if view.spans.empty:
        st.info("No spans in this range.")
        return
    hover = alt.selection_point(fields=["link_id"], on="pointerover", empty=False, clear="pointerout")
    brush = alt.selection_interval(name="zoom", encodings=["x"], empty=False)
    y = alt.Y("row:N", sort=view.rows, title=None, axis=alt.Axis(labelLimit=260, labelOverlap=False))
    x = alt.X(
        "start_ms:Q", title="ms from the window start", scale=alt.Scale(domain=[view.start_ms, view.end_ms], nice=False)
    )
    bars = (
        alt.Chart(view.spans)
        .mark_bar(clip=True)
        .encode(
            x=x,
            x2="end_ms:Q",
            y=y,
            color=alt.Color(
                "kind:N",
                title=None,
                scale=alt.Scale(domain=list(KIND_COLOURS), range=list(KIND_COLOURS.values())),
                legend=alt.Legend(orient="top", columns=5),
            ),
            # a block is as dark as the share of it its spans run: a GPU 63% idle never reads as solid busy
            opacity=alt.Opacity("busy_fraction:Q", scale=alt.Scale(domain=[0, 1], range=[0, 1]), legend=None),
            stroke=alt.condition(hover, alt.value("#000000"), alt.value(None)),
            strokeWidth=alt.condition(hover, alt.value(2), alt.value(0)),
            tooltip=[
                alt.Tooltip("name:N", title="name"),
                alt.Tooltip("kind:N", title="kind"),
                alt.Tooltip("start_ms:Q", title="start (ms)", format=",.3f"),
                alt.Tooltip("dur_ms:Q", title="running (ms)", format=",.4f"),
                alt.Tooltip("busy_fraction:Q", title="share of the block running", format=".0%"),
                alt.Tooltip("spans:Q", title="spans"),
                alt.Tooltip("link:N", title="launch"),
            ],
        )
        .add_params(hover, brush)
    )
    labels = alt.Chart(view.steps.assign(row="steps", label="step " + view.steps["step"].astype(str))).mark_text(
        align="left", dx=3, fontSize=11, clip=True).encode(x=alt.X("start_ms:Q"), y=y, text="label:N")
    chart = alt.layer(bars, labels).properties(height=ROW_PX * len(view.rows) + 110).configure_scale(
        bandPaddingInner=0.15)
    event = st.altair_chart(chart, width="stretch", on_select="rerun", selection_mode=["zoom"],
                            description=(f"Timeline of {number(view.start_ms)} to {number(view.end_ms)} ms from the "
                                         f"window start: {view.total_spans:,} spans in {len(view.rows)} rows "
                                         f"({', '.join(view.rows[:12])}{', …' if len(view.rows) > 12 else ''}); "
                                         f"{view.kernels:,} kernels; steps " + ", ".join(
                                             str(s) for s in view.steps['step'].head(20))),
                            key=f"tl_chart_{entry['rank']}_{view.start_ms}_{view.end_ms}")
    chosen = ((event or {}).get("selection") or {}).get("zoom") or {}
    picked = chosen.get("start_ms")
    if picked and len(picked) == 2:
        lo, hi = max(min(picked), view.start_ms), min(max(picked), view.end_ms)
        if hi - lo > MIN_ZOOM_MS:
            if zoom is not None:
                st.session_state.setdefault(ZOOMS, []).append(zoom)
            st.session_state[ZOOM] = (float(lo), float(hi))
            st.rerun()
