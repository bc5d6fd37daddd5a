"""Operators and kernels: the host ops and GPU kernels of the window by name, with the GPU time each op launched,
every row reachable; host ops grouped by input shapes, by module or by call stack on request (analyze.ops)."""

import altair as alt

from kinetoscope.analyze.ingest.loader import read_bytes
from kinetoscope.analyze.model.results import EfficiencyResult
from kinetoscope.analyze.views.efficiency import efficiency_view
from kinetoscope.analyze.views.ops import (
    kernel_table,
    op_call_stacks,
    op_call_stacks_from_args,
    op_device_time,
    op_modules,
    op_shapes,
    op_table,
)
from kinetoscope.app import state
from kinetoscope.app.data import app_limits, job_file
from kinetoscope.app.ui import md, st
from kinetoscope.errors import KinetoscopeError
from kinetoscope.render.format import display_table

#: the table's height: about 15 rows in view, the rest reached by scrolling (every row is there)
TABLE_PX = 560
GROUPS = ("name", "input shapes", "module", "call stack")


def _table(frame, formats=None, pinned=("name",)) -> None:
    shown, units = display_table(frame)
    st.dataframe(shown, formats={**units, **(formats or {})}, pinned=pinned, width="stretch",
                 height=min(TABLE_PX, 38 + 35 * len(shown)))


def render() -> None:
    analysis, entry, _ = state.page("Operators and kernels")
    rank = entry["rank"]
    trace = analysis.trace.rank(rank)
    st.subheader("Host operators")
    group = st.radio("Group by", GROUPS, horizontal=True, key=f"op_group_{rank}",
                     help="input shapes and (older traces') call stacks are read from the trace file again")
    if group == "name":
        ops = op_table(trace)
        if ops.empty:
            st.caption("No operators (cpu_op events) in the window.")
        else:
            ops = ops.merge(op_device_time(trace), on="name", how="left")
            st.caption(md("{:,} operators in the window, every one below (scroll), by self time (their own time, less "
                          "the operators they call). Device: the GPU time of the kernels, copies and memsets they "
                          "launched (through correlation ids), by themselves (self) and with the operators they call "
                          "(total). Phase: where most of their time fell. Times in ms.", len(ops)))
            _table(ops.rename(columns={"device_self_ms": "device_self_ms", "device_total_ms": "device_total_ms"}))
    elif group == "input shapes":
        _shapes(analysis, rank, trace)
    elif group == "module":
        mods = op_modules(trace)
        if mods.empty:
            st.caption("The trace records no nn.Module calls (capture with with_stack=True; PyTorch 2 records "
                       "modules then).")
        else:
            st.caption(md("{:,} (module, operator) pairs: each operator charged to the innermost module it ran in "
                          "('(outside any module)': the backward pass, the optimizer), by total time (ms).", len(mods)))
            _table(mods, pinned=("module",))
    else:
        _stacks(analysis, rank, trace)
    kernels = kernel_table(trace)
    st.subheader("GPU kernels")
    if kernels.empty:
        st.caption("No GPU kernels in the window.")
    else:
        st.caption(md("{:,} kernels in the window, every one below, by total time (ms). Tensor Cores: yes where the "
                      "kernel's name says so, blank where it does not say.", len(kernels)))
        _table(kernels.assign(tensor_cores=kernels["tensor_cores"].map({True: "yes"})).rename(
            columns={"share_of_kernel_time": "kernel_time_fraction", "tensor_cores": "Tensor Cores"}))
    _efficiency(state.rank_result(analysis, entry, EfficiencyResult))


def _efficiency(result: EfficiencyResult | None) -> None:
    """Matrix and memory work against the device's peak: MFU, operators, kernels and the roofline."""
    view = efficiency_view(result.efficiency if result is not None else None)
    st.subheader("Against the device's peak")
    if view is None or (view.operators.empty and view.note is None):
        st.caption("No counted operators (matrix or memory-bound) in the window.")
        return
    st.caption(md("{} · peak {} · MFU {} · FLOPs per step {}", view.device or "no device named",
                  view.peak or "not known", state.pct(view.mfu) if view.mfu is not None else "n/a",
                  f"{view.flops_per_step:,.0f}" if view.flops_per_step is not None else "n/a"))
    if view.note:
        st.caption(md("{}", view.note))
    if view.operators.empty:
        return
    st.caption(md("{:,} counted operators, the most time lost below peak first: achieved TFLOP/s (matrix ops: "
                  "FLOPs from the recorded shapes, as torch's FlopCounterMode counts them) and GB/s (bytes: the "
                  "inputs read and the output written once) over the GPU time of the kernels each launched.",
                  len(view.operators)))
    _table(view.operators)
    if not view.kernels.empty:
        st.caption(md("{:,} kernels of counted operators (a kernel's rate is its operator's).", len(view.kernels)))
        _table(view.kernels)
    if view.points.empty:
        return
    layers = [alt.Chart(view.points).mark_circle(size=70).encode(
        x=alt.X("intensity:Q", scale=alt.Scale(type="log"), title="arithmetic intensity (FLOP/byte)"),
        y=alt.Y("tflops:Q", scale=alt.Scale(type="log"), title="achieved TFLOP/s"),
        color=alt.Color("kind:N", title=None), tooltip=["operator", "intensity", "tflops"])]
    if not view.roof.empty:
        layers.insert(0, alt.Chart(view.roof).mark_line(color="#888").encode(x="intensity:Q", y="tflops:Q"))
    st.altair_chart(alt.layer(*layers).properties(height=320), width="stretch",
                    description=f"Roofline of {len(view.points)} operators: achieved TFLOP/s against FLOPs per byte, "
                                "under the device's roof (peak and bandwidth).")


def _file(analysis, rank: int):
    name = dict(analysis.rank_files).get(rank)
    return name, (job_file(st.session_state.get(state.JOB), name) if name else None)


def _shapes(analysis, rank: int, trace) -> None:
    """Operators by input shapes: read from the trace file again (the loader does not keep shapes)."""
    name, path = _file(analysis, rank)
    if path is None:
        st.caption("The trace file is no longer on the server: upload it again to group by shapes.")
        return
    try:
        table = op_shapes(read_bytes(path, app_limits()), trace)
    except KinetoscopeError as exc:
        st.error(md("{}: {}", name, getattr(exc, "reason", exc)))
        return
    if table.empty or (table["input_shapes"] == "").all():
        st.caption("The trace records no input shapes (capture with record_shapes=True).")
        return
    st.caption(md("{:,} (operator, input shapes) pairs, by total time (ms).", len(table)))
    _table(table.rename(columns={"input_shapes": "input shapes"}))


def _stacks(analysis, rank: int, trace) -> None:
    """Operators by call stack: Python frames recorded as events (with_stack=True), else the Call stack argument
    older traces wrote on each op (read from the file again)."""
    table = op_call_stacks(trace)
    if table.empty:
        name, path = _file(analysis, rank)
        if path is not None:
            try:
                table = op_call_stacks_from_args(read_bytes(path, app_limits()), trace)
            except KinetoscopeError as exc:
                st.error(md("{}: {}", name, getattr(exc, "reason", exc)))
                return
    if table.empty:
        st.caption("The trace records no call stacks (capture with with_stack=True).")
        return
    st.caption(md("{:,} (operator, call stack) pairs, by total time (ms); a stack reads from the innermost frame "
                  "out.", len(table)))
    _table(table.rename(columns={"call_stack": "call stack"}))
