"""Telemetry: the GPU counters the capture sampled through NVML (utilisation, memory, clocks, power, PCIe)."""

import altair as alt

from kinetoscope.app import state
from kinetoscope.app.ui import st
from kinetoscope.render.format import number


def render() -> None:
    _, entry, results = state.page("Telemetry")
    if not entry.get("telemetry") or "telemetry" not in results:
        st.info("No telemetry in this trace: kinetoscope capture samples GPU utilisation, memory, clocks, power and "
                "PCIe through NVML on machines with an NVIDIA GPU (unless --no-telemetry).")
        st.stop()
    rows = results["telemetry"].tables["telemetry"]
    for track, group in rows.groupby("name", observed=True, sort=True):
        st.subheader(str(track))
        stats = entry["telemetry"][str(track)]
        series_names = sorted(group["series"].astype(str).unique())
        cols = st.columns(min(4, len(series_names)) or 1)
        for i, name in enumerate(series_names):
            one = group[group["series"].astype(str) == name]
            unit = str(one["unit"].iloc[0])
            factor = float(one["shown"].iloc[0] / one["value"].iloc[0]) if one["value"].iloc[0] else 1.0
            s = stats[name]
            cols[i % len(cols)].metric(f"{name} (mean)", f"{s['mean'] * factor:,.1f} {unit}".strip(),
                                       help=f"min {s['min'] * factor:,.1f}, max {s['max'] * factor:,.1f} {unit}, "
                                            f"{s['samples']} samples in the window")
        chart = alt.Chart(group.assign(series=group["series"].astype(str))).mark_line().encode(
            x=alt.X("t_ms:Q", title="time from the window start (ms)"),
            y=alt.Y("shown:Q", title=None),
            row=alt.Row("series:N", title=None),
            tooltip=["series", alt.Tooltip("t_ms:Q", format=",.1f"), alt.Tooltip("shown:Q", format=",.1f"), "unit"],
        ).properties(height=90).resolve_scale(y="independent")
        st.altair_chart(chart, width="stretch", description=f"{track} over the window: " + "; ".join(
            f"{n}: min {number(stats[n]['min'])}, mean {number(stats[n]['mean'])}, max {number(stats[n]['max'])}"
            for n in series_names))
