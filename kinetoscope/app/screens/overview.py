"""Overview: the findings, ranked, and the headline numbers."""

from kinetoscope.analyze.ingest.loader import read_bytes
from kinetoscope.analyze.model.findings import SEVERITY_ORDER
from kinetoscope.analyze.model.results import EfficiencyResult
from kinetoscope.analyze.report.savings import all_together, shared_savings
from kinetoscope.analyze.views.gpuinfo import device_summary, kernel_launches, occupancy_summary
from kinetoscope.app import state
from kinetoscope.app.data import app_limits, job_file
from kinetoscope.app.ui import bullets, md, st
from kinetoscope.errors import KinetoscopeError
from kinetoscope.render.format import evidence_lines, number, worth

#: the session's shared-savings view of the current analysis (one replay per pair of findings: kept)
_SHARED = "overview_shared_savings"


def _severity(name: str):
    order = SEVERITY_ORDER.get(name, len(SEVERITY_ORDER))
    return md(":red[**{}**]", name.upper()) if order == 0 else md(":orange[**{}**]", name.upper()) if order == 1 \
        else md(":blue[{}]", name)


def _shared(analysis) -> tuple[dict[int, tuple[list[int], dict]], dict]:
    """Which findings share a saving (and what fixing each group is worth), and every rank's fixes together: one
    replay per pair of findings, kept for the session with the analysis."""
    key = id(analysis.report)
    got = st.session_state.get(_SHARED)
    if got is None or got[0] != key:
        groups = {}
        for g in shared_savings(analysis.trace, analysis.report):
            for i in g.findings:
                groups[i] = ([j for j in g.findings if j != i], g.together)
        together = {r["rank"]: all_together(analysis.trace, analysis.report, r["rank"]) for r in analysis.report.ranks}
        got = (key, groups, together)
        st.session_state[_SHARED] = got
    return got[1], got[2]


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

    cols = st.columns(3)
    steps = entry.get("steps") or {}
    cols[0].metric("Mean step", state.ms(steps.get("mean_us")), help=f"{steps.get('count', 0)} profiled steps")
    gpu = entry.get("gpu")
    idle = ("no GPU" if not gpu else "not judged" if gpu["idle_fraction"] is None else state.pct(gpu["idle_fraction"]))
    cols[1].metric(
        "GPU idle",
        idle,
        help="fraction of the window no stream was busy; 'not judged' where the trace misses "
        "GPU activity (a finding says why)",
    )
    loader = entry.get("loader") or {}
    cols[2].metric(
        "Data loading", state.pct(loader.get("fraction")), help="time in next(DataLoader), fraction of the window"
    )
    cols = st.columns(3)
    h2d = entry.get("h2d")
    cols[0].metric(
        "H2D overlapped",
        state.pct(h2d["overlap_fraction"]) if h2d else "no copies",
        help="copy time with a kernel on another stream",
    )
    mem = entry.get("memory")
    cols[1].metric("Memory growth / step", state.mib(mem["growth_bytes_per_step"]) if mem else "n/a",
                   help="robust (Theil-Sen) slope of allocated memory at step ends")
    groups, together = _shared(analysis)
    every = together.get(entry["rank"])
    cols[2].metric("All fixes together", f"{state.ms(every['saving_us_per_step'])} / step" if every else "n/a",
                   help=md("one what-if replay of every fix of rank {} at once: savings do not simply add up",
                           entry["rank"]))

    effs = state.rank_result(analysis, entry, EfficiencyResult)
    eff = effs.efficiency if effs is not None else None
    cols = st.columns(3)
    cols[0].metric("MFU", state.pct(eff.mfu) if eff is not None and eff.mfu is not None else "n/a",
                   help=md("matrix-op FLOPs per step over step time x the device's peak ({}); n/a without recorded "
                           "shapes, steps or a known peak", (eff.device if eff is not None else None) or "no device"))
    _gpu_summary(analysis, entry["rank"])
    st.subheader(f"Findings ({len(report.findings)})")
    if not report.findings:
        st.success(
            "No problems found: no loader stalls, idle GPU, copy, sync, memory, loop-hygiene or straggler findings."
        )
    for i, f in enumerate(report.findings):
        with st.container(border=True):
            st.markdown(md("{} · rank {} · {}", _severity(f.severity), f.rank, f.title))
            st.markdown(md("**What to do:** {}", f.recommendation))
            line = worth(f.estimate, f.worth)
            if line:
                st.markdown(md("**{}**", line[0].upper() + line[1:]))
                if i in groups:
                    others, est = groups[i]
                    st.markdown(md("Shares this saving with: {}. Fixing them together: ~{} per step faster, not the "
                                   "sum.", "; ".join(f"rank {report.findings[j].rank}: {report.findings[j].title}"
                                                     for j in others), state.ms(est.get("saving_us_per_step"))))
                if f.estimate and f.estimate.get("assumptions"):
                    st.caption("assuming: " + "; ".join(f.estimate["assumptions"]))
            with st.expander("Evidence", expanded=False):
                st.markdown(bullets(evidence_lines(f.evidence)))
                st.caption(md("finding id `{}` · measured cost {} in the window", f.id, state.ms(f.impact_us)))
    for w in entry.get("warnings") or []:
        st.caption(f"note: {w}")
    for failure in report.failures:
        st.error(f"The {failure.analyzer} analysis failed on rank {failure.rank}: {failure.error}")


