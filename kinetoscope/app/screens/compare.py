"""Compare: this trace against another — what got faster or slower, which findings changed."""

import streamlit as st

from kinetoscope.analyze.compare import compare_reports, finding_changes
from kinetoscope.app import data, state
from kinetoscope.app.cache import analyse


def render() -> None:
    analysis = state.current()
    st.header("Compare")
    choices = data.sample_choices()
    labels = [c.label for c in choices if c.label != analysis.label]
    if not labels:
        st.info("No other trace to compare with.")
        st.stop()
    other_label = st.selectbox("Compare the current trace (after) with (before)", labels, key="compare_with")
    other = next(c for c in choices if c.label == other_label)
    before = analyse(data.content_key(other.job.files), other.label, other.job)
    if before is None:
        st.stop()
    table = compare_reports(before.report, analysis.report)
    st.dataframe(table.style.format({"change": lambda v: "" if v is None else f"{v:+.1%}"}, na_rep="n/a"),
                 hide_index=True, use_container_width=True)
    st.subheader("Findings")
    st.dataframe(finding_changes(before.report, analysis.report), hide_index=True, use_container_width=True)
