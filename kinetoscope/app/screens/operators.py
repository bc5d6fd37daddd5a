"""Operators and kernels: the host ops and GPU kernels of the window by name (computed in analyze.ops)."""

import streamlit as st

from kinetoscope.analyze.ops import kernel_table, op_table
from kinetoscope.app import state

TOP = 50


def render() -> None:
    analysis, entry, _ = state.page("Operators and kernels")
    trace = analysis.trace.rank(entry["rank"])
    ms = lambda v: f"{v:,.3f}"  # noqa: E731
    st.subheader("Host operators")
    ops = op_table(trace)
    if ops.empty:
        st.caption("No operators (cpu_op events) in the window.")
    else:
        st.caption(f"{len(ops):,} operators in the window, the {min(TOP, len(ops))} with the most self time "
                   "(their own time, less the operators they call); phase: where most of their time fell. "
                   "Times in ms; input shapes are not kept by the loader.")
        st.dataframe(ops.head(TOP).style.format({"total_ms": ms, "self_ms": ms, "mean_ms": ms}),
                     hide_index=True, use_container_width=True)
    st.subheader("GPU kernels")
    kernels = kernel_table(trace)
    if kernels.empty:
        st.caption("No GPU kernels in the window.")
    else:
        st.caption(f"{len(kernels):,} kernels in the window, the {min(TOP, len(kernels))} with the most time. "
                   "Tensor Cores: yes where the kernel's name says so, blank where it does not say.")
        shown = kernels.head(TOP).assign(tensor_cores=kernels["tensor_cores"].head(TOP).map({True: "yes"}))
        st.dataframe(shown.style.format({"total_ms": ms, "mean_ms": ms, "max_ms": ms,
                                         "share_of_kernel_time": lambda v: f"{v:.1%}"}, na_rep=""),
                     hide_index=True, use_container_width=True)
