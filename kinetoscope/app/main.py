"""The Kinetoscope Streamlit app: pick or upload traces, see what is wrong and why.

Run with ``kinetoscope app [PATH ...]``. This module only lays out results; every
number comes from ``kinetoscope.analyze`` (renderers never compute).
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd
import streamlit as st

from kinetoscope.analyze.loader import Job
from kinetoscope.analyze.report import Report
from kinetoscope.app import data
from kinetoscope.app.launch import PATHS_ENV
from kinetoscope.errors import KinetoscopeError

SEVERITY_LABEL = {"critical": ":red[**CRITICAL**]", "warning": ":orange[**WARNING**]", "info": ":blue[info]"}


@st.cache_resource(show_spinner="Analysing trace…", max_entries=16)
def cached_report(job: Job) -> Report:
    return data.analyse(job)


def _fmt_ms(us: Any) -> str:
    return "n/a" if us is None else f"{us / 1000:,.2f} ms"


def _fmt_pct(x: Any) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def pick_job() -> Job | None:
    st.sidebar.header("Trace")
    given = [p for p in os.environ.get(PATHS_ENV, "").split(os.pathsep) if p]
    choices = data.path_choices(given) if given else data.sample_choices()
    source = st.sidebar.radio("Source", ["Bundled / given traces", "Upload"], index=0, key="source")
    if source == "Upload":
        files = st.sidebar.file_uploader(
            "Kineto trace files (.json / .json.gz); several files = the ranks of one job",
            type=["json", "gz"], accept_multiple_files=True, key="upload",
        )
        if not files:
            st.info("Upload one trace, or all rank files of one job, to analyse them.")
            return None
        folder = data.save_uploads([(f.name, f.getvalue()) for f in files])
        (job,) = data.find_jobs(folder)[:1]
        return Job(", ".join(f.name for f in files), job.files)
    if not choices:
        st.warning("No traces found. Upload one, or start the app with paths: kinetoscope app PATH")
        return None
    labels = [c.label for c in choices]
    default = next((i for i, c in enumerate(choices) if "v100_resnet50" in c.label), 0)
    label = st.sidebar.selectbox("Trace", labels, index=default, key="trace")
    return choices[labels.index(label)].job


def show_findings(report: Report) -> None:
    st.subheader(f"Findings ({len(report.findings)})")
    if not report.findings:
        st.success("No problems found: no loader stalls, idle GPU, copy, sync, memory or straggler findings.")
    for f in report.findings:
        with st.expander(f"{SEVERITY_LABEL[f.severity]} · rank {f.rank} · {f.title}", expanded=f.severity == "critical"):
            st.markdown(f"**Fix:** {f.recommendation}")
            st.caption(f"id `{f.id}`")
            st.json(f.evidence, expanded=False)


def show_rank(report: Report, entry: dict[str, Any]) -> None:
    rank = entry["rank"]
    results = report.results.get(rank, {})
    cols = st.columns(4)
    cols[0].metric("Window", _fmt_ms(entry.get("window_us")), help=entry.get("window", {}).get("description"))
    steps = entry.get("steps") or {}
    cols[1].metric("Steps", steps.get("count", 0), help=f"mean {_fmt_ms(steps.get('mean_us'))}")
    loader = entry.get("loader") or {}
    cols[2].metric("Data loading", _fmt_pct(loader.get("fraction")), help="time in next(DataLoader), fraction of the window")
    gpu = entry.get("gpu")
    cols[3].metric("GPU idle", _fmt_pct(gpu["idle_fraction"]) if gpu else "no GPU", help="window minus the union of all streams' work")
    for w in entry.get("warnings") or []:
        st.caption(f"note: {w}")

    tabs = st.tabs(["Step anatomy", "Steps & loader", "GPU streams", "Copies", "Memory"])
    with tabs[0]:
        anatomy = results.get("phases")
        if anatomy is not None:
            table = anatomy.tables["phases_per_step"]
            phase_cols = [c for c in table.columns if c.endswith("_us") and c != "step_us"]
            st.bar_chart(table.set_index("step")[phase_cols], y_label="µs on the host", x_label="step")
            summary = pd.DataFrame(entry["phases"]).T
            st.dataframe(summary, use_container_width=True)
            st.caption("Host time of the training thread per phase (each µs counted once); GPU time by the phase that launched the work.")
    tabs = tabs[1:]
    with tabs[0]:
        per_step = results.get("loader").tables.get("loader_per_step") if "loader" in results else None
        if per_step is not None and len(per_step):
            st.bar_chart(per_step.set_index("step")[["loader_us"]].assign(other_us=per_step.set_index("step")["step_us"] - per_step.set_index("step")["loader_us"]),
                         y_label="µs", x_label="step")
            st.dataframe(per_step, hide_index=True, use_container_width=True)
        else:
            st.write("No ProfilerStep spans in this trace.")
        if loader.get("run"):
            st.caption(f"Whole run (host clocks): {loader['run']['steps']} steps, waiting for data {_fmt_pct(loader['run']['data_wait_fraction'])} of wall time.")
    with tabs[1]:
        if gpu:
            for d in gpu["devices"]:
                st.markdown(f"**GPU {d['device']}**: idle {_fmt_pct(d['idle_fraction'])} of the window")
                st.bar_chart(pd.Series(d["idle_by_cause_us"], name="idle µs"), y_label="µs")
            st.dataframe(results["gpu"].tables["streams"], hide_index=True, use_container_width=True)
            gaps = results["gpu"].tables["gaps"]
            if len(gaps):
                st.markdown("Largest gaps")
                st.dataframe(gaps.drop(columns=["start_ns"]), hide_index=True, use_container_width=True)
        else:
            st.write("No GPU activity in this trace.")
    with tabs[2]:
        for key, label in (("h2d", "Host → device"), ("d2h", "Device → host")):
            st.markdown(f"**{label}**")
            st.json(entry.get(key) or {"copies": None}, expanded=False)
        copies = results.get("copies")
        if copies is not None and "copies" in copies.tables:
            st.dataframe(copies.tables["copies"], hide_index=True, use_container_width=True)
    with tabs[3]:
        mem = entry.get("memory")
        if mem:
            table = results["memory"].tables["memory_per_step"]
            for device, g in table.groupby("device"):
                st.markdown(f"**{device}**")
                st.line_chart(g.set_index("step")[["allocated_bytes", "reserved_bytes"]], y_label="bytes")
            st.dataframe(pd.DataFrame(mem["devices"]), hide_index=True, use_container_width=True)
        else:
            st.write("No [memory] events (capture with profile_memory=True).")


def main() -> None:
    st.set_page_config(page_title="Kinetoscope", layout="wide")
    st.title("Kinetoscope")
    st.caption("Why is this training step slow? Loader stalls, idle CUDA streams, blocking copies, memory growth.")
    try:
        job = pick_job()
        if job is None:
            return
        report = cached_report(job)
    except KinetoscopeError as exc:
        st.error(str(exc))
        return
    st.markdown(f"**{report.source}** · {len(report.ranks)} rank(s)")
    show_findings(report)
    ranks = [r["rank"] for r in report.ranks]
    if len(ranks) > 1:
        chosen = st.selectbox("Rank", ranks, key="rank")
        entry = report.ranks[ranks.index(chosen)]
    else:
        entry = report.ranks[0]
    st.subheader(f"Rank {entry['rank']}")
    show_rank(report, entry)
    for failure in report.failures:
        st.error(f"Analyzer {failure.analyzer} failed on rank {failure.rank}: {failure.error}")


main()
