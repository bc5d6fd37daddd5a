"""Operators and kernels: the host ops and GPU kernels of the window by name (computed in analyze.ops)."""

from typing import Any, Callable

import pandas as pd
import streamlit as st

from kinetoscope.analyze.ops import kernel_table, op_table
from kinetoscope.app import state

TOP = 50


def _ms(v: float) -> str:
    return f"{v:,.3f}"


def _table(title: str, frame: pd.DataFrame, none: str, about: str, formats: dict[str, Callable[[Any], str]]) -> None:
    st.subheader(title)
    if frame.empty:
        st.caption(none)
        return
    st.caption(f"{len(frame):,} in the window, the first {min(TOP, len(frame))} shown. {about}")
    st.dataframe(frame.head(TOP).style.format(formats, na_rep=""), hide_index=True, use_container_width=True)


def render() -> None:
    analysis, entry, _ = state.page("Operators and kernels")
    trace = analysis.trace.rank(entry["rank"])
    _table("Host operators", op_table(trace), "No operators (cpu_op events) in the window.",
           "By self time (their own time, less the operators they call); phase: where most of their time fell. "
           "Times in ms; input shapes are not kept by the loader.",
           {"total_ms": _ms, "self_ms": _ms, "mean_ms": _ms})
    kernels = kernel_table(trace)
    _table("GPU kernels", kernels.assign(tensor_cores=kernels["tensor_cores"].map({True: "yes"})),
           "No GPU kernels in the window.",
           "By total time (ms). Tensor Cores: yes where the kernel's name says so, blank where it does not say.",
           {"total_ms": _ms, "mean_ms": _ms, "max_ms": _ms, "share_of_kernel_time": lambda v: f"{v:.1%}"})
