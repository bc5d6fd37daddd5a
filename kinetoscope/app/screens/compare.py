"""Compare: this trace against another — what got faster or slower, which findings changed, and for each
finding gone, the step time its fix was predicted to give beside the one measured."""

import os

from kinetoscope.app.ui import md, st

from kinetoscope.analyze.compare import compare_reports, finding_changes, fix_check
from kinetoscope.app import data, state
from kinetoscope.app.cache import analyse, store_choices
from kinetoscope.app.launch import PATHS_ENV
from kinetoscope.app.screens.fleet import STORE_KEY
from kinetoscope.render.format import compare_display


def _choices() -> list[data.Choice]:
    """The session's other uploaded runs, the batch store's jobs, the paths given to ``kinetoscope app``, then the
    bundled samples."""
    given = [p for p in os.environ.get(PATHS_ENV, "").split(os.pathsep) if p]
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
    st.caption(f"Rank {rank} of the current trace (the rank chosen in the sidebar) against rank "
               f"{rank if rank in before_ranks else before_ranks[0]} of {other_label}.")
    table = compare_reports(before.report, analysis.report, rank=rank)
    st.dataframe(compare_display(table), hide_index=True, width="stretch")
    st.subheader("Findings")
    st.dataframe(finding_changes(before.report, analysis.report), hide_index=True, width="stretch")
    fixes = fix_check(before.trace, before.report, analysis.report)
    if len(fixes):
        st.subheader("Findings gone: predicted and measured")
        st.caption("The mean step its fix was predicted to give (the before run's estimate) beside the mean step "
                   "measured in the after run.")
        shown = fixes.assign(before_ms=fixes["before_step_us"] / 1000, predicted_ms=fixes["predicted_step_us"] / 1000,
                             measured_ms=fixes["measured_step_us"] / 1000)
        shown = shown[["id", "rank", "before_ms", "predicted_ms", "measured_ms", "predicted_change", "measured_change",
                       "error", "method"]]
        pct = lambda v: "n/a" if v is None or v != v else f"{v:+.1%}"  # noqa: E731
        ms = lambda v: "n/a" if v is None or v != v else f"{v:,.2f} ms"  # noqa: E731
        st.dataframe(shown, formats={"before_ms": ms, "predicted_ms": ms, "measured_ms": ms,
                                     "predicted_change": pct, "measured_change": pct, "error": pct}, width="stretch")
