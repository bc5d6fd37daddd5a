"""Step breakdown: where each step's time goes, on the host and on the GPU."""

import altair as alt
import pandas as pd

from kinetoscope.app import state
from kinetoscope.app.ui import md, st
from kinetoscope.render.format import display_table, listing, series_label

#: host phases in fixed colours, the same on every trace
PHASE_COLOURS = {"data wait": "#ff9da6", "h2d": "#f58518", "forward": "#4c78a8", "backward": "#72b7b2",
                 "optimizer": "#54a24b", "zero grad": "#eeca3b", "sync": "#e45756", "other": "#bab0ac"}


def _stacked(frame: pd.DataFrame, columns: list[str], title: str, colours: dict[str, str] | None = None) -> None:
    long = frame.reset_index().melt(id_vars=["step"], value_vars=columns, var_name="part", value_name="us")
    long = long.assign(part=long["part"].map(series_label), ms=long["us"] / 1000)
    domain = [p for p in (colours or {}) if p in set(long["part"])] or sorted(set(long["part"]))
    long["order"] = long["part"].map({p: i for i, p in enumerate(domain)})
    colour = alt.Color("part:N", title=None, scale=alt.Scale(domain=domain, range=[colours[p] for p in domain])
                       if colours else alt.Undefined, legend=alt.Legend(orient="bottom", columns=4))
    chart = alt.Chart(long).mark_bar().encode(
        x=alt.X("step:O", title="step"), y=alt.Y("ms:Q", title=title), color=colour,
        order=alt.Order("order:Q"), tooltip=["step", "part", alt.Tooltip("ms:Q", format=",.3f", title="ms")])
    per_step = long.groupby("step", sort=True)
    st.altair_chart(chart, width="stretch", description=f"{title} per step, by part: " + "; ".join(
        f"step {s}: " + listing(zip(g["part"], g["ms"], strict=False)) for s, g in list(per_step)[:12])
        + (f"; … ({per_step.ngroups} steps in all)" if per_step.ngroups > 12 else ""))


def render() -> None:
    _, entry, results = state.page("Step breakdown")
    anatomy = results.get("phases")
    if anatomy is None or anatomy.tables["phases_per_step"].empty:
        st.markdown("No steps to break down.")
        st.stop()
    per_step = anatomy.tables["phases_per_step"].set_index("step")
    phase_cols = [c for c in per_step.columns if c.endswith("_us") and c != "step_us"]
    st.markdown(md("**Host (training thread)** — every moment of each step in exactly one phase"))
    _stacked(per_step, phase_cols, "ms", PHASE_COLOURS)
    gpu = results.get("gpu")
    if gpu is not None and "gpu_per_step" in gpu.tables and len(gpu.tables["gpu_per_step"]):
        st.markdown(md("**GPU** — busy (union of all streams) and idle per step"))
        g = gpu.tables["gpu_per_step"]
        for device, rows in g.groupby("device"):
            _stacked(rows.set_index("step"), ["busy_us", "idle_us"], f"GPU {device}, ms",
                     {"busy": "#4c78a8", "idle": "#e45756"})
    st.markdown(md("**Phases over the window**"))
    phases = pd.DataFrame(entry["phases"]).T
    table, formats = display_table(phases.reset_index(names="phase"))
    st.dataframe(table, formats=formats, width="stretch")
    loader = results.get("loader")
    if loader is not None and len(loader.tables["loader_per_step"]):
        st.markdown(md("**Data loading per step**"))
        table, formats = display_table(loader.tables["loader_per_step"])
        st.dataframe(table, formats=formats, width="stretch")
