"""Export: the JSON report, CSV tables, and the way to Perfetto."""

from kinetoscope.app import state
from kinetoscope.app.perfetto import gz_name, open_in_perfetto, prepared
from kinetoscope.app.ui import download, md, redacted_csv, redacted_json, st
from kinetoscope.render.json import report_to_json


def render() -> None:
    analysis = state.current()
    report = analysis.report
    st.title("Export")
    st.download_button("JSON report", download(redacted_json(report_to_json(report, indent=2))),
                       file_name="kinetoscope-report.json", mime="application/json", key="dl_json")
    tables = {
        f"rank {rank} · {key} · {name}": table
        for rank, results in report.results.items()
        for key, res in results.items()
        for name, table in res.tables.items()
        if len(table)
    }
    if tables:
        choice = st.selectbox("Table", list(tables), key="dl_table")
        st.download_button(
            "CSV",
            download(redacted_csv(tables[choice])),
            file_name=f"{choice.replace(' · ', '-').replace(' ', '_')}.csv",
            mime="text/csv",
            key="dl_csv",
        )
    st.subheader("Open in Perfetto")
    entry = state.rank_entry(analysis)
    open_in_perfetto(analysis, entry["rank"])
    st.subheader("The trace, redacted")
    st.markdown(
        md(
            "Each rank's trace file with secret-looking values (tokens, keys, passwords, credentials in URLs) "
            "redacted in the metadata and in every event's arguments, gzipped. To open one in Perfetto yourself: "
            "[ui.perfetto.dev](https://ui.perfetto.dev), *Open trace file* (it reads gzipped Kineto JSON in "
            "your browser)."
        )
    )
    for rank, file_name in analysis.rank_files:
        # prepared only when asked (not re-read on every rerun of the page), from this session's own files
        got = prepared(analysis, rank, f"Prepare the redacted {gz_name(file_name)}", "download")
        if isinstance(got, str):
            st.error(got)
        elif got is not None:
            name, data = got
            st.download_button(f"Download {name}", download(data), file_name=name, mime="application/gzip",
                               key=f"dl_trace_{rank}")