_OCCUPANCY = "overview_occupancy"


def _gpu_summary(analysis, rank: int) -> None:
    """Each GPU of the rank: what it is, and how its kernel time is spent (Tensor Cores, occupancy on request)."""
    devices = device_summary(analysis.trace.rank(rank))
    if devices.empty:
        return
    st.subheader("GPU")
    used = devices[devices["kernels"] > 0]
    if len(used) < len(devices):
        st.caption(md("The trace lists {} GPU(s); {} ran no kernel in the window.", len(devices),
                      len(devices) - len(used)))
    for d in used.to_dict("records"):
        def known(v: object) -> bool:  # a table's missing value is None or NaN (a float): not known
            return v is not None and v == v and v != "" and v != 0

        facts = [str(d["name"]) if known(d["name"]) else "name not recorded",
                 f"{d['memory_bytes'] / 2**30:,.1f} GiB" if known(d["memory_bytes"]) else "memory not recorded",
                 f"compute capability {d['compute_capability']}" if known(d["compute_capability"]) else None,
                 f"{int(d['sms'])} SMs" if known(d["sms"]) else None]
        share = d["tensor_core_fraction_of_kernel_time"]
        tc = (
            "no kernels in the window"
            if share is None or share != share
            else f"Tensor Cores (matrix cores on AMD) in {state.pct(share)} of kernel time "
            f"({number(d['tensor_core_ms'])} of "
            f"{number(d['kernel_ms'])} ms, kernels whose names say so)"
        )
        st.markdown(md("**GPU {}**: {} · {}", d["device"], " · ".join(f for f in facts if f), tc))
    key = (id(analysis.report), rank)
    got = st.session_state.get(_OCCUPANCY)
    if got is None or got[0] != key:
        name = dict(analysis.rank_files).get(rank)
        path = job_file(st.session_state.get(state.JOB), name) if name else None
        if path is None or not st.button("Estimate occupancy", key="overview_occupancy_button",
                                         help="reads the trace file again for each kernel's grid, block, registers "
                                              "and shared memory"):
            return
        try:
            got = (key, occupancy_summary(kernel_launches(read_bytes(path, app_limits()), analysis.trace.rank(rank))))
        except KinetoscopeError as exc:
            st.error(md("{}: {}", name, getattr(exc, "reason", exc)))
            return
        st.session_state[_OCCUPANCY] = got
    for o in got[1].to_dict("records"):
        if not o["kernels_estimated"]:
            st.caption(
                md(
                    "GPU {}: the trace records no launch parameters (grid, block, registers) for its {:,} kernels: "
                    "occupancy cannot be estimated.",
                    o["device"],
                    o["kernels"],
                )
            )
            continue
        st.markdown(md("**GPU {}**: estimated achieved occupancy {}, {} blocks per SM (means weighted by kernel time "
                       "over {:,} of {:,} kernels)", o["device"], state.pct(o["est_achieved_occupancy_fraction"]),
                       number(o["blocks_per_sm"]) if o["blocks_per_sm"] is not None else "n/a",
                       o["kernels_estimated"], o["kernels"]))
