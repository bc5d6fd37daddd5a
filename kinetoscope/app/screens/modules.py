"""Modules: the nn.Module hierarchy of the window, with host and device time per module (analyze.ops.module_tree)."""

from kinetoscope.analyze.views.ops import module_tree
from kinetoscope.app import state
from kinetoscope.app.ui import md, st
from kinetoscope.render.format import display_table

#: indentation per level of the hierarchy (an em space keeps the grid from trimming it)
INDENT = "\u2003"


def render() -> None:
    analysis, entry, _ = state.page("Modules")
    tree = module_tree(analysis.trace.rank(entry["rank"]))
    if tree.empty:
        st.info("The trace records no nn.Module calls: capture with with_stack=True (PyTorch 2 then records each "
                "module's forward call).")
        return
    st.caption(md("{:,} modules in the window, in call order, each under the module that called it. Host: the time "
                  "of its forward calls (self: less the modules it calls); device: the GPU time of the kernels, "
                  "copies and memsets launched inside them (through correlation ids). The backward pass runs outside "
                  "any module. Times in ms.", len(tree)))
    shown = tree.assign(module=[INDENT * d + m for d, m in zip(tree["depth"], tree["module"], strict=False)])
    table, units = display_table(shown[["module", "calls", "host_ms", "host_self_ms", "device_ms", "path"]])
    st.dataframe(table, formats=units, pinned=("module",), width="stretch", height=min(640, 38 + 35 * len(table)),
                 column_config={"module": st.column_config.Column(width="large")})
