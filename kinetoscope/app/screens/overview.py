"""Overview: the findings, ranked, and the headline numbers."""

from kinetoscope.app.ui import bullets, md, st

from kinetoscope.app import state
from kinetoscope.render.format import evidence_lines, worth

SEVERITY = {"critical": md(":red[**CRITICAL**]"), "warning": md(":orange[**WARNING**]"), "info": md(":blue[info]")}


def render() -> None:
    analysis = state.current()
    report = analysis.report
    entry = state.rank_entry(analysis)
    st.title("Kinetoscope")
    n = len(report.ranks)
    where = (f"headline numbers: rank {entry['rank']} of {n} (the rank with the most severe finding first; "
             "change it in the sidebar)" if n > 1 else "1 rank")
    st.caption(f"{analysis.label} · {where} · window {state.ms(entry.get('window_us'))}: "
               f"{entry['window']['description']}")

    cols = st.columns(5)
    steps = entry.get("steps") or {}
    cols[0].metric("Mean step", state.ms(steps.get("mean_us")), help=f"{steps.get('count', 0)} profiled steps")
    gpu = entry.get("gpu")
    idle = ("no GPU" if not gpu else "not judged" if gpu["idle_fraction"] is None else state.pct(gpu["idle_fraction"]))
    cols[1].metric("GPU idle", idle, help="fraction of the window no stream was busy; 'not judged' where the trace misses "
                   "GPU activity (see the gpu_activity_missing finding)")
    loader = entry.get("loader") or {}
    cols[2].metric("Data loading", state.pct(loader.get("fraction")), help="time in next(DataLoader), fraction of the window")
    h2d = entry.get("h2d")
    cols[3].metric("H2D overlapped", state.pct(h2d["overlap_fraction"]) if h2d else "no copies", help="copy time with a kernel on another stream")
    mem = entry.get("memory")
    cols[4].metric("Memory growth / step", state.mib(mem["growth_bytes_per_step"]) if mem else "n/a",
                   help="robust (Theil-Sen) slope of allocated memory at step ends")

    st.subheader(f"Findings ({len(report.findings)})")
    if not report.findings:
        st.success("No problems found: no loader stalls, idle GPU, copy, sync, memory, loop-hygiene or straggler findings.")
    for f in report.findings:
        with st.container(border=True):
            st.markdown(md("{} · rank {} · {}", SEVERITY.get(f.severity, f.severity), f.rank, f.title))
            st.markdown(md("**What to do:** {}", f.recommendation))
            line = worth(f.estimate)
            if line:
                st.markdown(md("**{}**", line[0].upper() + line[1:]))
                if f.estimate and f.estimate.get("assumptions"):
                    st.caption("assuming: " + "; ".join(f.estimate["assumptions"]))
            with st.expander("Evidence", expanded=False):
                st.markdown(bullets(evidence_lines(f.evidence)))
                st.caption(md("finding id `{}` · measured cost {} in the window", f.id, state.ms(f.impact_us)))
    for w in entry.get("warnings") or []:
        st.caption(f"note: {w}")
    for failure in report.failures:
        st.error(f"The {failure.analyzer} analysis failed on rank {failure.rank}: {failure.error}")
