"""Export: the JSON report, CSV tables, and the way to Perfetto."""

from kinetoscope.app.ui import download, md, redacted_csv, redacted_json, st

from kinetoscope.analyze.loader import read_bytes
from kinetoscope.analyze.redact import redacted_trace
from kinetoscope.app import state
from kinetoscope.app.data import app_limits, job_file
from kinetoscope.app.perfetto import open_in_perfetto
from kinetoscope.errors import KinetoscopeError
from kinetoscope.render.json import report_to_json


def render() -> None:
    analysis = state.current()
    report = analysis.report
    st.header("Export")
    st.download_button("JSON report", download(redacted_json(report_to_json(report, indent=2))),
                       file_name="kinetoscope-report.json", mime="application/json", key="dl_json")
    tables = {f"rank {rank} · {key} · {name}": table
              for rank, results in report.results.items() for key, res in results.items() for name, table in res.tables.items()
              if len(table)}
    if tables:
        choice = st.selectbox("Table", list(tables), key="dl_table")
        st.download_button("CSV", download(redacted_csv(tables[choice])),
                           file_name=f"{choice.replace(' · ', '-').replace(' ', '_')}.csv", mime="text/csv", key="dl_csv")
    st.subheader("Open in Perfetto")
    entry = state.rank_entry(analysis)
    open_in_perfetto(analysis, entry["rank"])
    st.markdown(md("Or download a file below, open [ui.perfetto.dev](https://ui.perfetto.dev), choose *Open trace file* "
                   "and pick it (it reads Kineto JSON and gzip directly, in your browser)."))
    st.caption("The trace files are prepared with secret-looking values (tokens, keys, passwords, credentials in "
               "URLs) redacted in the metadata and in every event's arguments.")
    # prepared only when asked, with the app's size limits: not re-read on every rerun of the page; from this
    # session's own files (the analysis may be cached from another session whose upload is gone)
    job = st.session_state.get(state.JOB)
    for rank, file_name in analysis.rank_files:
        path = job_file(job, file_name)
        name = file_name[:-3] if file_name.endswith(".gz") else file_name
        if path is None:
            st.info(f"{file_name} is no longer on the server (the upload was removed when its session ended): "
                    "upload it again to download it.")
            continue
        if not st.button(f"Prepare redacted {name}", key=f"prep_trace_{rank}"):
            continue
        try:
            data = redacted_trace(read_bytes(path, app_limits()))
        except KinetoscopeError as exc:
            st.error(f"{name}: {getattr(exc, 'reason', exc)}")
            continue
        st.download_button(f"Download {name}", download(data), file_name=name, mime="application/json",
                           key=f"dl_trace_{rank}")
