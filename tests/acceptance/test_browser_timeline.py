"""Item 3 of issue 29 in Chromium: the Timeline never draws more than the trace holds, and zooming reads the range
again at its own resolution (was: scroll-zoom stretched the blocks merged for the whole window, so a GPU 63% idle
read as solid busy). Also: hovering a kernel names the call that launched it."""

from __future__ import annotations

import pytest
from browserlib import go, serve_app, settled
from tracebuilder import TraceBuilder

pytestmark = [pytest.mark.browser, pytest.mark.app]

KERNEL, STEP, RUNTIME = "#4c78a8", "#c7c7c7", "#b279a2"


def idle_gpu(folder):
    """One 10 ms step; a 3.7 us kernel every 10 us on one stream (no launches: few enough marks for an SVG chart):
    the GPU is busy 37% of the window, idle 63%."""
    b = TraceBuilder().step(0, 0, 10_000)
    for i in range(1000):
        b.kernel(i * 10.0, 3.7)
    return b.write(folder / "idle_gpu.json")


def launched(folder):
    """Two steps; in each, a launch at +100 us of a 300 us kernel at +200 us."""
    b = TraceBuilder()
    for s in range(2):
        b.step(s, s * 1000, 1000).kernel(s * 1000 + 200, 300, launch_at=s * 1000 + 100, launch_dur=10)
    return b.write(folder / "launched.json")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("timeline")
    yield from serve_app(str(idle_gpu(folder)), str(launched(folder)))


#: the share of the plot's width the kernels cover, as drawn: each mark's width times its opacity, over the steps
#: row's mark (which spans the whole range)
_INK = """([kernel, step]) => {
  const paths = [...document.querySelectorAll('[data-testid=stVegaLiteChart] svg .mark-rect path')];
  const opacity = (p) => parseFloat(p.getAttribute('fill-opacity') ?? p.getAttribute('opacity') ?? '1');
  const width = (p) => p.getBBox().width;
  const kernels = paths.filter(p => (p.getAttribute('fill') || '').toLowerCase() === kernel);
  const steps = paths.filter(p => (p.getAttribute('fill') || '').toLowerCase() === step);
  const plot = steps.reduce((a, p) => a + width(p), 0);
  return {marks: kernels.length, ink: kernels.reduce((a, p) => a + width(p) * opacity(p), 0) / plot};
}"""
_CAPTION = "[data-testid=stCaptionContainer]"
#: the range caption ("a–b ms from the window start: ..."), not the critical path's above it
_RANGE = "ms from the window start"
_RANGE_JS = (f"Array.from(document.querySelectorAll('{_CAPTION}')).find(e => e.innerText.includes('{_RANGE}'))"
             ".innerText")


def _whole_window(page, url):
    page.goto(f"{url}/timeline")
    page.get_by_text("Whole window").first.wait_for(timeout=120_000)
    settled(page)
    page.locator("[data-testid=stRadioOption]").filter(has_text="Whole window").click()
    page.get_by_text("0.000–10.000 ms from the window start").first.wait_for(timeout=60_000)
    settled(page)
    page.locator(f"[data-testid=stVegaLiteChart] svg .mark-rect path[fill='{KERNEL}']").first.wait_for(timeout=60_000)


def test_a_gpu_63_percent_idle_is_drawn_37_percent_busy_and_zoom_reads_the_range_again(app, page):
    _whole_window(page, app)
    whole = page.evaluate(_INK, [KERNEL, STEP])
    assert whole["marks"] > 100 and whole["ink"] == pytest.approx(0.37, abs=0.03), whole
    # drag across 40%-45% of the chart: the range is read again (a new caption), each kernel drawn alone
    chart = page.locator("[data-testid=stVegaLiteChart]").first
    box = chart.bounding_box()
    y = box["y"] + box["height"] * 0.5
    page.mouse.move(box["x"] + box["width"] * 0.40, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.45, y, steps=5)
    page.mouse.up()
    page.wait_for_function(f"() => !{_RANGE_JS}.includes('0.000–10.000')", timeout=60_000)
    settled(page)
    caption = page.locator(_CAPTION, has_text=_RANGE).first.inner_text()
    assert "merged" not in caption
    kernels = int(caption.split("(")[1].split(" kernels")[0])
    assert f"({kernels} kernels, {kernels} drawn one by one)" in caption and 20 <= kernels <= 120
    zoomed = page.evaluate(_INK, [KERNEL, STEP])
    assert zoomed["marks"] == kernels and zoomed["ink"] == pytest.approx(0.37, abs=0.05), zoomed
    # Zoom out: back to the whole window
    page.get_by_role("button", name="Zoom out").click()
    page.get_by_text("0.000–10.000 ms from the window start").first.wait_for(timeout=60_000)


def test_hovering_a_kernel_names_the_call_that_launched_it(app, page):
    page.goto(app)
    settled(page)
    page.locator("[data-testid=stSelectbox]").filter(has_text="Trace").first.click()
    page.get_by_role("option", name="launched.json").first.click()
    page.get_by_text("launched.json ·").first.wait_for(timeout=60_000)
    go(page, "Timeline")
    kernel = page.locator(f"[data-testid=stVegaLiteChart] svg .mark-rect path[fill='{KERNEL}']")
    kernel.first.wait_for(timeout=60_000)
    settled(page)
    box = kernel.first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, steps=2)
    tooltip = page.locator("#vg-tooltip-element")
    tooltip.wait_for(state="visible", timeout=10_000)
    assert "launched by cudaLaunchKernel at 0.100 ms on thread 100" in tooltip.inner_text()
