"""Compare: this trace against another — what got faster or slower, which findings changed, and for each
finding gone, the step time its fix was predicted to give beside the one measured."""

import os

from kinetoscope.analyze.report.compare import compare_reports, fix_check
from kinetoscope.analyze.views.compare import finding_sets, name_diffs, run_change
from kinetoscope.app import data, state
from kinetoscope.app.cache import analyse, store_choices
from kinetoscope.app.launch import PATHS_ENV, given_paths
from kinetoscope.app.screens.fleet import STORE_KEY
from kinetoscope.app.ui import md, st
from kinetoscope.render.format import compare_display, display_table


def _choices() -> list[data.Choice]:
    """The session's other uploaded runs, the batch store's jobs, the paths given to ``kinetoscope app``, then the
    bundled samples."""
    given = given_paths(os.environ.get(PATHS_ENV, ""))
    out: list[data.Choice] = list(st.session_state.get(state.UPLOAD_RUNS) or [])
    store = st.session_state.get(STORE_KEY)
    if store:
        out += store_choices(store)
        given = [p for p in given if p != store]
    for p in given:
        try:
            out += data.path_choices([p])
        except Exception:  # noqa: BLE001 - a store or a vanished path is simply not offered
            continue
    return out + data.sample_choices()


def render() -> None:
    analysis = state.current()
    st.title("Compare")
    choices = _choices()
    labels = [c.label for c in choices if c.label != analysis.label]
    if not labels:
        st.info("No other trace to compare with.")
        st.stop()
    other_label = st.selectbox("Compare the current trace (after) with (before)", labels, key="compare_with",
                               index=None, placeholder="choose the run before")
    if other_label is None:
        st.caption(f"The current trace, {analysis.label}, is the run after; choose the run before it.")
        st.stop()
    other = next(c for c in choices if c.label == other_label)
    before = analyse(data.content_key(other.job.files), other.label, other.job)
    if before is None:
        st.stop()
    rank = state.rank_entry(analysis)["rank"]
    before_ranks = [r["rank"] for r in before.report.ranks]
    # the time per step, run against run: the change with its 95% interval and the verdict it supports
    change = run_change(before.trace, analysis.trace)
    st.subheader("Time per step")
    if change["change"] is None:
        st.markdown("The runs' step times cannot be compared (no step or window in one of them).")
    else:
        interval = (md(" (95% interval {} to {})", f"{change['ci_low']:+.1%}", f"{change['ci_high']:+.1%}")
                    if change["ci_low"] is not None else md(" (no interval: one sample a run)"))
        said = {"slower": md("**slower**"), "faster": md("**faster**"),
                "no change": md("**no change** beyond the noise"), "unknown": md("**not judged**")}
        st.markdown(md("{} step {} → {}: {}{}: {}.", change["statistic"] or "the", state.ms(change["before_us"]),
                       state.ms(change["after_us"]), f"{change['change']:+.1%}", interval,
                       said.get(change["verdict"], change["verdict"])))
        st.caption(md("Before: {} steps ({}); after: {} steps ({}). A verdict needs the interval to exclude no change "
                      "and the change to pass what reruns of one job differ by.", change["before_steps"],
                      change["before_source"], change["after_steps"], change["after_source"]))
    st.subheader("Headline numbers")
    st.caption(md("Rank {} of the current trace (the rank chosen in the sidebar) against rank {} of {}; single numbers "
                  "of one window each: their changes carry no verdict (the time per step above does).", rank,
                  rank if rank in before_ranks else before_ranks[0], other_label))
    table = compare_display(compare_reports(before.report, analysis.report, rank=rank)).drop(columns=["verdict"])
    st.dataframe(table, width="stretch")
    st.subheader("Findings")
    st.caption("Matched by what they are and the ranks each run found them on (a rank number alone means little "
               "across jobs of different sizes).")
    sets = finding_sets(before.report, analysis.report)
    st.dataframe(sets[["status", "ranks_before", "ranks_after", "title", "ranks_of_the_job_before",
                       "ranks_of_the_job_after"]].rename(columns={
        "ranks_before": "ranks before", "ranks_after": "ranks after", "ranks_of_the_job_before": "job's ranks before",
        "ranks_of_the_job_after": "job's ranks after"}), width="stretch")
    for kinds, title in ((("kernel",), "GPU kernels"), (("cpu_op",), "Host operators")):
        diffs = name_diffs(before.trace, analysis.trace, kinds)
        if diffs.empty:
            continue
        st.subheader(f"{title} whose time per step changed most")
        shown, units = display_table(diffs)
        st.dataframe(shown, formats={c: "{:+,.3f}" if "change" in c else "{:,.3f}" for c in units}, pinned=("name",),
                     width="stretch")
    fixes = fix_check(before.trace, before.report, analysis.report)
    if len(fixes):
        st.subheader("Findings gone: predicted and measured")
        st.caption("The mean step its fix was predicted to give (the before run's estimate) beside the mean step "
                   "measured in the after run.")
        shown = fixes.assign(before_ms=fixes["before_step_us"] / 1000, predicted_ms=fixes["predicted_step_us"] / 1000,
                             measured_ms=fixes["measured_step_us"] / 1000)
        shown = shown[["id", "rank", "before_ms", "predicted_ms", "measured_ms", "predicted_change", "measured_change",
                       "error", "method"]]
        table, units = display_table(shown.rename(columns={"predicted_change": "predicted_change_fraction",
                                                           "measured_change": "measured_change_fraction",
                                                           "error": "error_fraction", "id": "finding"}))
        st.dataframe(table, formats={**units, **{c: "{:+.1%}" for c in table.columns if c.endswith("(%)")}},
                     width="stretch")
