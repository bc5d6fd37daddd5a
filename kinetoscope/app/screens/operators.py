"""Operators and kernels: the host ops and GPU kernels of the window by name (computed in analyze.ops)."""

import pandas as pd
from kinetoscope.app.ui import md, st

from kinetoscope.analyze.loader import read_bytes
from kinetoscope.analyze.ops import kernel_table, op_shapes, op_table
from kinetoscope.app import state
from kinetoscope.render.format import display_table
from kinetoscope.app.data import app_limits, job_file
from kinetoscope.errors import KinetoscopeError

TOP = 50


def _table(title: str, frame: pd.DataFrame, none: str, about: str) -> None:
    st.subheader(title)
    if frame.empty:
        st.caption(none)
        return
    st.caption(f"{len(frame):,} in the window, the first {min(TOP, len(frame))} shown. {about}")
    shown, units = display_table(frame.head(TOP).rename(columns={"share_of_kernel_time": "kernel_time_fraction",
                                                                  "tensor_cores": "Tensor Cores"}))
    st.dataframe(shown, formats=units, width="stretch")


def render() -> None:
    analysis, entry, _ = state.page("Operators and kernels")
    trace = analysis.trace.rank(entry["rank"])
    _table("Host operators", op_table(trace), "No operators (cpu_op events) in the window.",
           "By self time (their own time, less the operators they call); phase: where most of their time fell. "
           "Times in ms.")
    _shapes(analysis, entry["rank"], trace)
    kernels = kernel_table(trace)
    _table("GPU kernels", kernels.assign(tensor_cores=kernels["tensor_cores"].map({True: "yes"})),
           "No GPU kernels in the window.",
           "By total time (ms). Tensor Cores: yes where the kernel's name says so, blank where it does not say.")


def _shapes(analysis, rank: int, trace) -> None:
    """Operators by input shapes: read from the trace file again when asked (the loader does not keep shapes)."""
    name = dict(analysis.rank_files).get(rank)
    path = job_file(st.session_state.get(state.JOB), name) if name else None
    if path is None or not st.toggle("Group by input shapes", key=f"op_shapes_{rank}",
                                     help="reads the trace file again for the shapes record_shapes=True wrote"):
        return
    try:
        table = op_shapes(read_bytes(path, app_limits()), trace)
    except KinetoscopeError as exc:
        st.error(f"{name}: {getattr(exc, 'reason', exc)}")
        return
    if table.empty or (table["input_shapes"] == "").all():
        st.caption("The trace records no input shapes (capture with record_shapes=True).")
        return
    st.caption(f"{len(table):,} (operator, input shapes) pairs, by total time; the first {min(TOP, len(table))} shown.")
    shown, units = display_table(table.head(TOP).rename(columns={"input_shapes": "input shapes"}))
    st.dataframe(shown, formats=units, width="stretch")
