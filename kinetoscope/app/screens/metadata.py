"""Metadata: devices, versions, distributed info — secret-looking values redacted."""

from kinetoscope.analyze.ingest.redact import redact
from kinetoscope.app import state
from kinetoscope.app.ui import md, st


def render() -> None:
    analysis = state.current()
    entry = state.rank_entry(analysis)
    meta = analysis.trace.rank(entry["rank"]).meta
    st.title(f"Metadata · rank {entry['rank']}")
    st.markdown(
        md(
            "**File** {} · schema {} · {:,} events · loaded in {:.2f} s · rank from {}",
            meta.source,
            meta.schema_version if meta.schema_version is not None else "not stated",
            meta.n_events,
            meta.load_seconds,
            meta.rank_source,
        )
    )
    # st.json parses a string as JSON: what is absent is said in words, never handed to it
    for title, value, missing in (
            ("Devices", list(meta.device_properties), "The trace has no deviceProperties."),
            ("Distributed", meta.distributed_info, "The trace has no distributedInfo."),
            ("Capture (host CPUs, torch threads, DataLoader)", meta.capture,
             "No Kinetoscope capture manifest beside this trace."),
            ("Other trace metadata (secrets redacted)", meta.other, "No other metadata.")):
        st.subheader(title)
        if value:
            st.json(redact(value), expanded=False)
        else:
            st.caption(missing)
    if meta.unhandled_events:
        st.subheader("Events not analysed")
        st.json(meta.unhandled_events)
    for w in meta.warnings:
        st.caption(f"note: {w}")
