"""Hang: a job that stopped moving, rank by rank, and the stuck ranks' stacks as text (computed in
analyze.views.hang). Shown in the navigation when the job has hang dumps (rank-<r>.hang.json)."""

from kinetoscope.analyze.views.hang import hang_view
from kinetoscope.app import state
from kinetoscope.app.data import Analysis
from kinetoscope.app.ui import md, st
from kinetoscope.render.format import rank_ranges

LABELS = {
    "rank": "rank", "part": "part", "stuck": "stuck", "at_seq_op": "op there", "at_seq_input_sizes": "sizes there",
    "at_seq_input_dtypes": "dtypes there", "at_seq_state": "state there", "last_entered_seq": "last entered #",
    "last_entered_op": "last entered op", "last_entered_input_sizes": "last entered sizes",
    "last_entered_input_dtypes": "last entered dtypes", "last_entered_state": "last entered state",
    "last_completed_seq": "last completed #", "last_completed_op": "last completed op",
    "dump_reason": "dump written on",
    "steps_ended": "steps ended", "seconds_since_progress_s": "since last step (s)", "where": "where",
}


def has_hang_dumps(analysis: Analysis | None) -> bool:
    return analysis is not None and bool(analysis.trace.hang_dumps)


def _ranks(ranks: list[int]) -> str:
    return rank_ranges(ranks) if ranks else "none"


def render() -> None:
    analysis = state.current()
    view = hang_view(analysis.trace, analysis.report)
    st.title("Hang")
    if view is None:
        st.info("This job has no hang dumps (rank-<r>.hang.json, written by kinetoscope capture when no step ends "
                "for --hang-timeout seconds, on SIGTERM, SIGUSR1 or an exception).")
        return
    h = view.headline
    if view.hung:
        st.error(md("{}", view.title))
        st.markdown(md("**What to do:** {}", view.recommendation))
    else:
        st.success(md("The {} dumps show every rank in step: no collective out of step, no rank that raised or "
                      "stalled (dumps on demand, SIGUSR1).", h["dumps"]))
    cols = st.columns(4)
    cols[0].metric("Collective", "n/a" if h["seq"] is None else f"#{h['seq']}",
                   help=md("the first sequence number of process group {} where the ranks disagree",
                           h["process_group"] if h["process_group"] is not None else "?"))
    cols[1].metric("Expected op", h["expected_op"] or "n/a",
                   help="what most ranks entered there (on a tie, the lowest rank's)"
                   + (" — a tie" if h["expected_is_a_tie"] else ""))
    cols[2].metric("Stuck ranks", _ranks(h["stuck_ranks"] or []),
                   help="the ranks held responsible: those that never entered it or entered another collective; "
                        "where the recorders show none, those that raised")
    cols[3].metric("Ranks with a dump", f"{h['dumps']} of {h['world_size']}")
    if view.hung:
        st.markdown(md("Never entered it: {} · entered another collective: {} · waiting: {} · completed: {} · "
                       "no record: {} · no dump: {} · raised: {}", _ranks(h["missing_ranks"] or []),
                       _ranks(h["mismatched_ranks"] or []), _ranks(h["waiting_ranks"] or []),
                       _ranks(h["completed_ranks"] or []), _ranks(h["unknown_ranks"] or []),
                       _ranks(h["ranks_without_dump"]), _ranks(h["raised_ranks"] or [])))
        others = h["other_groups"] or []
        if others:
            st.caption(md("Other process groups out of step: {}.", "; ".join(
                f"group {g['process_group']} at #{g['seq']}" for g in others)))
    st.subheader("Ranks")
    st.caption(view.about)
    shown = view.ranks.rename(columns=LABELS)
    st.dataframe(shown, formats={"since last step (s)": "{:,.1f}"}, highlight=shown["stuck"], pinned=("rank",),
                 width="stretch")
    st.subheader("Stacks")
    st.caption("Each rank's training thread when its dump was written (or the exception that ended it), innermost "
               "frame first, as text.")
    for s in view.stacks:
        with st.expander(s.label, expanded=s.stuck):
            if s.text:
                st.code(s.text, language=None)
            else:
                st.caption("No stack in this rank's dump.")
